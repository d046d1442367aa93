// The launch of one GEMM kernel as its tile scheduler and mainloop laid it out: the grid
// (templates/gemm/tile_scheduler.h, within CUDA's limits) and, for the sm_90a pipeline, the TMA
// maps of its operands in the boxes its shared-memory ring holds (tma_box) — the host side of the
// collective, as CUTLASS's to_underlying_arguments builds it for the layout the collective chose.
#pragma once

#include <cstdint>

#include "compiler/kernel_spec.h"
#include "runtime/kernel_args.h"
#include "runtime/kernel_cache.h"
#include "runtime/module.h"
#include "runtime/plan.h"

namespace lfce::runtime {

// One GEMM operand as its template describes it (the GemmOperand in templates/<kind>.cpp): the
// stored matrix at `base`, `ld` elements between its rows, `mn` rows of M (or N) and `k` of K.
struct Operand {
  const void* base;
  int64_t ld, mn, k;
};

// The grid of a GEMM kernel whose output is [rows, cols], as its tile scheduler walks it
// (templates/gemm/tile_scheduler.h), each axis's tile count within CUDA's limits.
Dim3 gemm_grid(const Plan& plan, const KernelSpec& spec, int64_t rows, int64_t cols, const char* kernel);

// Launches a GEMM kernel with `args`, plus, where it declares them (the wgmma pipeline's, gemm_params
// in templates/gemm/gemm_skeleton.h), the tensor maps of its operands A and B.
void launch_gemm(const Kernel& kernel, const KernelSpec& spec, Dim3 grid, CUstream stream, KernelArgs args,
                 const Operand& a, const Operand& b);

}  // namespace lfce::runtime
