// Plan: the problem's checks against the device, the tuned tiles it keeps, the schedule (which
// kernels, with which specs) and the eager mode's choices. The tile rules are in tile_policy.cpp,
// the geometry and workspace layouts in plan_layout.cpp.
#include "runtime/plan.h"

#include <spdlog/spdlog.h>

#include <string>
#include <vector>

#include "compiler/checked_int.h"
#include "compiler/errors.h"
#include "compiler/kernel_kind.h"
#include "templates/templates.h"

namespace lfce::runtime {

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
      throw OutOfResources(
          "shared memory per block = " + std::to_string(limits_.smem_per_block) +
              " bytes (lfce_device_limits.smem_per_block, --smem-per-block or LFCE_DEVICE_SMEM_LIMIT) is below "
              "the " +
              std::to_string(need) + " bytes the smallest tile of " + std::string(kind_name(neediest)) +
              " needs for this problem: give the GPU's opt-in limit per block in bytes (cuDeviceGetAttribute "
              "CU_DEVICE_ATTRIBUTE_MAX_SHARED_MEMORY_PER_BLOCK_OPTIN, e.g. 101376 for a 99 KiB GPU), at least " +
              std::to_string(need) + ", or 0 for the arch's reference GPU",
          "shared memory per block", need, limits_.smem_per_block);
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
  plan_forward_split();
  plan_vocab_chunk();
  if (p_.mode == Mode::Eager) plan_three_gemm();
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
  // Token chunks of up to 8192: at N = 16384 the fix-up ran slower than eager_dz's pass
  // (docs/measurements.md#eager-fixup).
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

}  // namespace lfce::runtime
