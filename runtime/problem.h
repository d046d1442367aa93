// Problem: one fused linear + cross-entropy call's sizes and options, as the runtime takes them;
// its checks, its text key and the spec of each kernel as far as the problem decides it.
#pragma once

#include <cstdint>
#include <string>

#include "compiler/kernel_spec.h"

namespace lfce::runtime {

struct Problem {
  int64_t tokens = 0, hidden = 0, vocab = 0;
  DType dtype = DType::BF16;
  IndexType targets = IndexType::I64;
  bool bias = false;
  Reduction reduction = Reduction::Mean;
  Mode mode = Mode::Recompute;
  int64_t ignore_index = -100;
  int64_t chunk_size = 0;
  int64_t workspace_budget = 0;
  // The loss options, each declared by its line in runtime/problem_options.def (KernelSpec's options
  // of the same names); a problem shares the tuning of the same problem without them.
#define LFCE_PROBLEM_FLOAT(member, c_field, option, none, ...) float member = none;
#define LFCE_PROBLEM_FLAG(member, ...) bool member = false;
#include "runtime/problem_options.def"
  // The extra per-token outputs; and whether the backward adds the lse rows' gradients (set by a
  // backward call that passes them, never by the problem as its caller describes it).
  bool entropy = false, logprob = false, predicted = false;
  bool lse_grad = false;
  // Causal shift: sequences of this many tokens, each position scored against the next one's
  // target; 0 = none.
  int64_t sequence_length = 0;
};

// The rows of lse (lfce.h): the LSEs, then the token scales, entropies and logprobs where asked for.
int lse_rows(const Problem& problem);

// The most tokens a problem may have: grid x = ceil(N / BM) stays within CUDA's 2^31 - 1 CTAs.
// V, H and the chunk are bounded by kMaxVocab, kMaxHidden and kMaxChunk (compiler/kernel_spec.h).
constexpr int64_t kMaxTokens = (int64_t{1} << 31) - 1;

constexpr int64_t kDefaultWorkspaceBudget = 256ll << 20;

// The spec of `kind` for `problem` on `arch` as far as the problem decides it: no chunk, the
// default tile, not normalised (Plan::spec completes it; tuning keys normalise it).
KernelSpec problem_spec(KernelKind kind, const Problem& problem, Arch arch);

// Every field of `problem`, as text: the key under which the api layer caches a problem's plan
// and tuning (a field missing here would hand one problem another's kernels).
std::string problem_text(const Problem& problem);

// The names check_problem's messages give the problem's fields and the values they mention: the
// Problem's own by default; a caller that takes the problem through an interface of its own
// passes that interface's names (api::problem_from_c, the C struct's), so that each message names
// what that caller's user set.
struct ProblemNames {
  std::string field_prefix;   // before each field's name
  std::string bias = "bias";  // the bias flag
  std::string class_weight = "class_weight";
  std::string recompute_mode = "recompute";  // the mode that takes gradient accumulation
  std::string outputs = "outputs";           // the field that asks for the entropy and logprob outputs
  std::string drop_outputs = "the entropy and logprob outputs";  // how to ask for neither
  std::string lse_gradient = "lse_grad";                         // the backward through the lse rows
};

// Throws SpecError naming the first size of `problem` outside its range (N, H, V, chunk,
// workspace budget; any H >= 1 is accepted) or the first option its dtype or mode cannot take,
// in `names`. api::problem_from_c() (the C struct's conversion) and Plan run it.
void check_problem(const Problem& problem, const ProblemNames& names = {});

}  // namespace lfce::runtime
