// What `lfce tune --verify` checks every candidate against: the problem's answer computed in
// fp64 on the host from the same input data, and the comparison of one output with it (the
// bounds of tests/python/checks.py: relative L2 plus an elementwise atol + rtol bound).
//
// The verification problem is the sweep's problem cut to its first kVerifyTokens tokens: the
// host reference costs about 4·N·V·H fp64 multiply-adds on all cores, once per sweep and only
// with --verify (4e10 took 20 s on two shared cores; llama3-8b at 300 tokens is 6e11). V, H, the dtype, the features and the vocabulary
// chunk stay the sweep's, so each candidate runs the same kernels it is timed with; 300 is no
// multiple of any tile height, so the row edge is checked too.
#pragma once

#include <cstddef>
#include <cstdint>
#include <string>
#include <string_view>
#include <vector>

#include "autotune/problem_data.h"
#include "runtime/plan.h"

namespace lfce::autotune {

constexpr int64_t kVerifyTokens = 300;

// `problem` with at most kVerifyTokens tokens, running vocabulary chunks of `chunk` columns.
runtime::Problem verify_problem(const runtime::Problem& problem, int64_t chunk);

// Outputs of one problem, computed in fp64 and stored rounded to fp32 (2^-24 relative error,
// far below every bound). The upstream gradient is 1 (per token for reduction none).
struct Reference {
  std::vector<float> lse, token_loss;  // [N]
  float valid_count = 0;               // targets != ignore_index
  std::vector<float> grad_hidden;      // [N, H]; empty unless backward
  std::vector<float> grad_weight;      // [V, H]; empty unless backward
  std::vector<float> grad_bias;        // [V]; empty unless backward and problem.bias
};

// From the first problem.tokens rows of `data` (made for a problem of at least that many
// tokens and the same V, H, dtype and features). backward = false: lse, loss and count only.
Reference host_reference(const runtime::Problem& problem, const ProblemData& data, bool backward);

struct Tolerance {
  double rel_l2;  // ||a - e|| / ||e|| (or 1.5x what rounding e to the output dtype costs, if more)
  double rtol;    // elementwise |a - e| <= atol + rtol * |e| ...
  double atol;    // ... with atol = this fraction of max |e| (at least the dtype's subnormal step)
};
// tests/python/checks.py's LOSS (lse and per-token loss) and GRAD (gradients) for a problem of `dtype`.
Tolerance loss_tolerance(DType dtype);
Tolerance gradient_tolerance(DType dtype);

struct Verdict {
  double score = 0;     // the worst error over its bound: <= 1 passes
  std::string failure;  // "" when it passes: else what, where, expected and actual
  bool ok() const { return failure.empty(); }
};

// `expected.size()` elements of `dtype` at `actual` (the output named `name`) against the
// reference. NaN or inf in the output fails.
Verdict compare_output(std::string_view name, const void* actual, DType dtype, const std::vector<float>& expected,
                       const Tolerance& tolerance);

}  // namespace lfce::autotune
