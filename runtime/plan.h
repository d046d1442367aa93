// Plan: one validated problem, the specs of the kernels it runs, its launch geometry and its
// workspace layout. Pure host code: sizes can be asked for, and kernels generated, with no GPU.
#pragma once

#include <cstddef>
#include <cstdint>
#include <vector>

#include "compiler/checked_int.h"
#include "compiler/kernel_spec.h"
#include "runtime/problem.h"
#include "runtime/tile_policy.h"
#include "runtime/tuning.h"

namespace lfce::runtime {

class Plan {
 public:
  // `tuning` picks tiles, the forward's CTA target and the chunk; workspace sizes are the
  // same for every tuning (they bound what any tuning may use), so they can be asked for
  // before the tuning is known. Throws SpecError for a problem check_problem() rejects, a
  // tuned tile outside TileConfig's ranges, or sizes that overflow int64.
  // `limits`: the device's; a tuned tile over its shared memory is dropped (logged) for the
  // default that fits.
  Plan(const Problem& problem, Arch arch, const Tuning& tuning = {}, const DeviceLimits& limits = {});
  // The tile kind runs with: tuned, else the default that fits the device, adjusted by the tile
  // policy's rules (tile_policy.cpp).
  TileConfig tile(KernelKind kind) const;

  const Problem& problem() const { return p_; }
  Arch arch() const { return arch_; }
  // The tuning as kept: tuned tiles over the device's shared memory, or loading rows TMA cannot
  // take, dropped.
  const Tuning& tuning() const { return tuning_; }
  const DeviceLimits& limits() const { return limits_; }
  // The spec `kind` runs with: normalised, the tile(), and in the three-GEMM schedule over several
  // token chunks grad_weight / grad_bias adding into fp32 sums.
  KernelSpec spec(KernelKind kind) const;

  // Forward: lse_forward splits the vocabulary over `splits` CTAs per row block.
  int64_t splits() const { return splits_; }
  // ... and over `row_groups` CTAs along the tokens, each taking every row_groups-th row block.
  int64_t row_groups() const { return row_groups_; }
  // CTAs that fill the device with `tile`'s kernel, for kernels whose CTAs loop over tiles.
  int64_t device_ctas(const TileConfig& tile) const;
  // Whether `kind`'s kernel on `tile` fits the device's shared memory per block (limits, else the
  // arch's opt-in maximum).
  bool fits(KernelKind kind, const TileConfig& tile) const;
  // Eager mode's three-GEMM schedule (lfce_forward_backward): eager_logits, lse_combine,
  // eager_dz, grad_weight / grad_bias / grad_input over the whole vocabulary, one chunk of
  // tokens at a time. Eager problems it does not serve (a softcap, label smoothing, the entropy
  // or argmax outputs, V over kMaxChunk, extra lse rows with several token chunks) run the
  // forward and then the recompute backward with an upstream gradient of 1.
  bool three_gemm() const { return three_gemm_; }
  // Tokens per chunk of the three-GEMM schedule (all N unless chunk_size or workspace_budget
  // bounds it), and the chunks.
  int64_t token_chunk() const { return token_chunk_; }
  int64_t token_chunks() const { return ceil_div(p_.tokens, token_chunk_); }
  // Vocabulary tiles of eager_logits (the partials' rows).
  int64_t eager_tiles() const;
  // Whether the three-GEMM schedule's grad_weight and grad_input form dz from eager_logits'
  // exponentials as they load them (KernelSpec::eager_operand), eager_dz then storing only its
  // constants: asked for (Tuning::eager_operand, LFCE_EXPERIMENTAL=eager_operand), and sm_90a wgmma
  // tiles in 16-bit without a bias (grad_bias reads dz itself), unclustered and unsplit, BK = 64,
  // with eager_logits' tile width a multiple of 64 and of grad_weight's BM (a slice's rows in one
  // tile).
  bool eager_operand() const;
  // Whether the three-GEMM schedule's grad_weight rewrites p̃ into dz itself, in its producer
  // warpgroup's spare warps ahead of the tiles that read it (KernelSpec::eager_fixup), eager_dz
  // then storing only its constants (its eager_operand form): unless
  // LFCE_EXPERIMENTAL=eager_dz_kernel (Tuning::eager_fixup) or eager_operand, on sm_90a in 16-bit
  // with a wgmma grad_weight tile whose BM divides eager_logits' tile width, token chunks of at
  // most 8192 (the measured gain; slower at 16384), and fewer than 2^31 work items
  // (templates/epilogue/eager_fixup.h).
  // Where no grad_weight is asked for, the run launches eager_dz's full pass instead
  // (eager_dz_pass_spec).
  bool eager_fixup() const;
  // eager_dz's spec when it rewrites the workspace itself (no eager_operand).
  KernelSpec eager_dz_pass_spec() const;
  // Every kernel spec the problem's schedule launches (a kernel that only some token counts or
  // gradients need included), in launch order: what precompilation compiles. With a device's
  // limits each fits its shared memory (else InternalError: a tile Plan should not have chosen).
  std::vector<KernelSpec> launched_specs() const;

