#include "runtime/tile_policy.h"

#include <algorithm>
#include <optional>
#include <string>
#include <vector>

#include "compiler/checked_int.h"
#include "compiler/errors.h"
#include "compiler/kernel_kind.h"
#include "runtime/plan.h"
#include "templates/templates.h"

namespace lfce::runtime {

TileConfig default_tile(KernelKind kind, DType dtype, Arch arch) {
  if (dtype == DType::FP32) return TileConfig{128, 128, 32, 2, 4, 2};
  // sm_90a: TMA + wgmma, two consumer warpgroups: lse_forward 64 x 256 each in four 48 KiB
  // stages (with setmaxnreg honoured, the consumers' 232 registers hold 128 accumulators beside
  // the row statistics; gemma2-2b GEMM-only 0.939 of cuBLAS against 0.911 for 64 x 128:
  // docs/measurements.md#forward-tile), grad_weight 64 x 256 each in four 48 KiB stages
  // (Plan::tile narrows it when that fills the GPU's SMs more evenly), grad_input ping-pong, each
  // consumer its own 64 x 256 tiles, in four 40 KiB stages: the winners of `lfce tune --space
  // wgmma` for llama3-8b and gemma2-2b at N = 8192 on an H200 (ping-pong grad_input 3% and 6% off
  // the backward). dlogits_backward ping-pong too, in five 40 KiB stages: 4% faster than
  // 128 x 256 / s4 at gemma2-2b and 3% at llama3-8b once its epilogue worked on registers
  // (docs/measurements.md#backward-tiles).
  if (arch == Arch::SM90A && kind_info(kind).gemm)
    switch (kind) {
      case KernelKind::LseForward: return TileConfig{128, 256, 64, 1, 1, 4, 2};
      case KernelKind::DlogitsBackward:
      case KernelKind::EagerLogits: {  // the same GEMM (tokens x vocabulary over K = H)
        TileConfig t{64, 256, 64, 1, 1, 5, 2};
        t.pingpong = true;
        return t;
      }
      case KernelKind::GradInput: {
        TileConfig t{64, 256, 64, 1, 1, 4, 2};
        t.pingpong = true;
        return t;
      }
      default: return TileConfig{128, 256, 64, 1, 1, 4, 2};
    }
  switch (kind) {
    case KernelKind::LseForward: return TileConfig{128, 128, 64, 2, 4, 3};
    case KernelKind::DlogitsBackward:
    case KernelKind::EagerLogits: return TileConfig{256, 128, 64, 4, 2, 2};
    case KernelKind::GradWeight: return TileConfig{128, 256, 64, 2, 4, 2};
    case KernelKind::GradInput: return TileConfig{256, 128, 64, 4, 2, 2};
    default: return TileConfig{128, 128, 64, 2, 4, 3};  // not a GEMM: the tile is unused
  }
}

TileConfig default_tile(KernelKind kind, DType dtype) { return default_tile(kind, dtype, Arch::SM80); }

namespace {

// The fallbacks of default_tile, tried in order once the arch's default does not fit: on
// sm_90a the smaller wgmma tiles, then (on every arch, as for rows TMA cannot load) smaller
// mma.sync tiles, fastest first (the staged fp32 tile, BM x (BN + 1) floats, and the ring). The
// last is the smallest any GEMM kernel takes.
std::vector<TileConfig> fallback_tiles(DType dtype, bool wgmma) {
  std::vector<TileConfig> tiles;
  if (wgmma)
    tiles = {TileConfig{128, 256, 64, 1, 1, 3, 2}, TileConfig{128, 128, 64, 1, 1, 4, 2},
             TileConfig{128, 128, 64, 1, 1, 2, 2}};
  if (dtype == DType::FP32) {
    tiles.insert(tiles.end(), {TileConfig{64, 128, 32, 2, 4, 2}, TileConfig{64, 64, 32, 2, 2, 2}});
  } else {
    tiles.insert(tiles.end(), {TileConfig{128, 128, 64, 2, 4, 3}, TileConfig{128, 128, 64, 2, 4, 2},
                               TileConfig{64, 128, 64, 2, 2, 3}, TileConfig{64, 64, 64, 2, 2, 2}});
  }
  return tiles;
}

}  // namespace

TileConfig default_tile(KernelSpec spec, int64_t smem_limit) {
  if (smem_limit <= 0) smem_limit = arch_info(spec.arch).smem_per_block_optin;
  const KernelKind kind = spec.kind;
  const DType dtype = spec.dtype;
  // The path is chosen here, per kernel: on sm_90a the 16-bit GEMMs take the TMA + wgmma
  // pipeline, whose tensor maps need global row strides that are multiples of 16 bytes. Rows of
  // hidden and weight are H elements (no padded copy is made), so any other H takes the
  // mma.sync defaults, which run on sm_90a too and copy such rows in narrower pieces.
  const bool tma_rows = spec.hidden <= 0 || hidden_row_align(spec.hidden, dtype) == 16;
  spec.tile = default_tile(kind, dtype, tma_rows ? spec.arch : Arch::SM80);
  // The narrower copies' loop adds registers beside grad_input's 256x128 tile (128 fp32
  // accumulators a thread; ptxas spilled 36 bytes on sm_90a at odd H): its 128x256 transpose.
  if (!tma_rows && kind == KernelKind::GradInput && dtype != DType::FP32) spec.tile = TileConfig{128, 256, 64, 2, 4, 2};
  if (!kind_info(kind).gemm || kernel_smem_bytes(spec) <= smem_limit) return spec.tile;
  // (kernel_smem_bytes counts what the spec's options add per row: the smoothing's logit sum,
  // the entropy, the argmax, the lse rows' gradients.)
  for (const TileConfig& tile : fallback_tiles(dtype, spec.tile.wgmma())) {
    spec.tile = tile;
    if (kernel_smem_bytes(spec) <= smem_limit) return tile;
  }
  throw InternalError("no default tile of " + std::string(kind_name(kind)) + " fits " + std::to_string(smem_limit) +
                      " bytes of shared memory per block (Plan checks the limit against min_smem_per_block first)");
}

TileConfig default_tile(KernelKind kind, DType dtype, Arch arch, int64_t smem_limit, int64_t hidden,
                        float label_smoothing, bool class_weight) {
  KernelSpec spec;
  spec.kind = kind;
  spec.dtype = dtype;
  spec.arch = arch;
  spec.hidden = hidden;
  spec.label_smoothing = label_smoothing;
  spec.class_weight = class_weight;
  return default_tile(spec, smem_limit);
}

int64_t min_smem_per_block(KernelSpec spec) {
  if (!kind_info(spec.kind).gemm) return kernel_smem_bytes(spec);
  spec.tile = fallback_tiles(spec.dtype, false).back();
  return kernel_smem_bytes(spec);
}

double wave_efficiency(double useful, int64_t tiles, double per_tile, int64_t slots) {
  return useful / (static_cast<double>(ceil_div(tiles, slots) * slots) * per_tile);
}

namespace {

// Two consumers on one 128 x 256 tile, four stages: the cooperative wgmma tile the rules below
// move to from ping-pong's 64 x 256 pair.
constexpr TileConfig kCooperativeTile{128, 256, 64, 1, 1, 4, 2};
// 64 x 128 per consumer: for epilogues too heavy for 128 accumulators a thread.
constexpr TileConfig kLightTile{128, 128, 64, 1, 1, 4, 2};

// eager_logits: dlogits_backward's tile, tuned or not (the same GEMM, tokens x vocabulary over
// K = H), but never split along N (a row's statistics need all its columns in one consumer) and,
// with a bias on sm_90a, one the staged wgmma form takes (no ping-pong or clusters): lse_forward's
// default, with the same shared memory per row. Untuned, from H = kEagerLogitsCooperativeHidden on,
// the cooperative 128 x 256 tile instead of ping-pong's: half the W bytes per FLOP read from L2,
// which under eager's power cap is clock (docs/measurements.md#eager-energy, #eager-tiles).
TileConfig eager_logits_tile(const Plan& plan) {
  const Problem& p = plan.problem();
  TileConfig t = plan.tile(KernelKind::DlogitsBackward);
  const auto tuned = plan.tuning().tiles.find(KernelKind::DlogitsBackward);
  const bool from_tuning = tuned != plan.tuning().tiles.end() && tuned->second == t && !t.split_n;
  const int64_t limit = plan.limits().smem_per_block;
  if (t.split_n) t = default_tile(KernelKind::DlogitsBackward, p.dtype, plan.arch(), limit, p.hidden, 0.f, false);
  if (t.wgmma() && p.bias && (t.pingpong || t.cluster > 1))
    t = default_tile(KernelKind::LseForward, p.dtype, plan.arch(), limit, p.hidden, 0.f, false);
  if (t.wgmma() && t.pingpong && !from_tuning && p.hidden >= kEagerLogitsCooperativeHidden &&
      plan.fits(KernelKind::EagerLogits, kCooperativeTile))
    t = kCooperativeTile;
  return t;
}

// Epilogues with more per-element work than their registers allow beside 128 accumulators a
// thread, which take 64 x 128 per consumer, tuned or not (tunings leave the options out):
// dlogits_backward with a bias and class-weighted label smoothing (two loads per column), the lse
// rows' gradients, or a softcap with z-loss; lse_forward with the entropy or argmax output, or in
// its staged form (a bias, or class-weighted smoothing). Each spilled under ptxas or the driver's
// JIT at 128 accumulators (docs/measurements.md#forward-tile; the dlogits spills were measured
// while the link path ignored setmaxnreg, docs/measurements.md#compiled-whole: to be measured
// again).
bool heavy_epilogue(KernelKind kind, const Problem& p) {
  const bool staged_forward = p.bias || (p.class_weight && p.label_smoothing != 0.f);
  return (kind == KernelKind::DlogitsBackward &&
          ((p.bias && p.class_weight && p.label_smoothing != 0.f) || p.lse_grad ||
           (p.softcap != 0.f && p.z_loss_scale != 0.f))) ||
         (kind == KernelKind::LseForward && (p.entropy || p.predicted || staged_forward));
}

bool too_heavy(const TileConfig& t) { return t.wgmma() && t.accumulators() > 64; }

// Eager's gradient GEMMs (three-GEMM schedule, wgmma, no operand transform, which needs unclustered
// tiles): CTA pairs, two consumers sharing 128-row tiles, 128 x 256 or 128 x 192, whichever has the
// higher wave efficiency with the pair along N (an odd column block past H counts as idle),
// 128 x 192 discounted by kTile192Discount. 128 x 256 then pairs along M, sharing the B tile (x in
// grad_weight, W in grad_input); 128 x 192 stays along N, sharing dz's tile (half of an MN-major
// B's 192 columns is not whole 64-column boxes). docs/measurements.md#cta-pairs, #eager-tiles.
// A pair needs two blocks along its direction, else its second CTA computes a tile wholly past
// the output (docs/measurements.md#eager-tiles): none then.
std::optional<TileConfig> eager_gradient_pair(KernelKind kind, const Plan& plan, const TileConfig& t) {
  if (!plan.three_gemm() || !t.wgmma() || plan.tuning().eager_operand ||
      (kind != KernelKind::GradInput && kind != KernelKind::GradWeight))
    return std::nullopt;
  const Problem& p = plan.problem();
  const int64_t rows = kind == KernelKind::GradInput ? plan.token_chunk() : p.vocab;  // grad_weight: [V, H] at once
  auto pair = [](int bn) {
    TileConfig c{128, bn, 64, 1, 1, 4, 2, 2};
    c.cluster_n = true;
    return c;
  };
  auto efficiency = [&](const TileConfig& c) {
    const int64_t tiles = ceil_div(rows, c.bm) * (ceil_div(ceil_div(p.hidden, c.bn), int64_t{2}) * 2);
    const int64_t slots = std::max(plan.device_ctas(c) / 2 * 2, int64_t{2});
    return wave_efficiency(static_cast<double>(rows) * static_cast<double>(p.hidden), tiles,
                           static_cast<double>(c.bm) * c.bn, slots);
  };
  const TileConfig wide = pair(256), narrow = pair(192);
  TileConfig pick = efficiency(narrow) * kTile192Discount > efficiency(wide) ? narrow : wide;
  pick.cluster_n = pick.bn % 128 != 0;
  const int64_t along = pick.cluster_n ? ceil_div(p.hidden, int64_t{pick.bn}) : ceil_div(rows, int64_t{pick.bm});
  if (along >= 2 && plan.fits(kind, pick)) return pick;
  return std::nullopt;
}

// Eager's grad_input, one GEMM over K = V into [token chunk, H], where the default is 64 x 256
// ping-pong: two consumers sharing a 128-row tile read 1.7x fewer operand bytes per FLOP, and with
// K that long ping-pong's overlapped epilogue saves little (docs/measurements.md#eager-time-breakdown).
// 128 x 256 or 128 x 192, whichever has the higher wave efficiency, 128 x 192 discounted by
// kTile192Discount (128 x 192 at gemma2-2b's H = 2304, 128 x 256 at H = 4096 and 8192). Not
// recompute mode's, one launch per vocabulary chunk adding into fp32 partial sums, where ping-pong
// hides each tile's epilogue (docs/measurements.md#backward-tiles).
std::optional<TileConfig> eager_grad_input_tile(KernelKind kind, const Plan& plan, const TileConfig& t) {
  if (!plan.three_gemm() || !t.wgmma() || !t.pingpong || t.bm != 64 || t.bn != 256 || kind != KernelKind::GradInput)
    return std::nullopt;
  const Problem& p = plan.problem();
  const int64_t rows = plan.token_chunk();
  auto efficiency = [&](const TileConfig& c) {
    const int64_t tiles = ceil_div(rows, c.bm) * ceil_div(p.hidden, c.bn);
    return wave_efficiency(static_cast<double>(rows) * static_cast<double>(p.hidden), tiles,
                           static_cast<double>(c.bm) * c.bn, plan.device_ctas(c));
  };
  const TileConfig wide = kCooperativeTile, narrow{128, 192, 64, 1, 1, 4, 2};
  const TileConfig pick = efficiency(narrow) * kTile192Discount > efficiency(wide) ? narrow : wide;
  return plan.fits(kind, pick) ? pick : t;
}

// The recompute gradient GEMMs' cooperative 128 x 256 tiles over an [N or chunk, H] output: when
// H / 256 column blocks leave the last wave mostly empty (gemma2-2b: H = 2304 gives 4.4 waves on
// 132 SMs), 128 x 128 tiles fill it better, taken when their wave efficiency (in tiles) discounted
// by kTile128Discount still wins. (Called once the chunk is known: the constructor asks only for
// lse_forward's tile.)
TileConfig last_wave_tile(KernelKind kind, const Plan& plan, const TileConfig& t) {
  if (!t.wgmma() || t.pingpong || t.bn != 256 || (kind != KernelKind::GradInput && kind != KernelKind::GradWeight))
    return t;
  const Problem& p = plan.problem();
  const int64_t rows = kind == KernelKind::GradInput ? p.tokens : std::min(p.vocab, plan.chunk());
  auto efficiency = [&](int64_t bn) {
    const int64_t tiles = ceil_div(rows, t.bm) * ceil_div(p.hidden, bn);
    return wave_efficiency(static_cast<double>(tiles), tiles, 1.0, plan.device_ctas(t));
  };
  if (efficiency(128) * kTile128Discount > efficiency(256) && plan.fits(kind, kLightTile)) return kLightTile;
  return t;
}

}  // namespace

// Tuned, else the default that fits the device, then the rules above in order.
TileConfig Plan::tile(KernelKind kind) const {
  if (kind == KernelKind::EagerLogits) return eager_logits_tile(*this);
  const bool heavy = heavy_epilogue(kind, p_);
  const auto tuned = tuning_.tiles.find(kind);
  if (tuned != tuning_.tiles.end() && !(heavy && too_heavy(tuned->second))) return tuned->second;
  // (Counting the shared memory each of the problem's options adds per row.)
  const TileConfig t = default_tile(problem_spec(kind, p_, arch_), limits_.smem_per_block);
  if (heavy && too_heavy(t) && fits(kind, kLightTile)) return kLightTile;
  if (const auto pair = eager_gradient_pair(kind, *this, t)) return *pair;
  if (const auto cooperative = eager_grad_input_tile(kind, *this, t)) return *cooperative;
  return last_wave_tile(kind, *this, t);
}

}  // namespace lfce::runtime
