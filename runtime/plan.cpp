#include "runtime/plan.h"

#include <spdlog/spdlog.h>

#include <algorithm>
#include <iterator>
#include <limits>
#include <string>
#include <vector>

#include "compiler/checked_int.h"
#include "compiler/errors.h"
#include "compiler/kernel_kind.h"
#include "templates/templates.h"

namespace lfce::runtime {
namespace {

int64_t align256(int64_t bytes) { return round_up(bytes, 256, "workspace bytes"); }

template <typename E>
E checked_enum(int32_t value, int32_t count, const char* field, const char* accepted) {
  if (value < 0 || value >= count)
    throw SpecError(std::string("lfce_problem.") + field + " = " + std::to_string(value) +
                    " is not valid; expected " + accepted);
  return static_cast<E>(value);
}

}  // namespace

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

TileConfig Tuning::tile(KernelKind kind, DType dtype) const {
  auto it = tiles.find(kind);
  return it == tiles.end() ? default_tile(kind, dtype) : it->second;
}

std::string problem_text(const Problem& p) {
  return std::to_string(p.tokens) + "," + std::to_string(p.hidden) + "," + std::to_string(p.vocab) + "," +
         std::string(dtype_name(p.dtype)) + "," + (p.targets == IndexType::I64 ? "i64" : "i32") + "," +
         (p.bias ? "bias" : "nobias") + "," + std::string(reduction_name(p.reduction)) + "," +
         std::string(mode_name(p.mode)) + "," + std::to_string(p.ignore_index) + "," + std::to_string(p.chunk_size) +
         "," + std::to_string(p.workspace_budget) + ",softcap=" + float_text(p.softcap) +
         ",temperature=" + float_text(p.temperature) + ",z_loss_scale=" + float_text(p.z_loss_scale) +
         ",label_smoothing=" + float_text(p.label_smoothing) + ",class_weight=" + (p.class_weight ? "1" : "0") +
         ",accumulate=" + (p.accumulate_grad_weight ? "w" : "") + (p.accumulate_grad_bias ? "b" : "") +
         ",token_scaling=" + (p.token_scaling ? "1" : "0") + ",outputs=" + (p.entropy ? "e" : "") +
         (p.logprob ? "l" : "") + (p.predicted ? "p" : "") + ",lse_grad=" + (p.lse_grad ? "1" : "0") +
         ",sequence_length=" + std::to_string(p.sequence_length);
}

int lse_rows(const Problem& p) { return 1 + p.token_scaling + p.entropy + p.logprob; }

Problem problem_from_c(const lfce_problem* c) {
  if (!c) throw SpecError("lfce_problem pointer is NULL");
  Problem p;
  p.tokens = c->tokens;
  p.hidden = c->hidden;
  p.vocab = c->vocab;
  p.dtype = checked_enum<DType>(c->dtype, 3, "dtype", "LFCE_DTYPE_BF16, _FP16 or _FP32");
  p.targets = checked_enum<IndexType>(c->target_dtype, 2, "target_dtype", "LFCE_INDEX_INT64 or _INT32");
  if (c->has_bias != 0 && c->has_bias != 1)
    throw SpecError("lfce_problem.has_bias must be 0 or 1, got " + std::to_string(c->has_bias));
  p.bias = c->has_bias == 1;
  p.reduction = checked_enum<Reduction>(c->reduction, 3, "reduction", "LFCE_REDUCTION_MEAN, _SUM or _NONE");
  p.mode = checked_enum<Mode>(c->mode, 2, "mode", "LFCE_MODE_RECOMPUTE or _EAGER");
  // NaN fails both comparisons. A positive value below FLT_MIN (subnormal) is refused too: the
  // kernels flush it to 0 or divide by it (a softcap's 1 / c is inf there, and its slope NaN).
  auto normal_or_zero = [](float value, float hi) {
    return value == 0.f || (value >= std::numeric_limits<float>::min() && value <= hi);
  };
  if (!normal_or_zero(c->softcap, KernelSpec::kMaxSoftcap))
    throw SpecError("lfce_problem.softcap must be 0 (none) or a positive cap in [" +
                    float_text(std::numeric_limits<float>::min()) + ", 1e6], got " + float_text(c->softcap));
  p.softcap = c->softcap;
  // 0 is a zero-initialised struct's temperature: none, as 1.
  const float t = c->temperature == 0.f ? 1.f : c->temperature;
  if (!(t >= KernelSpec::kMinTemperature && t <= KernelSpec::kMaxTemperature))
    throw SpecError("lfce_problem.temperature must be 0 or 1 (none) or a temperature in [1e-6, 1e6], got " +
                    float_text(c->temperature));
  p.temperature = t;
  if (!normal_or_zero(c->z_loss_scale, KernelSpec::kMaxZLossScale))
    throw SpecError("lfce_problem.z_loss_scale must be 0 (none) or a positive scale in [" +
                    float_text(std::numeric_limits<float>::min()) + ", 1e6], got " + float_text(c->z_loss_scale));
  p.z_loss_scale = c->z_loss_scale;
  if (!normal_or_zero(c->label_smoothing, 1.f))
    throw SpecError("lfce_problem.label_smoothing must be 0 (none) or in [" +
                    float_text(std::numeric_limits<float>::min()) + ", 1], got " + float_text(c->label_smoothing));
  p.label_smoothing = c->label_smoothing;
  if (c->has_class_weight != 0 && c->has_class_weight != 1)
    throw SpecError("lfce_problem.has_class_weight must be 0 or 1, got " + std::to_string(c->has_class_weight));
  p.class_weight = c->has_class_weight == 1;
  auto flag = [](int32_t value, const char* field) {
    if (value != 0 && value != 1)
      throw SpecError(std::string("lfce_problem.") + field + " must be 0 or 1, got " + std::to_string(value));
    return value == 1;
  };
  p.accumulate_grad_weight = flag(c->accumulate_grad_weight, "accumulate_grad_weight");
  p.accumulate_grad_bias = flag(c->accumulate_grad_bias, "accumulate_grad_bias");
  p.token_scaling = flag(c->token_scaling, "token_scaling");
  if (c->outputs < 0 || c->outputs > (LFCE_OUTPUT_ENTROPY | LFCE_OUTPUT_LOGPROB | LFCE_OUTPUT_PREDICTED))
    throw SpecError("lfce_problem.outputs = " + std::to_string(c->outputs) +
                    " is not valid; expected a sum of LFCE_OUTPUT_ENTROPY (1), LFCE_OUTPUT_LOGPROB (2) and "
                    "LFCE_OUTPUT_PREDICTED (4)");
  p.entropy = (c->outputs & LFCE_OUTPUT_ENTROPY) != 0;
  p.logprob = (c->outputs & LFCE_OUTPUT_LOGPROB) != 0;
  p.predicted = (c->outputs & LFCE_OUTPUT_PREDICTED) != 0;
  p.ignore_index = c->ignore_index;
  p.chunk_size = c->chunk_size;
  if (c->workspace_budget < 0)
    throw SpecError("lfce_problem.workspace_budget must be >= 1 byte (or 0 for 256 MiB), got " +
                    std::to_string(c->workspace_budget));
  // (Eager mode's 0 means one token chunk for the three-GEMM schedule; Plan reads it as 256 MiB
  // for the vocabulary chunk of the recompute backward.)
  p.workspace_budget = c->workspace_budget || p.mode == Mode::Eager ? c->workspace_budget : kDefaultWorkspaceBudget;
  p.sequence_length = c->sequence_length;
  check_problem(p);
  return p;
}

void check_problem(const Problem& p) {
  auto bounded = [](int64_t value, const char* field, int64_t limit, const char* limit_text) {
    if (value < 1)
      throw SpecError(std::string("lfce_problem.") + field + " must be >= 1, got " + std::to_string(value));
    if (value > limit)
      throw SpecError(std::string("lfce_problem.") + field + " = " + std::to_string(value) + " exceeds " +
                      std::to_string(limit) + " (" + limit_text + "), the largest lfce accepts");
  };
  bounded(p.tokens, "tokens", kMaxTokens, "2^31 - 1");
  bounded(p.hidden, "hidden", kMaxHidden, "2^20");
  bounded(p.vocab, "vocab", kMaxVocab, "2^31 - 1");
  if (p.chunk_size < 0)
    throw SpecError("lfce_problem.chunk_size must be >= 1 (or 0 for automatic), got " + std::to_string(p.chunk_size));
  if (p.chunk_size > kMaxChunk)
    throw SpecError("lfce_problem.chunk_size = " + std::to_string(p.chunk_size) + " exceeds " +
                    std::to_string(kMaxChunk) + " (2^20), the largest lfce accepts");
  if (p.workspace_budget < 0)
    throw SpecError("lfce_problem.workspace_budget must be >= 0, got " + std::to_string(p.workspace_budget));
  if (p.sequence_length < 0 || p.sequence_length > p.tokens || (p.sequence_length > 0 && p.tokens % p.sequence_length))
    throw SpecError("lfce_problem.sequence_length = " + std::to_string(p.sequence_length) +
                    " must be 0 (no shift) or a length T >= 1 of which tokens = " + std::to_string(p.tokens) +
                    " is a multiple (sequences of T tokens)");
  // fp16 dz is scaled to |g·scale| < 2^15 (template_util.h, dz_scale); the temperature multiplies
  // dz by up to 1 / T, so T <= 0.5 could reach fp16's largest finite value, 65504.
  if (p.dtype == DType::FP16 && p.temperature <= 0.5f)
    throw SpecError("lfce_problem.temperature = " + float_text(p.temperature) +
                    " with fp16: dz (up to 1 / T times its bound) could overflow fp16; use T > 0.5, bf16 or fp32");
  // Eager mode computes the gradients in the forward, scaled later by the upstream gradient:
  // nothing can be added to a buffer before that scale is known.
  for (auto [on, field] : {std::pair{p.accumulate_grad_weight, "accumulate_grad_weight"},
                           std::pair{p.accumulate_grad_bias, "accumulate_grad_bias"}})
    if (on && p.mode == Mode::Eager)
      throw SpecError(std::string("lfce_problem.") + field +
                      " = 1 needs mode LFCE_MODE_RECOMPUTE (eager mode computes the gradients before the upstream "
                      "gradient is known)");
  if (p.accumulate_grad_bias && !p.bias)
    throw SpecError("lfce_problem.accumulate_grad_bias = 1 needs has_bias = 1 (there is no bias gradient)");
  // fp16 dz is scaled to |g·scale| < 2^15 assuming |p − onehot| <= 1; the z-loss multiplies p by
  // 1 + 2·s·LSE, which the data bound, not the problem (LSE ≈ 40 at s = 0.05 overflows to inf).
  if (p.dtype == DType::FP16 && p.z_loss_scale != 0.f)
    throw SpecError("lfce_problem.z_loss_scale = " + float_text(p.z_loss_scale) +
                    " with fp16 is not supported: dz's fp16 scaling assumes |p - onehot| <= 1, and the z-loss "
                    "multiplies p by 1 + 2 * z_loss_scale * LSE, unbounded (dz could overflow fp16 to inf); use bf16 "
                    "or fp32, or z_loss_scale = 0");
  // The entropy and logprob outputs are there to be differentiated (lfce_backward_args.grad_lse),
  // which has no fp16 path: refused here, before any of the problem's kernels is compiled.
  if (p.dtype == DType::FP16 && (p.entropy || p.logprob))
    throw SpecError(std::string("lfce_problem.outputs asks for the ") + (p.entropy ? "entropy" : "logprob") +
                    " with fp16, whose gradient (lfce_backward_args.grad_lse) has no fp16 path; use bf16 or fp32, or "
                    "drop LFCE_OUTPUT_ENTROPY and LFCE_OUTPUT_LOGPROB from outputs");
  // fp16 dz is scaled by the unweighted g; a class weight w_y multiplies it, unbounded.
  if (p.dtype == DType::FP16 && p.class_weight)
    throw SpecError("lfce_problem.has_class_weight = 1 with fp16 is not supported: dz's fp16 scaling assumes "
                    "unweighted tokens (a class weight could overflow fp16); use bf16 or fp32");
}

Plan::Plan(const Problem& problem, Arch arch, const Tuning& tuning, const DeviceLimits& limits)
    : p_(problem), arch_(arch), tuning_(tuning), limits_(limits) {
  check_problem(p_);
  if (limits_.smem_per_block > 0) {
    // A limit below what every tile of some kernel needs is the caller's mistake (a typo, bytes
    // meant as KiB), not a tile lfce failed to choose.
    int64_t need = 0;
    KernelKind neediest = KernelKind::LseForward;
    for (const KernelKindInfo& info : kKernelKinds) {
      if (!info.gemm || (info.bias_only && !p_.bias)) continue;
      const int64_t bytes = min_smem_per_block(problem_spec(info.kind, p_, arch_));
      if (bytes > need) need = bytes, neediest = info.kind;
    }
    if (limits_.smem_per_block < need)
      throw SpecError("shared memory per block = " + std::to_string(limits_.smem_per_block) +
                      " bytes (lfce_device_limits.smem_per_block, --smem-per-block or LFCE_DEVICE_SMEM_LIMIT) is below "
                      "the " + std::to_string(need) + " bytes the smallest tile of " + std::string(kind_name(neediest)) +
                      " needs for this problem: give the GPU's opt-in limit per block in bytes (cuDeviceGetAttribute "
                      "CU_DEVICE_ATTRIBUTE_MAX_SHARED_MEMORY_PER_BLOCK_OPTIN, e.g. 101376 for a 99 KiB GPU), at least " +
                      std::to_string(need) + ", or 0 for the arch's reference GPU");
  }
  for (const auto& [kind, tile] : tuning_.tiles) tile.check_range();  // tiles divide below
  // A winner tuned on a GPU with more shared memory (a tuning file carried over) cannot run here.
  for (auto it = tuning_.tiles.begin(); it != tuning_.tiles.end();) {
    KernelSpec s = problem_spec(it->first, p_, arch_);
    s.tile = it->second;
    if (limits_.smem_per_block > 0 && kernel_smem_bytes(s) > limits_.smem_per_block) {
      spdlog::warn("tuned tile of {} needs {} bytes of shared memory, over this device's {}: using the default",
                   kind_name(it->first), kernel_smem_bytes(s), limits_.smem_per_block);
      it = tuning_.tiles.erase(it);
    } else if (it->second.wgmma() && hidden_row_align(p_.hidden, p_.dtype) < 16) {
      spdlog::warn("tuned tile {} of {} loads with TMA, which rows of H = {} cannot take: using the default",
                   it->second.text(), kind_name(it->first), p_.hidden);
      it = tuning_.tiles.erase(it);
    } else {
      ++it;
    }
  }
  const TileConfig fwd = tile(KernelKind::LseForward);
  // At least kMinSplits vocabulary shares, so that when N is large the row groups reading x at
  // once (ctas / splits of them) stay few enough for their rows of x to live in L2.
  constexpr int64_t kMinSplits = 8;
  auto splits_for = [&](int64_t ctas, int64_t bm, int64_t bn) {
    return std::clamp<int64_t>(std::max(ceil_div(ctas, ceil_div(p_.tokens, bm)), kMinSplits), 1,
                               std::min<int64_t>(ceil_div(p_.vocab, bn), 65535));
  };
  const int64_t ctas = std::min(tuning_.forward_ctas > 0 ? tuning_.forward_ctas : device_ctas(fwd), kMaxForwardCtas);
  splits_ = splits_for(ctas, fwd.bm, fwd.bn);
  row_groups_ = std::clamp<int64_t>(ctas / splits_, 1, ceil_div(p_.tokens, fwd.bm));
  max_splits_ = std::max(splits_for(kMaxForwardCtas, 256, 64), kMinSplits);  // bounds every tuning's tiles
  ld_ = round_up(p_.tokens, 8, "dz token stride");
  // The budget's chunk, with N rounded up to a power of two so that nearby token counts
  // share one chunk width (and so one set of compiled kernels); at most kMaxChunk.
  const int64_t per_row = checked_mul(next_pow2(ld_, "dz token stride"), dtype_bytes(p_.dtype), "dz bytes per vocabulary row");
  const int64_t granule = 128;
  const int64_t budget = p_.workspace_budget > 0 ? p_.workspace_budget : kDefaultWorkspaceBudget;
  const int64_t budget_rows = std::max<int64_t>(budget / per_row / granule * granule, granule);
  budget_chunk_ = std::min({budget_rows, p_.vocab, kMaxChunk});
  if (p_.chunk_size > 0) {
    chunk_ = std::min(p_.chunk_size, p_.vocab);
    budget_chunk_ = chunk_;
  } else if (tuning_.chunk > 0 && budget_chunk_ < p_.vocab) {
    // A tuning never exceeds the budget, and only re-splits a vocabulary that takes several
    // chunks anyway: the workspace (sized without the tuning) then has the accumulator.
    chunk_ = std::min(tuning_.chunk, budget_chunk_);
  } else {
    chunk_ = budget_chunk_;
  }
  if (p_.mode == Mode::Eager) plan_three_gemm();
}

void Plan::plan_three_gemm() {
  // Tokens per chunk: chunk_size, else what workspace_budget gives the chunk's [V, ld] exponentials,
  // else all of them; whole sequences with a causal shift (targets are read in place), otherwise
  // multiples of 64 rows.
  const int64_t granule = p_.sequence_length > 0 ? p_.sequence_length : 64;
  int64_t rows = p_.tokens;
  if (p_.chunk_size > 0)
    rows = p_.chunk_size;
  else if (p_.workspace_budget > 0)
    rows = p_.workspace_budget / checked_mul(p_.vocab, dtype_bytes(p_.dtype), "eager workspace bytes per token");
  token_chunk_ = rows >= p_.tokens ? p_.tokens : std::min(std::max(rows / granule, int64_t{1}) * granule, p_.tokens);
  // The options whose dz needs more than the stored exponentials (a softcap's slope, label
  // smoothing's Σ u_v), the extra per-token statistics eager_logits does not keep, the lse
  // rows' gradients, and a vocabulary wider than one kernel's chunk take the fallback. The lse
  // rows after the first (token scales) are laid out [rows, N]: with several chunks too.
  three_gemm_ = p_.softcap == 0.f && p_.label_smoothing == 0.f && !p_.entropy && !p_.predicted && !p_.lse_grad &&
                p_.vocab <= kMaxChunk && (lse_rows(p_) == 1 || token_chunk_ == p_.tokens);
  // The smallest chunk (one sequence with the shift, else 64 rows) may need more than the budget
  // bounds (the chunk's [V, ld] exponentials): the workspace size reports what it needs, but a
  // caller who sized by the budget should hear.
  if (three_gemm_ && p_.chunk_size == 0 && p_.workspace_budget > 0) {
    const int64_t needed = checked_mul(checked_mul(p_.vocab, round_up(token_chunk_, 8, "eager token stride"),
                                                   "eager dz elements"),
                                       dtype_bytes(p_.dtype), "eager dz bytes");
    if (needed > p_.workspace_budget)
      spdlog::warn("eager mode: a token chunk of {} tokens{} needs {} bytes of workspace, over workspace_budget = {} "
                   "bytes: allocate what lfce_forward_backward_workspace_size reports (at least {} bytes), or raise "
                   "workspace_budget to at least that{}",
                   token_chunk_, p_.sequence_length > 0 ? " (one whole sequence, with the causal shift)" : "", needed,
                   p_.workspace_budget, needed, p_.sequence_length > 0 ? " (or use shorter sequences)" : "");
  }
}

int64_t Plan::eager_tiles() const { return ceil_div(p_.vocab, int64_t{tile(KernelKind::EagerLogits).bn}); }

bool Plan::eager_operand() const {
  if (!tuning_.eager_operand || !three_gemm_ || arch_ != Arch::SM90A || p_.dtype == DType::FP32 || p_.bias)
    return false;
  const int tile_n = tile(KernelKind::EagerLogits).bn;
  const TileConfig gw = tile(KernelKind::GradWeight), gx = tile(KernelKind::GradInput);
  // (Not split along N: KernelSpec::validate rejects it, a split consumer's fragments spill.)
  auto transformable = [](const TileConfig& t) { return t.wgmma() && t.cluster == 1 && t.bk == 64 && !t.split_n; };
  return transformable(gw) && transformable(gx) && tile_n % 64 == 0 && tile_n % gw.bm == 0;
}

bool Plan::eager_fixup() const {
  if (!tuning_.eager_fixup || !three_gemm_ || arch_ != Arch::SM90A || p_.dtype == DType::FP32 || eager_operand())
    return false;
  const int tile_n = tile(KernelKind::EagerLogits).bn;
  const TileConfig gw = tile(KernelKind::GradWeight);
  if (!gw.wgmma() || tile_n % gw.bm != 0) return false;
  // Measured (H200, power-settled A/B in alternating processes, docs/measurements.md#eager-fixup):
  // eager / cuBLAS at N = 8192 gemma2-2b 1.118 -> 1.088 and 1.169 -> 1.132, llama3-8b 1.07 -> 1.06
  // and 1.092 -> 1.076, llama3-70b 1.067 -> 1.060; at llama3-8b N = 16384 0.8% slower than
  // eager_dz's pass (2.8% before the fix-up streamed its rows past L2).
  // So chunks of up to 8192 tokens, until that is understood.
  constexpr int64_t kMaxFixupTokens = 8192;
  if (token_chunk_ > kMaxFixupTokens) return false;
  const int64_t ld = round_up(token_chunk_, 8, "eager token stride");
  return ceil_div(p_.vocab, int64_t{gw.bm}) * ceil_div(ld, int64_t{256}) < (int64_t{1} << 31);
}

KernelSpec Plan::eager_dz_pass_spec() const {
  KernelSpec s = spec(KernelKind::EagerDz);
  s.eager_operand = false;
  return s.normalised();
}

// Normalised: problems that differ only in fields a kernel does not read share its spec, and
// so its compile, cache entry and tuning.
TileConfig Plan::tile(KernelKind kind) const {
  if (kind == KernelKind::EagerLogits) {
    // dlogits_backward's tile, tuned or not (the same GEMM, tokens x vocabulary over K = H), but
    // never split along N (a row's statistics need all its columns in one consumer) and, with a
    // bias on sm_90a, one the staged wgmma form takes (no ping-pong or clusters): lse_forward's
    // default, with the same shared memory per row.
    TileConfig t = tile(KernelKind::DlogitsBackward);
    const auto tuned = tuning_.tiles.find(KernelKind::DlogitsBackward);
    const bool from_tuning = tuned != tuning_.tiles.end() && tuned->second == t && !t.split_n;
    const int64_t limit = limits_.smem_per_block;
    if (t.split_n) t = default_tile(KernelKind::DlogitsBackward, p_.dtype, arch_, limit, p_.hidden, 0.f, false);
    if (t.wgmma() && p_.bias && (t.pingpong || t.cluster > 1))
      t = default_tile(KernelKind::LseForward, p_.dtype, arch_, limit, p_.hidden, 0.f, false);
    // Untuned (or a tuned split tile, replaced above), from H = kEagerLogitsCooperativeHidden on,
    // two cooperative consumers on one 128 x 256 tile instead of ping-pong's 64 x 256 pair: half
    // the W bytes per FLOP read from L2, which under eager's power cap is clock
    // (docs/measurements.md#eager-energy), though ping-pong hides each tile's epilogue.
    // Power-settled A/B, eager / cuBLAS's three GEMMs, ping-pong -> cooperative, twice each (H200,
    // docs/measurements.md#eager-tiles): llama3-70b 1.048/1.047 -> 1.030/1.031, qwen2.5-7b
    // 1.070/1.070 -> 1.048/1.051, llama3-8b 1.048/1.054 -> 1.039/1.043 (N = 16384: 1.049/1.049
    // -> 1.040/1.040), gemma2-2b 1.128/1.124 -> 1.094/1.095; 0.0-1.7 J a step less, the clock
    // 18-70 MHz higher at the same 690-700 W. (With a bias the tile is already lse_forward's
    // 128 x 256, at every H.)
    const TileConfig cooperative{128, 256, 64, 1, 1, 4, 2};
    if (t.wgmma() && t.pingpong && !from_tuning && p_.hidden >= kEagerLogitsCooperativeHidden &&
        fits(KernelKind::EagerLogits, cooperative))
      t = cooperative;
    return t;
  }
  // dlogits_backward epilogues with more per-element work than their registers allow beside 128
  // accumulators a thread (64 x 256 per consumer) take 64 x 128 per consumer, tuned or not
  // (tunings leave the options out): a bias with class-weighted label smoothing (two loads per
  // column; ptxas 13.0 spilled 16 bytes), the lse rows' gradients (the driver's JIT spilled 24-32
  // bytes; H200, driver 580) and softcap with z-loss (8 bytes there; softcap alone, softcap with
  // temperature and temperature with z-loss did not: test_gpu_spills.py). Those driver spills
  // were measured while the link path still ignored setmaxnreg (168 registers a thread, not 232:
  // docs/measurements.md#compiled-whole, docs/cache.md): to be measured again.
  // lse_forward with an entropy or argmax output keeps that statistic per row beside the running
  // max and sum: with 128 accumulators a thread (its 128 x 256 default) ptxas 13.0 spilled 104-160
  // bytes with entropy and predicted together and with predicted and softcap (2026-12-01); its
  // staged form (a bias, or class-weighted smoothing) spilled 48 bytes under the driver's JIT at
  // V = 5000, H = 512 (H200, driver 580; commit 49625a4). Those forwards take 64 x 128 per
  // consumer (docs/measurements.md#forward-tile), the default until setmaxnreg was honoured.
  const bool staged_forward = p_.bias || (p_.class_weight && p_.label_smoothing != 0.f);
  const bool heavy_epilogue =
      (kind == KernelKind::DlogitsBackward &&
       ((p_.bias && p_.class_weight && p_.label_smoothing != 0.f) || p_.lse_grad ||
        (p_.softcap != 0.f && p_.z_loss_scale != 0.f))) ||
      (kind == KernelKind::LseForward && (p_.entropy || p_.predicted || staged_forward));
  auto it = tuning_.tiles.find(kind);
  if (it != tuning_.tiles.end() && !(heavy_epilogue && it->second.wgmma() && it->second.accumulators() > 64))
    return it->second;
  // (Counting the shared memory each of the problem's options adds per row.)
  TileConfig t = default_tile(problem_spec(kind, p_, arch_), limits_.smem_per_block);
  if (heavy_epilogue && t.wgmma() && t.accumulators() > 64 && fits(kind, TileConfig{128, 128, 64, 1, 1, 4, 2}))
    return TileConfig{128, 128, 64, 1, 1, 4, 2};
  if (three_gemm_ && t.wgmma() && !tuning_.eager_operand &&
      (kind == KernelKind::GradInput || kind == KernelKind::GradWeight)) {
    // Eager's gradient GEMMs take CTA pairs, two consumers sharing 128-row tiles, 128 x 256 or
    // 128 x 192: whichever leaves fewer idle slots with the pair along N (its odd column block
    // past H counts as idle), 128 x 192 discounted as in the rule below. 128 x 256 then pairs
    // along M instead, sharing the B tile (x in grad_weight, W in grad_input), each CTA loading
    // half and multicasting it: a CTA reads 7.8 KB from L2 per MFLOP, cuBLAS's figure for its
    // 192 x 192 pairs, against 9.8 with the pair along N sharing dz (the former default, which
    // halved the DRAM bytes but not the energy: docs/measurements.md#cta-pairs). Under the power
    // cap, where eager's steps take 5-13% more energy than cuBLAS's three GEMMs at the same 690 W,
    // energy is time: A/B in alternating processes (H200, docs/measurements.md#eager-tiles),
    // eager / cuBLAS, along N -> along M: llama3-70b 1.059 -> 1.053 and 1.062 -> 1.052,
    // qwen2.5-7b 1.088 -> 1.079, llama3-8b 1.069 -> 1.066 and at N = 16384 1.077 -> 1.061.
    // 128 x 192 (gemma2-2b's H = 2304) stays along N, sharing dz's tile: half of an MN-major B's
    // 192 columns is not whole 64-column boxes (and 128 x 256 along M ran 1.139-1.140 there
    // against 1.129-1.133). (Not with the operand transform, which needs unclustered tiles.)
    const int64_t rows = kind == KernelKind::GradInput ? token_chunk_ : p_.vocab;  // grad_weight: [V, H] at once
    auto pair = [](int bn) {
      TileConfig c{128, bn, 64, 1, 1, 4, 2, 2};
      c.cluster_n = true;
      return c;
    };
    auto busy = [&](const TileConfig& c) {
      const int64_t tiles = ceil_div(rows, c.bm) * (ceil_div(ceil_div(p_.hidden, c.bn), int64_t{2}) * 2);
      const int64_t slots = std::max(device_ctas(c) / 2 * 2, int64_t{2});
      return static_cast<double>(rows) * static_cast<double>(p_.hidden) /
             (static_cast<double>(ceil_div(tiles, slots) * slots) * c.bm * c.bn);
    };
    const TileConfig wide = pair(256), narrow = pair(192);
    TileConfig pick = busy(narrow) * 0.977 > busy(wide) ? narrow : wide;
    pick.cluster_n = pick.bn % 128 != 0;
    // A pair needs two blocks along its direction: with one (H <= BN along N; M <= 128, a chunk
    // of at most 128 tokens or a vocabulary that small, along M) its second CTA would compute a
    // tile wholly past the output (grad_weight about 2x slower at H <= 192:
    // docs/measurements.md#eager-tiles).
    const int64_t along = pick.cluster_n ? ceil_div(p_.hidden, int64_t{pick.bn}) : ceil_div(rows, int64_t{pick.bm});
    if (along >= 2 && fits(kind, pick)) return pick;
  }
  if (three_gemm_ && t.wgmma() && t.pingpong && t.bm == 64 && t.bn == 256 && kind == KernelKind::GradInput) {
    // Eager's grad_input is one GEMM over K = V into [token chunk, H]: two consumers sharing a
    // 128-row tile read 1.7x fewer operand bytes per FLOP than ping-pong's 64-row tiles, and with
    // K that long ping-pong's overlapped epilogue saves little. Forced tiles, eager breakdown
    // (H200, N = 8192): llama3-8b 12.40 ms at 128 x 256 against 13.08 ping-pong, llama3-70b 25.75
    // at 128 x 256 and 25.94 at 128 x 192, gemma2-2b 13.59 at 128 x 192 against 14.67 ping-pong
    // (docs/measurements.md#eager-time-breakdown). Of the two, the one with the larger busy
    // fraction (partial tiles' padding and the last wave's empty CTAs count as idle), 128 x 192
    // discounted by the 2.3% per busy FLOP it lost at llama3-70b: 128 x 192 at gemma2-2b's
    // H = 2304 (97% busy against 87%), 128 x 256 at H = 4096 and 8192.
    // Not recompute mode's, one launch per vocabulary chunk adding into fp32 partial sums, where
    // ping-pong hides each tile's epilogue: there 64 x 256 ping-pong won gemma2-2b's sweep
    // (docs/measurements.md#backward-tiles), and 128 x 192 cost its backward 46.7 -> 49.5 ms
    // (H200, N = 8192, one interleaved run; commit 080f66a).
    const int64_t rows = token_chunk_;
    auto busy = [&](const TileConfig& c) {
      const int64_t tiles = ceil_div(rows, c.bm) * ceil_div(p_.hidden, c.bn), slots = device_ctas(c);
      return static_cast<double>(rows) * static_cast<double>(p_.hidden) /
             (static_cast<double>(ceil_div(tiles, slots) * slots) * c.bm * c.bn);
    };
    const TileConfig wide{128, 256, 64, 1, 1, 4, 2}, narrow{128, 192, 64, 1, 1, 4, 2};
    const TileConfig pick = busy(narrow) * 0.977 > busy(wide) ? narrow : wide;
    // (Not the 128 x 128 rule below either: these two are the ones measured in eager mode.)
    return fits(kind, pick) ? pick : t;
  }
  if (t.wgmma() && !t.pingpong && t.bn == 256 && (kind == KernelKind::GradInput || kind == KernelKind::GradWeight)) {
    // (Called once the chunk is known: the constructor asks only for lse_forward's tile.)
    // The output is [N or chunk, H]: when H / 256 column blocks leave the last wave of CTAs
    // mostly empty (gemma2-2b: H = 2304 gives 4.4 waves of 128 x 256 tiles on 132 SMs, 87% busy),
    // 128 x 128 tiles in four stages fill it better; they run about 5% slower per FLOP.
    const int64_t rows = kind == KernelKind::GradInput ? p_.tokens : std::min(p_.vocab, chunk_);
    auto busy = [&](int64_t bn) {
      const int64_t tiles = ceil_div(rows, t.bm) * ceil_div(p_.hidden, bn), ctas = device_ctas(t);
      return static_cast<double>(tiles) / static_cast<double>(ceil_div(tiles, ctas) * ctas);
    };
    const TileConfig narrow{128, 128, 64, 1, 1, 4, 2};
    if (busy(128) * 0.95 > busy(256) && fits(kind, narrow)) t = narrow;
  }
  return t;
}

KernelSpec problem_spec(KernelKind kind, const Problem& p, Arch arch) {
  KernelSpec s;
  s.kind = kind;
  s.vocab = p.vocab;
  s.hidden = p.hidden;
  s.mode = p.mode;
  s.dtype = p.dtype;
  s.targets = p.targets;
  s.reduction = p.reduction;
  s.bias = p.bias;
  s.arch = arch;
  // Each kernel gets only the options its code reads (KernelSpec::fields_read, which depends on
  // the options themselves: lse_forward reads the class weights only with label smoothing).
  s.label_smoothing = p.label_smoothing;
  s.class_weight = p.class_weight;
  s.z_loss_scale = p.z_loss_scale;  // (loss_reduce's reads depend on it; cleared below where unread)
  const uint32_t reads = s.fields_read();
  if (reads & kFieldSoftcap) s.softcap = p.softcap;
  if (reads & kFieldTemperature) s.temperature = p.temperature;
  if (!(reads & kFieldZLoss)) s.z_loss_scale = 0.f;
  s.token_scaling = p.token_scaling && (reads & kFieldTokenScaling);
  s.lse_grad = p.lse_grad && (reads & kFieldLseGrad);
  s.shift = p.sequence_length > 0 && (reads & kFieldShift);
  // (dlogits_backward reads the entropy and logprob flags only with lse_grad: after it.)
  const uint32_t output_reads = s.fields_read();
  s.entropy = p.entropy && (output_reads & kFieldEntropy);
  s.logprob = p.logprob && (output_reads & kFieldLogprob);
  s.argmax = p.predicted && (output_reads & kFieldArgmax);
  if (!(reads & kFieldLabelSmoothing)) s.label_smoothing = 0.f;
  if (!(reads & kFieldClassWeight)) s.class_weight = false;
  // One flag in the spec, each gradient kernel its own from the problem.
  s.accumulate = (kind == KernelKind::GradWeight && p.accumulate_grad_weight) ||
                 (kind == KernelKind::GradBias && p.accumulate_grad_bias);
  return s;
}

int64_t Plan::device_ctas(const TileConfig& tile) const {
  return (limits_.sm_count > 0 ? limits_.sm_count : kDefaultForwardCtas) * tile.ctas_per_sm();
}

bool Plan::fits(KernelKind kind, const TileConfig& tile) const {
  KernelSpec s = problem_spec(kind, p_, arch_);
  s.tile = tile;
  return kernel_smem_bytes(s) <=
         (limits_.smem_per_block > 0 ? limits_.smem_per_block : arch_info(arch_).smem_per_block_optin);
}

KernelSpec Plan::spec(KernelKind kind) const {
  KernelSpec s = problem_spec(kind, p_, arch_);
  s.chunk = kind_info(kind).chunked ? chunk_ : 0;
  s.tile = tile(kind);
  // The three-GEMM schedule over several token chunks adds each chunk's grad_weight and grad_bias
  // into fp32 sums.
  if (three_gemm_ && token_chunks() > 1 && (kind == KernelKind::GradWeight || kind == KernelKind::GradBias))
    s.accumulate = true;
  if ((kind == KernelKind::GradWeight || kind == KernelKind::GradInput || kind == KernelKind::EagerDz) && eager_operand())
    s.eager_operand = true;
  if (eager_fixup()) {
    if (kind == KernelKind::EagerDz) s.eager_operand = true;  // only the constants
    if (kind == KernelKind::GradWeight) s.eager_fixup = true;
  }
  return s.normalised();
}

Plan::ForwardLayout Plan::forward_layout() const {
  ForwardLayout l{};
  const int64_t partial = align256(checked_mul(sizeof(float) * max_splits_, p_.tokens, "forward partials bytes"));
  const int64_t target = align256(checked_mul(sizeof(float), p_.tokens, "forward target-logit bytes"));
  l.partial_max = 0;
  l.partial_sum = partial;
  l.target_logit = checked_mul(2, partial, "forward workspace bytes");
  l.bytes = checked_add(l.target_logit, target, "forward workspace bytes");
  // Label smoothing: the per-(split, row) partial Σ w_v·u_v.
  l.partial_logit_sum = l.bytes;
  if (p_.label_smoothing != 0.f) l.bytes = checked_add(l.partial_logit_sum, partial, "forward workspace bytes");
  l.partial_entropy = l.bytes;
  if (p_.entropy) l.bytes = checked_add(l.bytes, partial, "forward workspace bytes");
  l.partial_argmax = l.bytes;
  if (p_.predicted) l.bytes = checked_add(l.bytes, partial, "forward workspace bytes");
  return l;
}

Plan::EagerLayout Plan::eager_layout() const {
  EagerLayout l{};
  // (Without a gradient to compute, lfce_forward_backward runs the forward alone in it.)
  const size_t forward = forward_layout().bytes;
  if (!three_gemm_) {
    l.bytes = std::max(forward, backward_layout().bytes);
    return l;
  }
  const int64_t rows = token_chunk_, ld = round_up(rows, 8, "eager token stride");
  int64_t bytes = 0;
  auto take = [&](int64_t size, const char* what) {
    const size_t at = static_cast<size_t>(bytes);
    bytes = checked_add(bytes, align256(size), what);
    return at;
  };
  l.dz = take(checked_mul(checked_mul(p_.vocab, ld, "eager dz elements"), dtype_bytes(p_.dtype), "eager dz bytes"),
              "eager workspace bytes");
  // eager_logits' tiles are at least 64 columns wide, whatever the tuning; the partials of rows
  // tokens, coef (over partial_sum) of ld.
  const int64_t partial = checked_mul(checked_mul(ceil_div(p_.vocab, int64_t{64}), ld, "eager partials"),
                                      sizeof(float), "eager partial bytes");
  l.partial_max = take(partial, "eager workspace bytes");
  l.partial_sum = take(partial, "eager workspace bytes");
  l.target_logit = take(checked_mul(rows, sizeof(float), "eager target-logit bytes"), "eager workspace bytes");
  l.residual = take(p_.dtype == DType::FP32 ? 0 : checked_mul(rows, sizeof(float), "residual bytes"),
                    "eager workspace bytes");
  const bool sums = token_chunks() > 1 && p_.dtype != DType::FP32;
  l.grad_weight_acc = take(sums ? checked_mul(checked_mul(p_.vocab, p_.hidden, "grad_weight elements"), sizeof(float),
                                              "grad_weight accumulator bytes")
                                : 0,
                           "eager workspace bytes");
  l.grad_bias_acc = take(sums && p_.bias ? checked_mul(p_.vocab, sizeof(float), "grad_bias accumulator bytes") : 0,
                         "eager workspace bytes");
  l.target_col = take(checked_mul(ld, sizeof(int32_t), "eager target bytes"), "eager workspace bytes");
  l.target_dz = take(checked_mul(ld, dtype_bytes(p_.dtype), "eager target dz bytes"), "eager workspace bytes");
  l.bytes = std::max(static_cast<size_t>(bytes), forward);
  return l;
}

std::vector<KernelSpec> Plan::launched_specs() const {
  std::vector<KernelSpec> out;
  auto add = [&](KernelKind kind) { out.push_back(spec(kind)); };
  // Eager mode's autograd backward scales the gradients held since the forward (lfce_scale_gradient).
  if (!three_gemm_) {
    for (const KernelKindInfo& info : kKernelKinds)
      if (!info.eager && (p_.bias || !info.bias_only)) add(info.kind);
    if (p_.mode == Mode::Eager) add(KernelKind::GradScale);
    check_fit(out);
    return out;
  }
  add(KernelKind::TokenCount);
  add(KernelKind::EagerLogits);
  add(KernelKind::LseCombine);
  add(KernelKind::EagerDz);
  if (eager_fixup()) out.push_back(eager_dz_pass_spec());  // (runs where no grad_weight is asked for)
  add(KernelKind::GradWeight);  // (adding into fp32 sums with several token chunks: spec())
  if (p_.bias) add(KernelKind::GradBias);
  add(KernelKind::GradInput);
  add(KernelKind::LossReduce);
  if (token_chunks() > 1 && p_.dtype != DType::FP32) add(KernelKind::GradConvert);
  add(KernelKind::GradScale);
  check_fit(out);
  return out;
}

void Plan::check_fit(const std::vector<KernelSpec>& specs) const {
  // For a device's limits every tile fits by construction (defaults counted with the options,
  // tuned tiles over the limit dropped): a kernel that could not run there must never be cached.
  if (limits_.smem_per_block <= 0) return;
  for (const KernelSpec& s : specs)
    if (kernel_smem_bytes(s) > limits_.smem_per_block)
      throw InternalError("Plan chose a " + s.tile.text() + " tile for " + std::string(kind_name(s.kind)) +
                          ", which needs " + std::to_string(kernel_smem_bytes(s)) +
                          " bytes of shared memory per block, over the device's " +
                          std::to_string(limits_.smem_per_block));
}

Plan::BackwardLayout Plan::backward_layout() const {
  BackwardLayout l{};
  l.dz = 0;
  const int64_t dz_elements = checked_mul(budget_chunk_, ld_, "dz elements");
  l.grad_input_acc = align256(checked_mul(dz_elements, dtype_bytes(p_.dtype), "dz bytes"));
  int64_t bytes = l.grad_input_acc;
  if (needs_grad_input_accumulator()) {
    const int64_t acc = checked_mul(checked_mul(sizeof(float), p_.tokens, "grad_input accumulator bytes"), p_.hidden,
                                    "grad_input accumulator bytes");
    bytes = checked_add(bytes, align256(acc), "backward workspace bytes");
  }
  l.residual = bytes;
  if (p_.dtype != DType::FP32)
    bytes = checked_add(bytes, align256(checked_mul(sizeof(float), p_.tokens, "residual bytes")), "backward workspace bytes");
  l.bytes = bytes;
  return l;
}

}  // namespace lfce::runtime
