// The checks of a call's arguments, each naming what is wrong, made before anything is planned,
// compiled or launched: NULL and misaligned pointers (each for the width its kernels access it
// with), a workspace below the problem's, the options a buffer excludes.
#pragma once

#include <cstddef>
#include <cstdint>

#include "runtime/launch.h"

namespace lfce::runtime {

void check_forward_args(const Problem& problem, const ForwardArgs& args);
void check_backward_args(const Problem& problem, const BackwardArgs& args);
// The forward's, the gradients' and (its size does not depend on the device) the workspace's.
void check_forward_backward_args(const Problem& problem, const ForwardBackwardArgs& args);
void check_scale_gradient_args(const void* src, const void* dst, int64_t count, const float* scale);

// `given` workspace bytes at `workspace` for a call (named in the message) that needs `needed`.
void require_workspace(void* workspace, std::size_t given, std::size_t needed, const char* call);

// The bytes of one target id (the problem's index type).
int target_bytes(const Problem& problem);

}  // namespace lfce::runtime
