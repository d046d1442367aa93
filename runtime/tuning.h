// Tuning: the launch choices a problem can be run with — the CTA tile of each GEMM kernel,
// the forward's CTA target and the backward's vocabulary chunk. Defaults come from
// default_tile(); the autotuner (autotune/) finds and persists better ones.
#pragma once

#include <cstdint>
#include <map>
#include <string>

#include "compiler/kernel_spec.h"

namespace lfce::runtime {

struct Problem;

struct Tuning {
  std::map<KernelKind, TileConfig> tiles;  // GEMM kinds without an entry use default_tile()
  int64_t forward_ctas = 0;                // lse_forward CTAs to aim for; 0 = kDefaultForwardCtas
  int64_t chunk = 0;                       // backward vocabulary chunk; 0 = derived from the budget
  // Eager mode's gradient GEMMs may form dz as they load p̃ (Plan::eager_operand); off unless
  // LFCE_EAGER_OPERAND=1 (runtime/options.h): exact, but slower on the H200 today.
  bool eager_operand = false;
  // Eager's grad_weight may rewrite p̃ into dz itself (Plan::eager_fixup); on unless
  // LFCE_EAGER_FIXUP=0.
  bool eager_fixup = true;

  TileConfig tile(KernelKind kind, DType dtype) const;
  bool operator==(const Tuning& o) const {
    return tiles == o.tiles && forward_ctas == o.forward_ctas && chunk == o.chunk && eager_operand == o.eager_operand &&
           eager_fixup == o.eager_fixup;
  }
};

// What each GEMM kernel runs with when nothing is tuned. The 16-bit mma.sync tiles are the
// winners of a default-space sweep for llama3-8b (N = 8192) on an H200 (2026-11-30): 1.20x
// over 128x128x64 for all, except lse_forward, whose winner (64x256, 1x4 warps) spills since the
// kernel loops over row blocks: 128x128x64, 2x4 warps. On sm_90a the 16-bit GEMMs default to the
// TMA + wgmma pipeline with two consumer warpgroups (BM = 128): BN = 256 (dlogits 4 stages, the
// gradient GEMMs 3: the winners of `lfce tune --space wgmma` for llama3-8b, N = 8192, on an H200,
// 2026-11-30), lse_forward BN = 128 (its BN = 256 winner, 12% faster there, spills for some V
// and H; a tuning picks it where it does not).
TileConfig default_tile(KernelKind kind, DType dtype, Arch arch);
// The mma.sync (sm_80) defaults.
TileConfig default_tile(KernelKind kind, DType dtype);
// The same on a device that allows `smem_limit` bytes of shared memory per block: the H200's
// default where it fits, else the first of smaller fallbacks that does (99 KiB GPUs: RTX 30/40/50,
// A10, L4, L40S). Throws InternalError if none fits (a limit below any GEMM tile's needs).
// `hidden` (H, if known; 0 = a multiple of 16 bytes): on sm_90a, rows of H·elem bytes that are
// not a multiple of 16 take the mma.sync defaults, since TMA cannot load them (hidden_row_align).
// label_smoothing / class_weight: the problem's, which add shared memory per row to some kinds
// (kernel_smem_per_row), counted in the fit.
TileConfig default_tile(KernelKind kind, DType dtype, Arch arch, int64_t smem_limit, int64_t hidden = 0,
                        float label_smoothing = 0.f, bool class_weight = false);
// The same for `spec`'s kind, dtype, arch and H, counting everything its options add per row
// (kernel_smem_per_row: the entropy, the argmax, the lse rows' gradients too); its tile is ignored.
TileConfig default_tile(KernelSpec spec, int64_t smem_limit);
// The shared memory per block the smallest tile default_tile falls back to needs for `spec`'s
// kind and options (a kernel that is not a GEMM: its fixed need): below it, no tile fits.
int64_t min_smem_per_block(KernelSpec spec);

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
