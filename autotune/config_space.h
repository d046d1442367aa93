// The configurations the autotuner may try for each GEMM kernel of a problem, and the pruning
// that rejects, before anything is compiled, those the target arch cannot run.
//
// A Candidate (runtime/tuning_files.h) is one kind's choice: its CTA tile, plus the forward's
// CTA target or the backward's vocabulary chunk.
#pragma once

#include <cstdint>
#include <optional>
#include <string>
#include <string_view>
#include <vector>

#include "compiler/kernel_spec.h"
#include "runtime/plan.h"
#include "runtime/tuning.h"
#include "runtime/tuning_files.h"

namespace lfce::autotune {

using runtime::Candidate;

// The GEMM kinds the autotuner tunes (kKernelKinds' GEMM rows), in the order it tunes them.
const std::vector<KernelKind>& tuned_kinds();
bool is_tuned_kind(KernelKind kind);


// What the runtime runs when nothing is tuned on a device of `limits`: the default tile that
// fits its shared memory (default_tile(kind, dtype, arch, limit)), one forward CTA per SM, and
// the workspace budget's chunk. Unknown limits (0): the arch table's, kDefaultForwardCtas.
runtime::Candidate default_candidate(KernelKind kind, const runtime::Problem& problem, Arch arch,
                            const runtime::DeviceLimits& limits = {});
// The candidate `tuning` selects for `kind` (unset fields read as their defaults on that device).
runtime::Candidate candidate_of(KernelKind kind, const runtime::Problem& problem, const runtime::Tuning& tuning, Arch arch,
                       const runtime::DeviceLimits& limits = {});

// Registers per thread a config needs, estimated as ptxas will allot them (its shared memory:
// kernel_smem_bytes() in templates/templates.h).
int estimated_registers(const TileConfig& tile, DType dtype);

// Why `candidate` cannot run for `problem` on `arch` within `limits` (which limit, the value, the
// limit), or nothing if it can: runtime::unrunnable(), then the estimated registers.
std::optional<std::string> rejection(const runtime::Candidate& candidate, const runtime::Problem& problem, Arch arch,
                                     const runtime::DeviceLimits& limits = {});  // 0s: the arch table's

struct Rejected {
  runtime::Candidate candidate;
  std::string reason;
};

struct ConfigSpace {
  std::vector<runtime::Candidate> kept;  // the default candidate first
  std::vector<Rejected> rejected;
};

// Named spaces: "default" (the full sweep) and "small" (3-4 configs per kind, for tests).
// Throws SpecError for another name.
ConfigSpace config_space(KernelKind kind, const runtime::Problem& problem, Arch arch,
                         std::string_view name = "default", const runtime::DeviceLimits& limits = {});

}  // namespace lfce::autotune
