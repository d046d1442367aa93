// Tile policy: the CTA tile each GEMM kernel runs with when nothing is tuned (default_tile and its
// fallbacks for smaller shared memory), and the rules by which a plan departs from it (Plan::tile,
// in tile_policy.cpp). The measurements behind each rule are in docs/measurements.md, cited by
// section.
#pragma once

#include <cstdint>

#include "compiler/kernel_spec.h"

namespace lfce::runtime {

// What each GEMM kernel runs with when nothing is tuned, per dtype and arch. fp32: 128 x 128 x 32
// mma.sync everywhere. sm_90a, 16-bit (TMA + wgmma, two consumer warpgroups): lse_forward 128 x 256
// in four stages (docs/measurements.md#forward-tile); dlogits_backward (and eager_logits, the same
// GEMM) 64 x 256 ping-pong in five stages, grad_input 64 x 256 ping-pong in four, grad_weight
// 128 x 256 in four (docs/measurements.md#backward-tiles). Otherwise (sm_80, sm_86, or rows TMA
// cannot load) the 16-bit mma.sync tiles: lse_forward 128 x 128 x 64 on 2 x 4 warps, the
// tokens x vocabulary and grad_input GEMMs 256 x 128, grad_weight 128 x 256.
TileConfig default_tile(KernelKind kind, DType dtype, Arch arch);
// The mma.sync (sm_80) defaults.
TileConfig default_tile(KernelKind kind, DType dtype);
// The same on a device that allows `smem_limit` bytes of shared memory per block: the arch's
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

// The share of a persistent launch's CTA slots that compute output: `useful` work out of what the
// whole waves of `tiles` tiles of `per_tile` work each, `slots` CTAs a wave, could compute. A
// partial tile's padding and the last wave's idle CTAs count as idle. (Work in output elements,
// or in tiles with per_tile = 1.)
double wave_efficiency(double useful, int64_t tiles, double per_tile, int64_t slots);

// Per busy FLOP, a 128 x 192 wgmma tile runs this fraction of a 128 x 256 tile's speed: the 2.3%
// it lost at llama3-70b (docs/measurements.md#eager-time-breakdown, 25.94 against 25.75 ms). The
// rules that weigh the two (eager's CTA pairs and grad_input) take 128 x 192 only when its wave
// efficiency times this still wins.
constexpr double kTile192Discount = 0.977;
// Per busy FLOP, a 128 x 128 wgmma tile runs about 5% slower than 128 x 256: the last-wave rule of
// the recompute gradient GEMMs takes it only when its wave efficiency times this still wins.
constexpr double kTile128Discount = 0.95;

// Eager mode's eager_logits, untuned on sm_90a and without a bias, runs two cooperative consumers on
// a 128 x 256 tile from this hidden size on (Plan::tile), ping-pong's 64 x 256 below it
// (docs/measurements.md#eager-tiles: faster at every measured H, 2304 to 8192; below 2048 not
// measured, where ping-pong hides a larger share of the epilogue). (With a bias it runs
// lse_forward's 128 x 256 at every H.)
constexpr int64_t kEagerLogitsCooperativeHidden = 2048;

}  // namespace lfce::runtime
