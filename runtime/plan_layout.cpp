// Plan's launch geometry and workspace layouts: the forward's vocabulary splits and row groups,
// the backward's vocabulary chunk and token stride, eager mode's token chunks, and the byte
// offsets of each schedule's workspace.
#include <spdlog/spdlog.h>

#include <algorithm>

#include "compiler/checked_int.h"
#include "runtime/plan.h"
#include "templates/gemm/tile_scheduler.h"

namespace lfce::runtime {
namespace {

int64_t align256(int64_t bytes) { return round_up(bytes, 256, "workspace bytes"); }

// At least this many vocabulary shares, so that when N is large the row groups reading x at once
// (ctas / splits of them) stay few enough for their rows of x to live in L2.
constexpr int64_t kMinSplits = 8;

// The sizes below depend on the problem alone, not on the arch, the tuning or the device: the
// workspaces they lay out bound what any tuning may use.

// The forward's partials' rows: the most splits of any tuning's lse_forward tiles.
int64_t max_forward_splits(const Problem& p) {
  return std::max(SplitForwardGrid::for_ctas(kMaxForwardCtas, p.tokens, p.vocab, 256, 64, kMinSplits).splits,
                  kMinSplits);
}

// The backward's vocabulary chunk as chunk_size or the workspace budget bound it (the dz
// workspace's rows; a tuning only splits it further): the budget's chunk, with N rounded up to a
// power of two so that nearby token counts share one chunk width (and so one set of compiled
// kernels); at most kMaxChunk.
int64_t budget_chunk(const Problem& p) {
  const int64_t ld = round_up(p.tokens, 8, "dz token stride");
  const int64_t per_row =
      checked_mul(next_pow2(ld, "dz token stride"), dtype_bytes(p.dtype), "dz bytes per vocabulary row");
  const int64_t granule = 128;
  const int64_t budget = p.workspace_budget > 0 ? p.workspace_budget : kDefaultWorkspaceBudget;
  const int64_t budget_rows = std::max<int64_t>(budget / per_row / granule * granule, granule);
  return p.chunk_size > 0 ? std::min(p.chunk_size, p.vocab) : std::min({budget_rows, p.vocab, kMaxChunk});
}

// Eager mode's tokens per chunk: chunk_size, else what workspace_budget gives the chunk's [V, ld]
// exponentials, else all of them; whole sequences with a causal shift (targets are read in place),
// otherwise multiples of 64 rows.
int64_t eager_token_chunk(const Problem& p) {
  const int64_t granule = p.sequence_length > 0 ? p.sequence_length : 64;
  int64_t rows = p.tokens;
  if (p.chunk_size > 0)
    rows = p.chunk_size;
  else if (p.workspace_budget > 0)
    rows = p.workspace_budget / checked_mul(p.vocab, dtype_bytes(p.dtype), "eager workspace bytes per token");
  return rows >= p.tokens ? p.tokens : std::min(std::max(rows / granule, int64_t{1}) * granule, p.tokens);
}

// Whether eager mode runs the three-GEMM schedule in chunks of `token_chunk` tokens. The options
// whose dz needs more than the stored exponentials (a softcap's slope, label smoothing's Σ u_v),
// the extra per-token statistics eager_logits does not keep, the lse rows' gradients, and a
// vocabulary wider than one kernel's chunk take the fallback. The lse rows after the first (token
// scales) are laid out [rows, N]: with several chunks too.
bool serves_three_gemm(const Problem& p, int64_t token_chunk) {
  return p.softcap == 0.f && p.label_smoothing == 0.f && !p.entropy && !p.predicted && !p.lse_grad &&
         p.vocab <= kMaxChunk && (lse_rows(p) == 1 || token_chunk == p.tokens);
}

Plan::ForwardLayout forward_layout_of(const Problem& p) {
  Plan::ForwardLayout l{};
  const int64_t partial =
      align256(checked_mul(sizeof(float) * max_forward_splits(p), p.tokens, "forward partials bytes"));
  const int64_t target = align256(checked_mul(sizeof(float), p.tokens, "forward target-logit bytes"));
  l.partial_max = 0;
  l.partial_sum = partial;
  l.target_logit = checked_mul(2, partial, "forward workspace bytes");
  l.bytes = checked_add(l.target_logit, target, "forward workspace bytes");
  // Label smoothing: the per-(split, row) partial Σ w_v·u_v.
  l.partial_logit_sum = l.bytes;
  if (p.label_smoothing != 0.f) l.bytes = checked_add(l.partial_logit_sum, partial, "forward workspace bytes");
  l.partial_entropy = l.bytes;
  if (p.entropy) l.bytes = checked_add(l.bytes, partial, "forward workspace bytes");
  l.partial_argmax = l.bytes;
  if (p.predicted) l.bytes = checked_add(l.bytes, partial, "forward workspace bytes");
  return l;
}

Plan::BackwardLayout backward_layout_of(const Problem& p) {
  Plan::BackwardLayout l{};
  l.dz = 0;
  const int64_t chunk = budget_chunk(p);
  const int64_t dz_elements = checked_mul(chunk, round_up(p.tokens, 8, "dz token stride"), "dz elements");
  l.grad_input_acc = align256(checked_mul(dz_elements, dtype_bytes(p.dtype), "dz bytes"));
  int64_t bytes = l.grad_input_acc;
  // (Plan::needs_grad_input_accumulator: a tuned chunk splits only a vocabulary of several budget chunks.)
  if (p.dtype != DType::FP32 && chunk < p.vocab) {
    const int64_t acc = checked_mul(checked_mul(sizeof(float), p.tokens, "grad_input accumulator bytes"), p.hidden,
                                    "grad_input accumulator bytes");
    bytes = checked_add(bytes, align256(acc), "backward workspace bytes");
  }
  l.residual = bytes;
  if (p.dtype != DType::FP32)
    bytes = checked_add(bytes, align256(checked_mul(sizeof(float), p.tokens, "residual bytes")),
                        "backward workspace bytes");
  l.bytes = bytes;
  return l;
}

Plan::EagerLayout eager_layout_of(const Problem& p) {
  Plan::EagerLayout l{};
  // (Without a gradient to compute, lfce_forward_backward runs the forward alone in it.)
  const size_t forward = forward_layout_of(p).bytes;
  const int64_t rows = p.mode == Mode::Eager ? eager_token_chunk(p) : p.tokens;
  if (p.mode != Mode::Eager || !serves_three_gemm(p, rows)) {
    l.bytes = std::max(forward, backward_layout_of(p).bytes);
    return l;
  }
  const int64_t ld = round_up(rows, 8, "eager token stride");
  int64_t bytes = 0;
  auto take = [&](int64_t size, const char* what) {
    const size_t at = static_cast<size_t>(bytes);
    bytes = checked_add(bytes, align256(size), what);
    return at;
  };
  l.dz = take(checked_mul(checked_mul(p.vocab, ld, "eager dz elements"), dtype_bytes(p.dtype), "eager dz bytes"),
              "eager workspace bytes");
  // eager_logits' tiles are at least 64 columns wide, whatever the tuning; the partials of rows
  // tokens, coef (over partial_sum) of ld.
  const int64_t partial = checked_mul(checked_mul(ceil_div(p.vocab, int64_t{64}), ld, "eager partials"), sizeof(float),
                                      "eager partial bytes");
  l.partial_max = take(partial, "eager workspace bytes");
  l.partial_sum = take(partial, "eager workspace bytes");
  l.target_logit = take(checked_mul(rows, sizeof(float), "eager target-logit bytes"), "eager workspace bytes");
  l.residual =
      take(p.dtype == DType::FP32 ? 0 : checked_mul(rows, sizeof(float), "residual bytes"), "eager workspace bytes");
  const bool sums = ceil_div(p.tokens, rows) > 1 && p.dtype != DType::FP32;
  l.grad_weight_acc = take(sums ? checked_mul(checked_mul(p.vocab, p.hidden, "grad_weight elements"), sizeof(float),
                                              "grad_weight accumulator bytes")
                                : 0,
                           "eager workspace bytes");
  l.grad_bias_acc = take(sums && p.bias ? checked_mul(p.vocab, sizeof(float), "grad_bias accumulator bytes") : 0,
                         "eager workspace bytes");
  l.target_col = take(checked_mul(ld, sizeof(int32_t), "eager target bytes"), "eager workspace bytes");
  l.target_dz = take(checked_mul(ld, dtype_bytes(p.dtype), "eager target dz bytes"), "eager workspace bytes");
  l.bytes = std::max(static_cast<size_t>(bytes), forward);
  return l;
}

}  // namespace

size_t eager_workspace_bytes(const Problem& problem) {
  check_problem(problem);
  return eager_layout_of(problem).bytes;
}

int64_t Plan::device_ctas(const TileConfig& tile) const {
  return (limits_.sm_count > 0 ? limits_.sm_count : kDefaultForwardCtas) * tile.ctas_per_sm();
}

void Plan::plan_forward_split() {
  const TileConfig fwd = tile(KernelKind::LseForward);
  const int64_t ctas = std::min(tuning_.forward_ctas > 0 ? tuning_.forward_ctas : device_ctas(fwd), kMaxForwardCtas);
  const SplitForwardGrid grid = SplitForwardGrid::for_ctas(ctas, p_.tokens, p_.vocab, fwd.bm, fwd.bn, kMinSplits);
  splits_ = grid.splits;
  row_groups_ = grid.row_groups;
}

void Plan::plan_vocab_chunk() {
  ld_ = round_up(p_.tokens, 8, "dz token stride");
  const int64_t budget = budget_chunk(p_);
  if (p_.chunk_size > 0) {
    chunk_ = budget;
  } else if (tuning_.chunk > 0 && budget < p_.vocab) {
    // A tuning never exceeds the budget, and only re-splits a vocabulary that takes several
    // chunks anyway: the workspace (sized without the tuning) then has the accumulator.
    chunk_ = std::min(tuning_.chunk, budget);
  } else {
    chunk_ = budget;
  }
  if (p_.mode == Mode::Eager) plan_three_gemm();
}

void Plan::plan_three_gemm() {
  token_chunk_ = eager_token_chunk(p_);
  three_gemm_ = serves_three_gemm(p_, token_chunk_);
  // The smallest chunk (one sequence with the shift, else 64 rows) may need more than the budget
  // bounds (the chunk's [V, ld] exponentials): the workspace size reports what it needs, but a
  // caller who sized by the budget should hear.
  if (three_gemm_ && p_.chunk_size == 0 && p_.workspace_budget > 0) {
    const int64_t needed =
        checked_mul(checked_mul(p_.vocab, round_up(token_chunk_, 8, "eager token stride"), "eager dz elements"),
                    dtype_bytes(p_.dtype), "eager dz bytes");
    if (needed > p_.workspace_budget)
      spdlog::warn(
          "eager mode: a token chunk of {} tokens{} needs {} bytes of workspace, over workspace_budget = {} "
          "bytes: allocate what lfce_forward_backward_workspace_size reports (at least {} bytes), or raise "
          "workspace_budget to at least that{}",
          token_chunk_, p_.sequence_length > 0 ? " (one whole sequence, with the causal shift)" : "", needed,
          p_.workspace_budget, needed, p_.sequence_length > 0 ? " (or use shorter sequences)" : "");
  }
}

Plan::ForwardLayout Plan::forward_layout() const { return forward_layout_of(p_); }
Plan::BackwardLayout Plan::backward_layout() const { return backward_layout_of(p_); }
Plan::EagerLayout Plan::eager_layout() const { return eager_layout_of(p_); }

}  // namespace lfce::runtime
