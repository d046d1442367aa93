#include "runtime/gemm_launch.h"

#include "runtime/driver.h"
#include "templates/gemm/tile_scheduler.h"

namespace lfce::runtime {
namespace {

// The TMA map the sm_90a pipeline (templates/gemm/wgmma_pipeline.cpp) loads `op` through, in the boxes
// the pipeline's ring is laid out for (tma_box in templates/gemm/tile_scheduler.h); reads past the
// extents zero-fill.
CUtensorMap operand_map(const Operand& op, const TileConfig& tile, Layout layout, int which, DType dtype) {
  const TmaBox box = tma_box(tile, layout, which);
  const bool k_major = layout == Layout::KMajor;
  const cuuint64_t dims[2] = {static_cast<cuuint64_t>(k_major ? op.k : op.mn),
                              static_cast<cuuint64_t>(k_major ? op.mn : op.k)};
  const cuuint64_t strides[1] = {static_cast<cuuint64_t>(op.ld) * static_cast<cuuint64_t>(dtype_bytes(dtype))};
  const cuuint32_t box_dims[2] = {static_cast<cuuint32_t>(box.inner), static_cast<cuuint32_t>(box.outer)};
  const cuuint32_t element_strides[2] = {1, 1};
  CUtensorMap map;
  check(Driver::get().cuTensorMapEncodeTiled(
            &map, dtype == DType::BF16 ? CU_TENSOR_MAP_DATA_TYPE_BFLOAT16 : CU_TENSOR_MAP_DATA_TYPE_FLOAT16, 2,
            const_cast<void*>(op.base), dims, strides, box_dims, element_strides, CU_TENSOR_MAP_INTERLEAVE_NONE,
            CU_TENSOR_MAP_SWIZZLE_128B, CU_TENSOR_MAP_L2_PROMOTION_L2_256B, CU_TENSOR_MAP_FLOAT_OOB_FILL_NONE),
        "cuTensorMapEncodeTiled");
  return map;
}

}  // namespace

// The grid of a GEMM kernel whose output is [rows, cols], as its tile scheduler walks it
// (templates/gemm/tile_scheduler.h), each axis's tile count within CUDA's limits.
Dim3 gemm_grid(const Plan& plan, const KernelSpec& spec, int64_t rows, int64_t cols, const char* kernel) {
  const auto [x, y] = TileScheduler(spec.tile).grid(
      grid_dim(rows, spec.tile.bm, 'x'), grid_dim(cols, spec.tile.bn, 'y'), plan.device_ctas(spec.tile), kernel);
  return {static_cast<unsigned>(x), static_cast<unsigned>(y), 1};
}

// Launches a GEMM kernel with `args`, plus, where it declares them (the wgmma pipeline's, gemm_params
// in templates/gemm/gemm_skeleton.h), the tensor maps of its operands A and B.
void launch_gemm(const Kernel& kernel, const KernelSpec& spec, Dim3 grid, CUstream stream, KernelArgs args,
                 const Operand& a, const Operand& b) {
  if (kernel.declares("tma_a")) {
    const KernelKindInfo& info = kind_info(spec.kind);
    args.set("tma_a", operand_map(a, spec.tile, info.a, 0, spec.dtype));
    args.set("tma_b", operand_map(b, spec.tile, info.b, 1, spec.dtype));
  }
  kernel.launch(grid, stream, args, spec.tile.cluster);
}

}  // namespace lfce::runtime
