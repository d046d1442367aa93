// Forward and backward of one problem: which kernels run, in which order, on which buffers.
// Only enqueues work on the caller's stream; never synchronises with the host.
#pragma once

#include <cstddef>
#include <cstdint>
#include <functional>

#include "runtime/plan.h"

namespace lfce::runtime {

// The buffers of a forward (api/args_from_c.h converts lfce_forward_args into these; the C header
// documents each). bias, class_weight, loss and predicted may be null where the problem does not
// use them.
struct ForwardArgs {
  const void* hidden = nullptr;
  const void* weight = nullptr;
  const void* bias = nullptr;
  const void* targets = nullptr;
  const float* class_weight = nullptr;
  float* lse = nullptr;
  float* token_loss = nullptr;
  float* loss = nullptr;
  float* valid_count = nullptr;
  int64_t* predicted = nullptr;
  void* workspace = nullptr;
  std::size_t workspace_bytes = 0;
  int device = 0;
  void* stream = nullptr;  // a CUstream
};

// The buffers of a backward (from lfce_backward_args). Each gradient may be null: not computed.
struct BackwardArgs {
  const void* hidden = nullptr;
  const void* weight = nullptr;
  const void* bias = nullptr;
  const void* targets = nullptr;
  const float* class_weight = nullptr;
  const float* lse = nullptr;
  const float* valid_count = nullptr;
  const float* grad_loss = nullptr;  // null: 1 (eager mode only)
  const float* grad_lse = nullptr;   // null: none (the problem's lse_grad says the same)
  void* grad_hidden = nullptr;
  void* grad_weight = nullptr;
  void* grad_bias = nullptr;
  void* workspace = nullptr;
  std::size_t workspace_bytes = 0;
  int device = 0;
  void* stream = nullptr;
};

// Eager mode's forward and the gradients for an upstream gradient of 1 (lfce_forward_backward):
// the forward's buffers, its workspace of Plan::eager_layout().bytes, and the gradients, each
// of which may be null (not computed).
struct ForwardBackwardArgs {
  ForwardArgs forward;
  void* grad_hidden = nullptr;
  void* grad_weight = nullptr;
  void* grad_bias = nullptr;
};

// Run `problem` on args.device with the plan `plan_for(problem, device)` returns, asked for
// once the arguments are checked (so a bad argument is named before the driver is touched):
// the api layer's Session gives the stored tuning's plan, the autotuner a candidate's. The
// plan's arch must be the device's.
using PlanFor = std::function<Plan(const Problem& problem, int device)>;
void forward(const Problem& problem, const ForwardArgs& args, const PlanFor& plan_for);
void backward(const Problem& problem, const BackwardArgs& args, const PlanFor& plan_for);
// Eager mode (problem.mode Eager): the three-GEMM schedule where Plan::three_gemm(), else the
// forward and then the recompute backward.
void forward_backward(const Problem& problem, const ForwardBackwardArgs& args, const PlanFor& plan_for);

// Eager mode's backward (lfce_scale_gradient): dst[i] = src[i] · scale[0] (fp32 product rounded once to
// `dtype`), count elements, src and dst 16-byte aligned (they may be the same buffer), scale an fp32
// device value; on `stream` of `device`, no host synchronisation.
void scale_gradient(DType dtype, const void* src, void* dst, int64_t count, const float* scale, int device,
                    void* stream);

}  // namespace lfce::runtime
