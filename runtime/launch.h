// Forward and backward of one problem: which kernels run, in which order, on which buffers.
// Only enqueues work on the caller's stream; never synchronises with the host.
#pragma once

#include <cstdint>
#include <functional>

#include "lfce/lfce.h"
#include "runtime/plan.h"

namespace lfce::runtime {

// Run `problem` on args.device with the plan `plan_for(problem, device)` returns, asked for
// once the arguments are checked (so a bad argument is named before the driver is touched):
// the api layer's Session gives the stored tuning's plan, the autotuner a candidate's. The
// plan's arch must be the device's.
using PlanFor = std::function<Plan(const Problem& problem, int device)>;
void forward(const Problem& problem, const lfce_forward_args& args, const PlanFor& plan_for);
void backward(const Problem& problem, const lfce_backward_args& args, const PlanFor& plan_for);
// Eager mode (problem.mode Eager): the forward's outputs in `args` and the gradients of the loss
// for an upstream gradient of 1 (each of grad_* may be NULL: not computed), with args.workspace
// of Plan::eager_layout().bytes. The three-GEMM schedule where Plan::three_gemm(), else the
// forward and then the recompute backward.
void forward_backward(const Problem& problem, const lfce_forward_args& args, void* grad_hidden, void* grad_weight,
                      void* grad_bias, const PlanFor& plan_for);

// Eager mode's backward (lfce_scale_gradient): dst[i] = src[i] · scale[0] (fp32 product rounded once to
// `dtype`), count elements, src and dst 16-byte aligned (they may be the same buffer), scale an fp32
// device value; on `stream` of `device`, no host synchronisation.
void scale_gradient(DType dtype, const void* src, void* dst, int64_t count, const float* scale, int device,
                    void* stream);

// CTAs along one grid axis ('x', 'y' or 'z') for `extent` items in tiles of `tile`: ceil(extent /
// tile), or SpecError naming the numbers when CUDA's limit (2^31 - 1 along x, 65535 along y and
// z) is exceeded, so that a cast can never wrap a grid.
constexpr int64_t kMaxGridX = (int64_t{1} << 31) - 1;
constexpr int64_t kMaxGridYZ = 65535;
unsigned grid_dim(int64_t extent, int64_t tile, char axis);

}  // namespace lfce::runtime