  // Backward: vocabulary chunk width and the token stride of the dzᵀ workspace.
  int64_t chunk() const { return chunk_; }
  int64_t chunks() const { return ceil_div(p_.vocab, chunk_); }
  int64_t ld() const { return ld_; }
  bool needs_grad_input_accumulator() const { return p_.dtype != DType::FP32 && chunks() > 1; }

  // Workspace layouts: byte offsets into the caller's buffer, each 256-byte aligned.
  // partial_logit_sum ([splits, N]: label smoothing's Σ w_v·u_v), partial_entropy and partial_argmax
  // ([splits, N] each) take no bytes without the smoothing, the entropy and the predicted ids.
  struct ForwardLayout {
    size_t partial_max, partial_sum, target_logit, partial_logit_sum, partial_entropy, partial_argmax, bytes;
  };
  // dz: the chunk's dzᵀ; grad_input_acc: the fp32 [N, H] sum across chunks (when chunks > 1);
  // residual: fp32 [N], what rounding each token's target dz lost (16-bit dtypes; see grad_input).
  struct BackwardLayout { size_t dz, grad_input_acc, residual, bytes; };
  ForwardLayout forward_layout() const;
  BackwardLayout backward_layout() const;
  // lfce_forward_backward's workspace. Three-GEMM schedule: one token chunk's exponentials (dzᵀ
  // [V, ld] in the dtype), eager_logits' partials ([tiles, ld] fp32 each, for tiles of BN >= 64
  // whatever the tuning; the first chunk-many tokens of a tile used), the chunk's target logits
  // and residuals, with several chunks the fp32 sums of grad_weight [V, H] and grad_bias [V]
  // (16-bit dtypes), and each token's target column [ld] (i32) and target dz [ld] (the dtype),
  // reserved whether or not Plan::eager_operand uses them (the size depends on neither the tuning
  // nor the environment). With eager_operand, eager_dz's constants coef [tiles, ld] overlap
  // partial_sum, which lse_combine has read by then. Otherwise the larger of the forward's and the
  // backward's workspaces (used one after the other). Never less than the forward's (which runs
  // alone when no gradient is asked for).
  struct EagerLayout {
    size_t dz, partial_max, partial_sum, target_logit, residual, grad_weight_acc, grad_bias_acc, target_col, target_dz,
        bytes;
  };
  EagerLayout eager_layout() const;

 private:
  Problem p_;
  Arch arch_;
  Tuning tuning_;
  DeviceLimits limits_;
  int64_t splits_ = 1, row_groups_ = 1, chunk_ = 1, ld_ = 8;
  bool three_gemm_ = false;
  int64_t token_chunk_ = 1;
  // Geometry (plan_layout.cpp): the forward's splits and row groups, the backward's vocabulary
  // chunk, eager mode's token chunks and whether it runs the three-GEMM schedule.
  void plan_forward_split();
  void plan_vocab_chunk();
  void plan_three_gemm();
  // Throws InternalError for a spec over limits_' shared memory (with a device's limits).
  void check_fit(const std::vector<KernelSpec>& specs) const;
};

// eager_layout().bytes without a Plan: the workspace sizes depend on the problem alone, not on the
// arch, the tuning or the device limits. Throws SpecError as Plan does for a problem
// check_problem() rejects or sizes that overflow int64.
size_t eager_workspace_bytes(const Problem& problem);

}  // namespace lfce::runtime
