// Forward and backward of one problem: which kernels run, in which order, on which buffers.
// Only enqueues work on the caller's stream; never synchronises with the host.
#pragma once

#include <cstdint>

#include "lfce/lfce.h"
#include "runtime/plan.h"

namespace lfce::runtime {

// Run with the persisted (or default) tuning for the problem: lookup_tuning().
void forward(const Problem& problem, const lfce_forward_args& args);
void backward(const Problem& problem, const lfce_backward_args& args);
// Run with an explicit tuning, as the autotuner does to measure one candidate.
void forward(const Problem& problem, const lfce_forward_args& args, const Tuning& tuning);
void backward(const Problem& problem, const lfce_backward_args& args, const Tuning& tuning);

// CTAs along one grid axis ('x', 'y' or 'z') for `extent` items in tiles of `tile`: ceil(extent /
// tile), or SpecError naming the numbers when CUDA's limit (2^31 - 1 along x, 65535 along y and
// z) is exceeded, so that a cast can never wrap a grid.
constexpr int64_t kMaxGridX = (int64_t{1} << 31) - 1;
constexpr int64_t kMaxGridYZ = 65535;
unsigned grid_dim(int64_t extent, int64_t tile, char axis);

// The plan for `problem` on `device` (its arch decides the kernels).
Plan plan_for_device(const Problem& problem, int device);

}  // namespace lfce::runtime
