// Tuning: the launch choices a problem can be run with — the CTA tile of each GEMM kernel,
// the forward's CTA target and the backward's vocabulary chunk. Untuned choices come from the
// tile policy (runtime/tile_policy.h, Plan::tile); the autotuner (autotune/) finds and persists
// better ones.
#pragma once

#include <cstdint>
#include <map>
#include <string>

#include "compiler/kernel_spec.h"

namespace lfce::runtime {

struct Tuning {
  std::map<KernelKind, TileConfig> tiles;  // GEMM kinds without an entry take Plan::tile's default
  int64_t forward_ctas = 0;                // lse_forward CTAs to aim for; 0 = kDefaultForwardCtas
  int64_t chunk = 0;                       // backward vocabulary chunk; 0 = derived from the budget
  // Eager mode's gradient GEMMs may form dz as they load p̃ (Plan::eager_operand); off unless
  // LFCE_EXPERIMENTAL=eager_operand (runtime/options.h): exact, but slower on the H200 today.
  bool eager_operand = false;
  // Eager's grad_weight may rewrite p̃ into dz itself (Plan::eager_fixup); on unless
  // LFCE_EXPERIMENTAL=eager_dz_kernel.
  bool eager_fixup = true;

  bool operator==(const Tuning& o) const {
    return tiles == o.tiles && forward_ctas == o.forward_ctas && chunk == o.chunk && eager_operand == o.eager_operand &&
           eager_fixup == o.eager_fixup;
  }
};

// What a plan needs to know of the device it runs on; 0 = unknown (offline): the arch table's
// shared memory and kDefaultForwardCtas. The Session fills them from runtime::device_info().
struct DeviceLimits {
  int64_t smem_per_block = 0;
  int64_t sm_count = 0;
};

// CTAs the forward aims for by default: one per SM (two per SM measured slower on the H200);
// this when the SM count is unknown (offline). Workspace sizes never depend on it: tuned and
// per-device values stay within kMaxForwardCtas, which sizes the forward workspace.
constexpr int64_t kDefaultForwardCtas = 132;
constexpr int64_t kMaxForwardCtas = 1056;

}  // namespace lfce::runtime
