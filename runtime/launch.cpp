#include "runtime/launch.h"

#include <spdlog/spdlog.h>

#include <cstdint>
#include <initializer_list>
#include <string>
#include <vector>

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
// K-major tile (the pipeline's multicast B).
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
// Clustered tiles: whole clusters, each taking groups of `cluster` tiles adjacent along M.
Dim3 gemm_grid(const Plan& plan, const KernelSpec& spec, int64_t rows, int64_t cols, const char* kernel) {
  const Dim3 grid{grid_dim(rows, spec.tile.bm, 'x'), grid_dim(cols, spec.tile.bn, 'y'), 1};
  if (!spec.tile.wgmma()) return grid;
  const int64_t cluster = spec.tile.cluster;
  const int64_t tiles = ceil_div(int64_t{grid.x}, cluster) * cluster * grid.y;
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
    maps[0] = operand_map(a, info.a, spec.dtype, spec.tile.bm, spec.tile.bk);
    maps[1] = operand_map(b, info.b, spec.dtype, spec.tile.bn, spec.tile.bk, spec.tile.cluster);
    params.push_back(&maps[0]);
    params.push_back(&maps[1]);
  }
  kernel.launch(grid, stream, params.data(), spec.tile.cluster);
}

void run_forward(const Problem& problem, const lfce_forward_args& a, const PlanFor& plan_for) {
  require_rows_aligned(problem, a.hidden, "hidden");
  require_rows_aligned(problem, a.weight, "weight");
  if (problem.bias) require(a.bias, "bias");
  require(a.targets, "targets");
  require(a.lse, "lse");
  require(a.token_loss, "token_loss");
  require(a.valid_count, "valid_count");
  if (problem.class_weight) require_aligned(a.class_weight, "class_weight (the problem has has_class_weight = 1)", 4);
  if (problem.reduction != Reduction::None) require(a.loss, "loss");
  if (problem.predicted) require_aligned(a.predicted, "predicted (the problem's outputs has LFCE_OUTPUT_PREDICTED)", 8);
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
  if (problem.bias) require(a.bias, "bias");
  require(a.targets, "targets");
  require(a.lse, "lse");
  require(a.valid_count, "valid_count");
  if (problem.class_weight) require_aligned(a.class_weight, "class_weight (the problem has has_class_weight = 1)", 4);
  if (problem.mode == Mode::Recompute) require(a.grad_loss, "grad_loss (recompute mode needs the upstream gradient)");
  if (a.grad_lse && problem.dtype == DType::FP16)
    throw SpecError("grad_lse (the gradients of the lse rows) needs bf16 or fp32 inputs, got fp16: its dz is not "
                    "scaled into fp16's range");
  if (a.grad_lse) require_aligned(a.grad_lse, "grad_lse", 4);
  if (a.grad_lse && !problem.lse_grad) throw InternalError("grad_lse given for a problem planned without it");
  // Each gradient is optional (a frozen LM head, LoRA): a NULL one's kernel is neither compiled nor launched.
  const bool want_hidden = a.grad_hidden != nullptr;
  const bool want_weight = a.grad_weight != nullptr;
  const bool want_bias = problem.bias && a.grad_bias != nullptr;
  // grad_input writes (and for fp32 accumulates in) grad_hidden one element at a time.
  if (want_hidden) require_aligned(a.grad_hidden, "grad_hidden", dtype_bytes(problem.dtype));
  // Added into as fp32 pairs (grad_weight) or fp32 elements (grad_bias).
  if (want_weight && problem.accumulate_grad_weight) require_aligned(a.grad_weight, "grad_weight (accumulated, fp32)", 8);
  if (want_bias && problem.accumulate_grad_bias) require_aligned(a.grad_bias, "grad_bias (accumulated, fp32)", 4);
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

}  // namespace lfce::runtime
