// Plan's launch geometry and workspace layouts: the forward's vocabulary splits and row groups,
// the backward's vocabulary chunk and token stride, eager mode's token chunks, and the byte
// offsets of each schedule's workspace.
#include <spdlog/spdlog.h>

#include <algorithm>

#include "compiler/checked_int.h"
#include "runtime/plan.h"

namespace lfce::runtime {
namespace {

int64_t align256(int64_t bytes) { return round_up(bytes, 256, "workspace bytes"); }

// At least this many vocabulary shares, so that when N is large the row groups reading x at once
// (ctas / splits of them) stay few enough for their rows of x to live in L2.
constexpr int64_t kMinSplits = 8;

}  // namespace

int64_t Plan::device_ctas(const TileConfig& tile) const {
  return (limits_.sm_count > 0 ? limits_.sm_count : kDefaultForwardCtas) * tile.ctas_per_sm();
}

void Plan::plan_forward_split() {
  const TileConfig fwd = tile(KernelKind::LseForward);
  auto splits_for = [&](int64_t ctas, int64_t bm, int64_t bn) {
    return std::clamp<int64_t>(std::max(ceil_div(ctas, ceil_div(p_.tokens, bm)), kMinSplits), 1,
                               std::min<int64_t>(ceil_div(p_.vocab, bn), 65535));
  };
  const int64_t ctas = std::min(tuning_.forward_ctas > 0 ? tuning_.forward_ctas : device_ctas(fwd), kMaxForwardCtas);
  splits_ = splits_for(ctas, fwd.bm, fwd.bn);
  row_groups_ = std::clamp<int64_t>(ctas / splits_, 1, ceil_div(p_.tokens, fwd.bm));
  max_splits_ = std::max(splits_for(kMaxForwardCtas, 256, 64), kMinSplits);  // bounds every tuning's tiles
}

void Plan::plan_vocab_chunk() {
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
