// Per-process cache of generated and loaded kernels: a spec is compiled by LLVM once per
// process and loaded once per device. (The on-disk cache is a later layer.)
#pragma once

#include <string>

#include "compiler/kernel_spec.h"
#include "runtime/module.h"

namespace lfce::runtime {

struct Kernel {
  LoadedKernel loaded;
  int threads;  // the CTA size the kernel was generated for

  // Launches with the generated CTA size and shared memory.
  void launch(Dim3 grid, CUstream stream, void** params) const {
    loaded.launch(grid, Dim3{static_cast<unsigned>(threads), 1, 1}, stream, params);
  }
};

// The loaded kernel for `spec` on `device`, generating and loading it on first use.
// Thread-safe; the reference stays valid for the life of the process.
const Kernel& kernel_for(int device, const KernelSpec& spec);

}  // namespace lfce::runtime
