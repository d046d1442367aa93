#include "runtime/launch.h"

#include <spdlog/spdlog.h>

#include <cstdint>
#include <initializer_list>
#include <string>
#include <vector>

#include "compiler/checked_int.h"
#include "compiler/errors.h"
#include "runtime/driver.h"
#include "runtime/kernel_cache.h"

namespace lfce::runtime {
namespace {

void require(const void* ptr, const char* name) {
  if (!ptr) throw SpecError(std::string(name) + " is NULL");
}

void require_aligned(const void* ptr, const char* name, int bytes = 16) {
  require(ptr, name);
  if (reinterpret_cast<uintptr_t>(ptr) % bytes != 0)
    throw SpecError(std::string(name) + " is not " + std::to_string(bytes) +
                    "-byte aligned; pass a contiguous tensor that starts on " + std::to_string(bytes) + " bytes");
}

// hidden and weight: the GEMMs copy their rows in hidden_row_align(H) pieces (16 bytes unless
// H·elem bytes is not a multiple of 16), from the base on.
void require_rows_aligned(const Problem& problem, const void* ptr, const char* name) {
  require_aligned(ptr, name, hidden_row_align(problem.hidden, problem.dtype));
}

// A [*, H] gradient the GEMM epilogues write (grad_hidden, grad_weight): element by element on
// mma.sync tiles, in pairs of elements straight from the registers on wgmma tiles (store_pair in
// templates/template_util.h), which only rows of H a multiple of 16 bytes take (hidden_row_align).
int gradient_align(const Problem& problem, int element_bytes) {
  return hidden_row_align(problem.hidden, problem.dtype) == 16 ? 2 * element_bytes : element_bytes;
}

// The per-token ids, read one at a time in their index type.
int target_bytes(const Problem& problem) { return problem.targets == IndexType::I64 ? 8 : 4; }

// fp32 arrays (lse, token_loss, loss, valid_count, grad_loss) are read and written one float at a time.
void require_f32(const void* ptr, const char* name) { require_aligned(ptr, name, 4); }

void require_workspace(void* workspace, size_t given, size_t needed, const char* call) {
  if (given < needed)
    throw SpecError(std::string(call) + ": workspace_bytes = " + std::to_string(given) + " is below the " +
                    std::to_string(needed) + " bytes this problem needs");
  if (needed > 0) require_aligned(workspace, "workspace");
}

char* at(void* base, size_t offset) { return static_cast<char*>(base) + offset; }

// One GEMM operand as its template describes it (the GemmOperand in templates/<kind>.cpp): the
// stored matrix at `base`, `ld` elements between its rows, `mn` rows of M (or N) and `k` of K.
struct Operand {
  const void* base;
  int64_t ld, mn, k;
};

// The TMA map the sm_90a pipeline (templates/wgmma_pipeline.cpp) loads `op` through: boxes of
// 64 contiguous elements (one 128-byte swizzled row) by BM/BN rows (K-major) or BK rows
// (MN-major); reads past the extents zero-fill.
// `tile_mn / parts` rows per box instead where the CTAs of a cluster each load a share of a
// K-major tile (the pipeline's multicast B, or A along N).
CUtensorMap operand_map(const Operand& op, Layout layout, DType dtype, int tile_mn, int bk, int parts = 1) {
  const bool k_major = layout == Layout::KMajor;
  const cuuint64_t dims[2] = {static_cast<cuuint64_t>(k_major ? op.k : op.mn),
                              static_cast<cuuint64_t>(k_major ? op.mn : op.k)};
  const cuuint64_t strides[1] = {static_cast<cuuint64_t>(op.ld) * static_cast<cuuint64_t>(dtype_bytes(dtype))};
  const cuuint32_t box[2] = {64, static_cast<cuuint32_t>(k_major ? tile_mn / parts : bk)};
  const cuuint32_t element_strides[2] = {1, 1};
  CUtensorMap map;
  check(Driver::get().cuTensorMapEncodeTiled(
            &map, dtype == DType::BF16 ? CU_TENSOR_MAP_DATA_TYPE_BFLOAT16 : CU_TENSOR_MAP_DATA_TYPE_FLOAT16, 2,
            const_cast<void*>(op.base), dims, strides, box, element_strides, CU_TENSOR_MAP_INTERLEAVE_NONE,
            CU_TENSOR_MAP_SWIZZLE_128B, CU_TENSOR_MAP_L2_PROMOTION_L2_256B, CU_TENSOR_MAP_FLOAT_OOB_FILL_NONE),
        "cuTensorMapEncodeTiled");
  return map;
}

// The grid of a backward GEMM whose output is [rows, cols]: one CTA per tile for mma.sync
// tiles; for wgmma tiles, persistent CTAs (as many as fill the device) that loop over the
// tiles, counting them in 32 bits and stepping by the grid, so tiles + grid must not wrap.
// Clustered tiles: whole clusters, each taking groups of `cluster` tiles adjacent along M (N).
Dim3 gemm_grid(const Plan& plan, const KernelSpec& spec, int64_t rows, int64_t cols, const char* kernel) {
  const Dim3 grid{grid_dim(rows, spec.tile.bm, 'x'), grid_dim(cols, spec.tile.bn, 'y'), 1};
  if (!spec.tile.wgmma()) return grid;
  const int64_t cluster = spec.tile.cluster;
  const int64_t tiles = spec.tile.cluster_n ? int64_t{grid.x} * (ceil_div(int64_t{grid.y}, cluster) * cluster)
                                            : ceil_div(int64_t{grid.x}, cluster) * cluster * grid.y;
  const int64_t ctas = std::max(std::min(tiles, plan.device_ctas(spec.tile)) / cluster, int64_t{1}) * cluster;
  if (tiles > INT32_MAX - ctas)
    throw SpecError(std::string("problem too large: ") + std::to_string(tiles) + " " + kernel +
                    " tiles in one launch, over 2^31 - 1 - " + std::to_string(ctas));
  return {static_cast<unsigned>(ctas), 1, 1};
}

// Launches a GEMM kernel: `args` as the template declares them, then, for wgmma tiles, the
// tensor maps of operands A and B (gemm_params in templates/gemm_skeleton.h).
void launch_gemm(const Kernel& kernel, const KernelSpec& spec, Dim3 grid, CUstream stream,
                 std::vector<void*> params, const Operand& a, const Operand& b) {
  CUtensorMap maps[2];
  if (spec.tile.wgmma()) {
    const KernelKindInfo& info = kind_info(spec.kind);
    const int shared_parts = spec.tile.cluster;  // the shared operand's share a CTA loads
    maps[0] = operand_map(a, info.a, spec.dtype, spec.tile.bm, spec.tile.bk, spec.tile.cluster_n ? shared_parts : 1);
    maps[1] = operand_map(b, info.b, spec.dtype, spec.tile.bn, spec.tile.bk, spec.tile.cluster_n ? 1 : shared_parts);
    params.push_back(&maps[0]);
    params.push_back(&maps[1]);
  }
  kernel.launch(grid, stream, params.data(), spec.tile.cluster);
}

// The forward's arguments (lfce_forward and lfce_forward_backward), each named where it is wrong.
void check_forward_args(const Problem& problem, const lfce_forward_args& a) {
  require_rows_aligned(problem, a.hidden, "hidden");
  require_rows_aligned(problem, a.weight, "weight");
  if (problem.bias) require_aligned(a.bias, "bias", dtype_bytes(problem.dtype));
  require_aligned(a.targets, "targets", target_bytes(problem));
  require_f32(a.lse, "lse");
  require_f32(a.token_loss, "token_loss");
  require_f32(a.valid_count, "valid_count");
  if (problem.class_weight) require_aligned(a.class_weight, "class_weight (the problem has has_class_weight = 1)", 4);
  if (problem.reduction != Reduction::None || a.loss) require_f32(a.loss, "loss");
  if (problem.predicted) require_aligned(a.predicted, "predicted (the problem's outputs has LFCE_OUTPUT_PREDICTED)", 8);
}

void run_forward(const Problem& problem, const lfce_forward_args& a, const PlanFor& plan_for) {
  check_forward_args(problem, a);
  make_context_current(a.device);
  const Plan plan = plan_for(problem, a.device);
  const auto layout = plan.forward_layout();
  require_workspace(a.workspace, a.workspace_bytes, layout.bytes, "lfce_forward");
  auto stream = static_cast<CUstream>(a.stream);

  int64_t n = problem.tokens, ignore = problem.ignore_index, sequence_length = problem.sequence_length;
  int32_t splits = static_cast<int32_t>(plan.splits());
  void* x = const_cast<void*>(a.hidden);
  void* w = const_cast<void*>(a.weight);
  void* b = const_cast<void*>(a.bias ? a.bias : a.weight);  // never read without bias
  void* y = const_cast<void*>(a.targets);
  void* pmax = at(a.workspace, layout.partial_max);
  void* psum = at(a.workspace, layout.partial_sum);
  void* tlogit = at(a.workspace, layout.target_logit);
  void* lse = a.lse;
  void* token_loss = a.token_loss;
  void* loss = a.loss ? static_cast<void*>(a.loss) : static_cast<void*>(a.valid_count);
  void* count = a.valid_count;

  // Label smoothing's partial logit sums (the templates take them, and the class weights, only
  // with those options).
  void* logit_sums = at(a.workspace, layout.partial_logit_sum);
  void* class_weight = const_cast<float*>(a.class_weight);
  // The extra outputs' partials (the entropy's t, the argmax) and the predicted ids.
  void* entropy_partials = at(a.workspace, layout.partial_entropy);
  void* argmax_partials = at(a.workspace, layout.partial_argmax);
  void* predicted = a.predicted;

  const KernelSpec fwd = plan.spec(KernelKind::LseForward);
  const int64_t h = problem.hidden, v = problem.vocab;
  std::vector<void*> fwd_args = {&x, &w, &b, &y, &n, &pmax, &psum, &tlogit};
  if (fwd.label_smoothing != 0.f) fwd_args.push_back(&logit_sums);
  if (fwd.entropy) fwd_args.push_back(&entropy_partials);
  if (fwd.argmax) fwd_args.push_back(&argmax_partials);
  if (fwd.class_weight) fwd_args.push_back(&class_weight);
  if (fwd.shift) fwd_args.push_back(&sequence_length);
  launch_gemm(kernel_for(a.device, fwd), fwd, {static_cast<unsigned>(plan.row_groups()), static_cast<unsigned>(splits), 1}, stream,
              fwd_args, Operand{x, h, n, h}, Operand{w, h, v, h});

  const KernelSpec combine = plan.spec(KernelKind::LseCombine);
  std::vector<void*> combine_args = {&pmax, &psum, &tlogit, &y, &n, &ignore, &splits, &lse, &token_loss};
  if (combine.label_smoothing != 0.f) combine_args.push_back(&logit_sums);
  if (combine.class_weight) combine_args.push_back(&class_weight);
  if (combine.label_smoothing != 0.f && combine.class_weight) combine_args.push_back(&count);
  if (combine.entropy) combine_args.push_back(&entropy_partials);
  if (combine.argmax) combine_args.insert(combine_args.end(), {&argmax_partials, &predicted});
  if (combine.shift) combine_args.push_back(&sequence_length);
  kernel_for(a.device, combine).launch({grid_dim(n, 256, 'x'), 1, 1}, stream, combine_args.data());

  const KernelSpec reduce = plan.spec(KernelKind::LossReduce);
  std::vector<void*> reduce_args = {&token_loss, &y, &n, &ignore, &loss, &count};
  if (reduce.class_weight) reduce_args.push_back(&class_weight);
  if (reduce.z_loss_scale != 0.f) reduce_args.push_back(&lse);
  if (reduce.shift) reduce_args.push_back(&sequence_length);
  kernel_for(a.device, reduce).launch({1, 1, 1}, stream, reduce_args.data());
}

void run_backward(const Problem& problem, const lfce_backward_args& a, const PlanFor& plan_for) {
  require_rows_aligned(problem, a.hidden, "hidden");
  require_rows_aligned(problem, a.weight, "weight");
  if (problem.bias) require_aligned(a.bias, "bias", dtype_bytes(problem.dtype));
  require_aligned(a.targets, "targets", target_bytes(problem));
  require_f32(a.lse, "lse");
  require_f32(a.valid_count, "valid_count");
  if (problem.class_weight) require_aligned(a.class_weight, "class_weight (the problem has has_class_weight = 1)", 4);
  if (problem.mode == Mode::Recompute) require(a.grad_loss, "grad_loss (recompute mode needs the upstream gradient)");
  if (a.grad_loss) require_f32(a.grad_loss, "grad_loss");
  if (a.grad_lse && problem.dtype == DType::FP16)
    throw SpecError("grad_lse (the gradients of the lse rows) needs bf16 or fp32 inputs, got fp16: its dz is not "
                    "scaled into fp16's range");
  if (a.grad_lse) require_aligned(a.grad_lse, "grad_lse", 4);
  if (a.grad_lse && !problem.lse_grad) throw InternalError("grad_lse given for a problem planned without it");
  // Each gradient is optional (a frozen LM head, LoRA): a NULL one's kernel is neither compiled nor launched.
  const bool want_hidden = a.grad_hidden != nullptr;
  const bool want_weight = a.grad_weight != nullptr;
  const bool want_bias = problem.bias && a.grad_bias != nullptr;
  // grad_input writes (and for fp32 accumulates in) grad_hidden, in pairs on wgmma tiles.
  if (want_hidden) require_aligned(a.grad_hidden, "grad_hidden", gradient_align(problem, dtype_bytes(problem.dtype)));
  // Written in dtype, or added into as fp32 (grad_weight in pairs) with accumulation; grad_bias
  // one element at a time.
  if (want_weight)
    require_aligned(a.grad_weight, problem.accumulate_grad_weight ? "grad_weight (accumulated, fp32)" : "grad_weight",
                    problem.accumulate_grad_weight ? 8 : gradient_align(problem, dtype_bytes(problem.dtype)));
  if (want_bias)
    require_aligned(a.grad_bias, problem.accumulate_grad_bias ? "grad_bias (accumulated, fp32)" : "grad_bias",
                    problem.accumulate_grad_bias ? 4 : dtype_bytes(problem.dtype));
  if (!want_hidden && !want_weight && !want_bias) {
    spdlog::debug("backward: no gradient asked for, nothing launched");
    return;
  }
  make_context_current(a.device);
  const Plan plan = plan_for(problem, a.device);
  const auto layout = plan.backward_layout();
  require_workspace(a.workspace, a.workspace_bytes, layout.bytes, "lfce_backward");
  auto stream = static_cast<CUstream>(a.stream);

  int64_t n = problem.tokens, ignore = problem.ignore_index, ld = plan.ld();
  int64_t sequence_length = problem.sequence_length;
  const int64_t h = problem.hidden;
  void* x = const_cast<void*>(a.hidden);
  void* w = const_cast<void*>(a.weight);
  void* b = const_cast<void*>(a.bias ? a.bias : a.weight);
  void* y = const_cast<void*>(a.targets);
  void* lse = const_cast<float*>(a.lse);
  void* count = const_cast<float*>(a.valid_count);
  void* grad_loss = const_cast<float*>(a.grad_loss ? a.grad_loss : a.valid_count);  // unread in eager mode
  void* dz = at(a.workspace, layout.dz);
  void* residual = at(a.workspace, layout.residual);  // unused (never read or written) for fp32
  void* grad_hidden = a.grad_hidden;
  void* acc = plan.needs_grad_input_accumulator() ? at(a.workspace, layout.grad_input_acc) : a.grad_hidden;
  void* grad_weight = a.grad_weight;
  void* grad_bias = a.grad_bias;
  void* class_weight = const_cast<float*>(a.class_weight);
  void* grad_lse = const_cast<float*>(a.grad_lse);

  const KernelSpec dlogits = plan.spec(KernelKind::DlogitsBackward);
  const KernelSpec gw = plan.spec(KernelKind::GradWeight);
  const KernelSpec gx = plan.spec(KernelKind::GradInput);
  const Kernel& dlogits_kernel = kernel_for(a.device, dlogits);
  const Kernel* gw_kernel = want_weight ? &kernel_for(a.device, gw) : nullptr;
  const Kernel* gx_kernel = want_hidden ? &kernel_for(a.device, gx) : nullptr;
  const Kernel* gb_kernel = want_bias ? &kernel_for(a.device, plan.spec(KernelKind::GradBias)) : nullptr;

  const int64_t chunks = plan.chunks();
  spdlog::debug("backward: N={} V={} H={} in {} chunk(s) of {}; grad_hidden {}, grad_weight {}, grad_bias {}", n,
                problem.vocab, problem.hidden, chunks, plan.chunk(), want_hidden, want_weight, want_bias);
  for (int64_t c = 0; c < chunks; ++c) {
    int64_t v_begin = c * plan.chunk();
    int64_t v_len = std::min(plan.chunk(), problem.vocab - v_begin);
    int32_t first = c == 0, last = c == chunks - 1;

    const Dim3 dlogits_grid = gemm_grid(plan, dlogits, n, v_len, "dlogits_backward");
    // The chunk's rows of W, as the templates address them.
    const void* w_chunk = static_cast<const char*>(w) + v_begin * h * dtype_bytes(problem.dtype);
    std::vector<void*> dlogits_args = {&x,  &w,       &b,     &y,  &lse, &grad_loss, &count,
                                       &n,  &ignore,  &v_begin, &v_len, &ld, &dz,  &residual};
    if (dlogits.class_weight) dlogits_args.push_back(&class_weight);
    if (dlogits.lse_grad) dlogits_args.push_back(&grad_lse);
    if (dlogits.shift) dlogits_args.push_back(&sequence_length);
    launch_gemm(dlogits_kernel, dlogits, dlogits_grid, stream, dlogits_args, Operand{x, h, n, h},
                Operand{w_chunk, h, v_len, h});

    if (gw_kernel)  // A = dzᵀ [v_len, ld] K-major; B = x [N, H] MN-major
      launch_gemm(*gw_kernel, gw, gemm_grid(plan, gw, v_len, h, "grad_weight"), stream,
                  {&dz, &x, &n, &ld, &v_begin, &v_len, &grad_weight, &grad_loss, &count}, Operand{dz, ld, v_len, ld},
                  Operand{x, h, h, n});

    if (gb_kernel) {
      void* gb_args[] = {&dz, &n, &ld, &v_begin, &v_len, &grad_bias, &grad_loss, &count};
      gb_kernel->launch({grid_dim(v_len, 8, 'x'), 1, 1}, stream, gb_args);
    }

    if (gx_kernel) {  // A = dzᵀ [v_len, ld] MN-major; B = W[chunk] [v_len, H] MN-major
      std::vector<void*> gx_args = {&dz,   &w,         &n,         &ld,    &v_begin, &v_len, &acc,
                                    &grad_hidden, &first, &last, &grad_loss, &count, &y,      &residual};
      if (gx.shift) gx_args.push_back(&sequence_length);
      launch_gemm(*gx_kernel, gx, gemm_grid(plan, gx, n, h, "grad_input"), stream, gx_args, Operand{dz, ld, n, v_len},
                  Operand{w_chunk, h, h, v_len});
    }
  }
}

// The three gradients lfce_forward_backward writes (each may be NULL: not computed).
struct Gradients {
  void *hidden, *weight, *bias;
};

void zero_f32(void* buffer, int64_t floats, CUstream stream) {
  check(Driver::get().cuMemsetD32Async(reinterpret_cast<CUdeviceptr>(buffer), 0, static_cast<size_t>(floats), stream),
        "cuMemsetD32Async");
}

// Eager mode's three-GEMM schedule (Plan::three_gemm): token_count; per token chunk
// eager_logits, lse_combine, eager_dz, then grad_weight, grad_bias and grad_input over the whole
// vocabulary; loss_reduce; with several chunks grad_convert of the fp32 gradient sums. With
// Plan::eager_operand eager_dz stores only its constants, and the two GEMMs form dz from the
// exponentials as they load them. With Plan::eager_fixup (and a grad_weight to compute) eager_dz
// stores only its constants too, and grad_weight's producer warpgroup rewrites the workspace into
// dz ahead of its tiles (templates/eager_fixup.h), its work counters over eager_dz's partial
// maxima (read by then; [ceil(V/64), ld] floats hold the 1 + ceil(V/BM) counters for any BM >= 64).
void run_three_gemm(const Problem& problem, const Plan& plan, const lfce_forward_args& a, const Gradients& g) {
  const auto layout = plan.eager_layout();
  auto stream = static_cast<CUstream>(a.stream);
  int64_t n_total = problem.tokens;
  const int64_t h = problem.hidden, v = problem.vocab, elem = dtype_bytes(problem.dtype);
  const int64_t target_bytes = problem.targets == IndexType::I64 ? 8 : 4;
  int64_t ignore = problem.ignore_index, sequence_length = problem.sequence_length;
  void* w = const_cast<void*>(a.weight);
  void* b = const_cast<void*>(a.bias ? a.bias : a.weight);  // never read without bias
  void* class_weight = const_cast<float*>(a.class_weight);
  void* count = a.valid_count;
  void* dz = at(a.workspace, layout.dz);
  void* pmax = at(a.workspace, layout.partial_max);
  void* psum = at(a.workspace, layout.partial_sum);
  void* tlogit = at(a.workspace, layout.target_logit);
  void* residual = at(a.workspace, layout.residual);  // unused for fp32
  void* coef = psum;  // (eager_operand: written by eager_dz after lse_combine has read the partial sums)
  void* target_col = at(a.workspace, layout.target_col);
  void* target_dz = at(a.workspace, layout.target_dz);
  const int64_t chunks = plan.token_chunks();
  const bool sums = chunks > 1;
  // Several chunks: grad_weight and grad_bias are fp32 sums, the output itself for fp32.
  const bool f32 = problem.dtype == DType::FP32;
  void* gw_out = sums && !f32 ? at(a.workspace, layout.grad_weight_acc) : g.weight;
  void* gb_out = sums && !f32 ? at(a.workspace, layout.grad_bias_acc) : g.bias;

  const KernelSpec count_spec = plan.spec(KernelKind::TokenCount);
  const KernelSpec logits = plan.spec(KernelKind::EagerLogits);
  const KernelSpec combine = plan.spec(KernelKind::LseCombine);
  const KernelSpec gw = plan.spec(KernelKind::GradWeight), gb = plan.spec(KernelKind::GradBias);  // (sums: accumulate)
  // Without a grad_weight to do it, eager_dz's own pass rewrites the workspace.
  const KernelSpec dz_spec = gw.eager_fixup && !g.weight ? plan.eager_dz_pass_spec() : plan.spec(KernelKind::EagerDz);
  const KernelSpec gx = plan.spec(KernelKind::GradInput);
  const Kernel& logits_kernel = kernel_for(a.device, logits);
  const Kernel& combine_kernel = kernel_for(a.device, combine);
  const Kernel& dz_kernel = kernel_for(a.device, dz_spec);
  const Kernel* gw_kernel = g.weight ? &kernel_for(a.device, gw) : nullptr;
  const Kernel* gb_kernel = g.bias ? &kernel_for(a.device, gb) : nullptr;
  const Kernel* gx_kernel = g.hidden ? &kernel_for(a.device, gx) : nullptr;
  spdlog::debug("eager: N={} V={} H={} in {} token chunk(s) of {}; grad_hidden {}, grad_weight {}, grad_bias {}",
                n_total, v, h, chunks, plan.token_chunk(), g.hidden != nullptr, g.weight != nullptr, g.bias != nullptr);

  {  // The valid count (and Σ w_y) first: eager_dz divides by them.
    void* y = const_cast<void*>(a.targets);
    std::vector<void*> args = {&y, &n_total, &ignore, &count};
    if (count_spec.class_weight) args.push_back(&class_weight);
    if (count_spec.shift) args.push_back(&sequence_length);
    kernel_for(a.device, count_spec).launch({1, 1, 1}, stream, args.data());
  }
  if (sums && gw_kernel) zero_f32(gw_out, checked_mul(v, h, "grad_weight elements"), stream);
  if (sums && gb_kernel) zero_f32(gb_out, v, stream);
  int32_t tiles = static_cast<int32_t>(plan.eager_tiles());
  int64_t tile_n = logits.tile.bn, v_begin = 0, v_len = v;
  // The operand transform reads the constants of tile v / tile_n for whole slices of the
  // vocabulary (templates/eager_operand.h): BK = 64 in grad_input, BM in grad_weight, all from v = 0.
  for (const KernelSpec* s : {&gw, &gx})
    if ((s->eager_operand && (tile_n % s->tile.bk != 0 || (s == &gw && tile_n % s->tile.bm != 0))) ||
        (s->eager_fixup && tile_n % s->tile.bm != 0))
      throw InternalError("eager constants: eager_logits' tile width " + std::to_string(tile_n) + " splits a slice of " +
                          s->text());
  // eager_dz's constants as the operand transform and the fix-up take them (add_eager_constant_params).
  const std::vector<void*> constants = {&coef, &target_col, &target_dz, &tile_n};
  int32_t first = 1, last = 1;
  for (int64_t c = 0; c < chunks; ++c) {
    const int64_t r0 = c * plan.token_chunk();
    int64_t rows = std::min(plan.token_chunk(), n_total - r0), ld = round_up(rows, 8, "eager token stride");
    // The chunk's rows of every per-token array (whole sequences with a causal shift, so targets
    // t + 1 are read in place).
    void* x = const_cast<char*>(static_cast<const char*>(a.hidden) + r0 * h * elem);
    void* y = const_cast<char*>(static_cast<const char*>(a.targets) + r0 * target_bytes);
    void* lse = a.lse + r0;
    void* token_loss = a.token_loss + r0;
    void* grad_hidden = g.hidden ? static_cast<char*>(g.hidden) + r0 * h * elem : nullptr;

    std::vector<void*> logits_args = {&x, &w, &b, &y, &rows, &ld, &dz, &pmax, &psum, &tlogit};
    if (logits.shift) logits_args.push_back(&sequence_length);
    launch_gemm(logits_kernel, logits, gemm_grid(plan, logits, rows, v, "eager_logits"), stream, logits_args,
                Operand{x, h, rows, h}, Operand{w, h, v, h});

    std::vector<void*> combine_args = {&pmax, &psum, &tlogit, &y, &rows, &ignore, &tiles, &lse, &token_loss};
    if (combine.class_weight) combine_args.push_back(&class_weight);
    if (combine.shift) combine_args.push_back(&sequence_length);
    combine_kernel.launch({grid_dim(rows, 256, 'x'), 1, 1}, stream, combine_args.data());

    std::vector<void*> dz_args = {&dz,  &pmax,   &lse,    &tlogit, &y,          &count,     &residual, &rows,
                                  &ld,  &ignore, &v_len,  &tile_n, &coef,       &target_col, &target_dz};
    if (dz_spec.class_weight) dz_args.push_back(&class_weight);
    if (dz_spec.shift) dz_args.push_back(&sequence_length);
    // eager_operand: each CTA's 8 row groups store 8 tiles' constants.
    const unsigned dz_tiles = grid_dim(dz_spec.eager_operand ? ceil_div(int64_t{tiles}, int64_t{8}) : tiles, 1, 'y');
    dz_kernel.launch({grid_dim(ld, 256, 'x'), dz_tiles, 1}, stream, dz_args.data());

    if (gw_kernel) {  // A = dzᵀ [V, ld] K-major; B = the chunk's x [rows, H] MN-major
      std::vector<void*> gw_args = {&dz, &x, &rows, &ld, &v_begin, &v_len, &gw_out, &count, &count};
      if (gw.eager_operand || gw.eager_fixup) gw_args.insert(gw_args.end(), constants.begin(), constants.end());
      void* ready = pmax;  // eager_fixup's counters (eager_dz has read the partial maxima)
      if (gw.eager_fixup) {
        zero_f32(ready, 1 + ceil_div(v_len, int64_t{gw.tile.bm}), stream);
        gw_args.push_back(&ready);
      }
      launch_gemm(*gw_kernel, gw, gemm_grid(plan, gw, v, h, "grad_weight"), stream, gw_args, Operand{dz, ld, v, ld},
                  Operand{x, h, h, rows});
    }
    if (gb_kernel) {
      void* gb_args[] = {&dz, &rows, &ld, &v_begin, &v_len, &gb_out, &count, &count};
      gb_kernel->launch({grid_dim(v, 8, 'x'), 1, 1}, stream, gb_args);
    }
    if (gx_kernel) {  // A = dzᵀ [V, ld] MN-major; B = W [V, H] MN-major; one chunk of K = V: straight to the output
      std::vector<void*> gx_args = {&dz,   &w,    &rows,  &ld,    &v_begin, &v_len, &grad_hidden,
                                    &grad_hidden, &first, &last, &count, &count, &y,      &residual};
      if (gx.shift) gx_args.push_back(&sequence_length);
      if (gx.eager_operand) gx_args.insert(gx_args.end(), constants.begin(), constants.end());
      launch_gemm(*gx_kernel, gx, gemm_grid(plan, gx, rows, h, "grad_input"), stream, gx_args,
                  Operand{dz, ld, rows, v}, Operand{w, h, h, v});
    }
  }

  const KernelSpec reduce = plan.spec(KernelKind::LossReduce);
  void* token_loss = a.token_loss;
  void* y = const_cast<void*>(a.targets);
  void* loss = a.loss ? static_cast<void*>(a.loss) : static_cast<void*>(a.valid_count);
  void* lse = a.lse;
  std::vector<void*> reduce_args = {&token_loss, &y, &n_total, &ignore, &loss, &count};
  if (reduce.class_weight) reduce_args.push_back(&class_weight);
  if (reduce.z_loss_scale != 0.f) reduce_args.push_back(&lse);
  if (reduce.shift) reduce_args.push_back(&sequence_length);
  kernel_for(a.device, reduce).launch({1, 1, 1}, stream, reduce_args.data());

  if (sums && !f32) {
    const Kernel& convert = kernel_for(a.device, plan.spec(KernelKind::GradConvert));
    auto run_convert = [&](void* src, void* dst, int64_t elements) {
      void* args[] = {&src, &dst, &elements};
      convert.launch({static_cast<unsigned>(std::min<int64_t>(ceil_div(elements, 256), 4 * plan.device_ctas(TileConfig{}))), 1, 1},
                     stream, args);
    };
    if (gw_kernel) run_convert(gw_out, g.weight, checked_mul(v, h, "grad_weight elements"));
    if (gb_kernel) run_convert(gb_out, g.bias, v);
  }
}

void run_forward_backward(const Problem& problem, const lfce_forward_args& a, const Gradients& g,
                          const PlanFor& plan_for) {
  if (problem.mode != Mode::Eager)
    throw SpecError("lfce_forward_backward needs lfce_problem.mode = LFCE_MODE_EAGER (it computes the gradients for an "
                    "upstream gradient of 1), got LFCE_MODE_RECOMPUTE");
  check_forward_args(problem, a);
  const Gradients grads{g.hidden, g.weight, problem.bias ? g.bias : nullptr};
  if (grads.hidden) require_aligned(grads.hidden, "grad_hidden", gradient_align(problem, dtype_bytes(problem.dtype)));
  if (grads.weight) require_aligned(grads.weight, "grad_weight", gradient_align(problem, dtype_bytes(problem.dtype)));
  if (grads.bias) require_aligned(grads.bias, "grad_bias", dtype_bytes(problem.dtype));
  // The workspace's size does not depend on the tuning or the device (Plan::eager_layout): checked
  // before the driver is touched.
  require_workspace(a.workspace, a.workspace_bytes, Plan(problem, Arch::SM90A).eager_layout().bytes,
                    "lfce_forward_backward");
  make_context_current(a.device);
  const Plan plan = plan_for(problem, a.device);
  if (!grads.hidden && !grads.weight && !grads.bias) {
    spdlog::debug("eager: no gradient asked for, the forward alone");
    run_forward(problem, a, plan_for);
    return;
  }
  if (plan.three_gemm()) {
    run_three_gemm(problem, plan, a, grads);
    return;
  }
  // The fallback: the forward, then the recompute backward with an upstream gradient of 1 (eager
  // mode's kernels do not read grad_loss), in the same workspace one after the other.
  spdlog::debug("eager: the forward, then the backward with an upstream gradient of 1 (no three-GEMM schedule for {})",
                problem_text(problem));
  run_forward(problem, a, plan_for);
  const lfce_backward_args backward_args{a.hidden,      a.weight,     a.bias,        a.targets,   a.class_weight,
                                         a.lse,         a.valid_count, nullptr,      nullptr,     grads.hidden,
                                         grads.weight,  grads.bias,    a.workspace,  a.workspace_bytes, a.device,
                                         a.stream};
  run_backward(problem, backward_args, plan_for);
}

}  // namespace

unsigned grid_dim(int64_t extent, int64_t tile, char axis) {
  const int64_t blocks = ceil_div(extent, tile);
  const int64_t limit = axis == 'x' ? kMaxGridX : kMaxGridYZ;
  if (blocks > limit)
    throw SpecError("problem too large: " + std::to_string(extent) + " / " + std::to_string(tile) + " = " +
                    std::to_string(blocks) + " CTAs along grid " + axis + ", over CUDA's limit of " +
                    std::to_string(limit));
  return static_cast<unsigned>(blocks);
}

void forward(const Problem& problem, const lfce_forward_args& args, const PlanFor& plan_for) {
  run_forward(problem, args, plan_for);
}
void backward(const Problem& problem, const lfce_backward_args& args, const PlanFor& plan_for) {
  run_backward(problem, args, plan_for);
}
void forward_backward(const Problem& problem, const lfce_forward_args& args, void* grad_hidden, void* grad_weight,
                      void* grad_bias, const PlanFor& plan_for) {
  run_forward_backward(problem, args, Gradients{grad_hidden, grad_weight, grad_bias}, plan_for);
}

void scale_gradient(DType dtype, const void* src, void* dst, int64_t count, const float* scale, int device,
                    void* stream) {
  if (count < 0) throw SpecError("count must be >= 0, got " + std::to_string(count));
  require_aligned(src, "src");
  require_aligned(dst, "dst");
  require_aligned(scale, "scale", 4);
  if (count == 0) return;
  make_context_current(device);
  KernelSpec spec;
  spec.kind = KernelKind::GradScale;
  spec.dtype = dtype;
  spec.arch = device_info(device).arch();
  spec = spec.normalised();
  const Kernel& kernel = kernel_for(device, spec);
  void* s = const_cast<void*>(src);
  void* d = dst;
  void* sc = const_cast<float*>(scale);
  void* args[] = {&s, &d, &count, &sc};
  // 8 elements a thread; at most a few waves of CTAs, which then stride.
  const int64_t ctas = std::min<int64_t>(ceil_div(ceil_div(count, int64_t{8}), int64_t{256}), int64_t{4096});
  kernel.launch({static_cast<unsigned>(std::max<int64_t>(ctas, 1)), 1, 1}, static_cast<CUstream>(stream), args);
}

}  // namespace lfce::runtime
