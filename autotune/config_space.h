// The configurations the autotuner may try for each GEMM kernel of a problem, and the pruning
// that rejects, before anything is compiled, those the target arch cannot run.
//
// A Candidate is one kind's choice: its CTA tile, plus the forward's CTA target (lse_forward)
// or the backward's vocabulary chunk (dlogits_backward: the chunk is shared by the three
// backward GEMMs, so it is swept once, with the first of them, and fixed for the others).
#pragma once

#include <cstdint>
#include <optional>
#include <string>
#include <string_view>
#include <vector>

#include "compiler/kernel_spec.h"
#include "runtime/plan.h"
#include "runtime/tuning.h"

namespace lfce::autotune {

// The GEMM kinds the autotuner tunes (kKernelKinds' GEMM rows), in the order it tunes them.
const std::vector<KernelKind>& tuned_kinds();
bool is_tuned_kind(KernelKind kind);

struct Candidate {
  KernelKind kind = KernelKind::LseForward;
  TileConfig tile;
  int64_t forward_ctas = 0;  // lse_forward only, else 0
  int64_t chunk = 0;         // dlogits_backward only, else 0

  // Canonical text: "128x128x64/2x4/s3", then ";ctas=264" (lse_forward) or ";chunk=16384"
  // (dlogits_backward). The kind is not part of it: it is the key of the list it sits in.
  std::string text() const;
  // Throws SpecError naming the text when it does not read as a candidate of `kind`.
  static Candidate parse(KernelKind kind, std::string_view text);

  // `base` with this kind's choice set, the other kinds' choices left as they are.
  runtime::Tuning apply(runtime::Tuning base) const;

  auto tie() const { return std::tie(kind, tile, forward_ctas, chunk); }
  bool operator==(const Candidate& o) const { return tie() == o.tie(); }
  bool operator!=(const Candidate& o) const { return !(*this == o); }
  bool operator<(const Candidate& o) const { return tie() < o.tie(); }
};

// What the runtime runs when nothing is tuned: default_tile(), kDefaultForwardCtas, and the
// workspace budget's chunk.
Candidate default_candidate(KernelKind kind, const runtime::Problem& problem);
// The candidate `tuning` selects for `kind` (unset fields read as their defaults).
Candidate candidate_of(KernelKind kind, const runtime::Problem& problem, const runtime::Tuning& tuning);

// Registers per thread a config needs, estimated as ptxas will allot them (its shared memory:
// kernel_smem_bytes() in templates/templates.h).
int estimated_registers(const TileConfig& tile, DType dtype);

// Why `candidate` cannot run for `problem` on `arch` (which limit, the value, the limit), or
// nothing if it can: KernelSpec::validate(), threads, shared memory, registers.
std::optional<std::string> rejection(const Candidate& candidate, const runtime::Problem& problem, Arch arch,
                                     int64_t smem_limit = 0);  // 0: the arch table's

struct Rejected {
  Candidate candidate;
  std::string reason;
};

struct ConfigSpace {
  std::vector<Candidate> kept;  // the default candidate first
  std::vector<Rejected> rejected;
};

// Named spaces: "default" (the full sweep) and "small" (3-4 configs per kind, for tests).
// Throws SpecError for another name.
ConfigSpace config_space(KernelKind kind, const runtime::Problem& problem, Arch arch,
                         std::string_view name = "default", int64_t smem_limit = 0);

}  // namespace lfce::autotune
