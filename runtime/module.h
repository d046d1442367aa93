// One kernel loaded from PTX or a cubin into a device's context, its launch,
// and the driver's PTX -> cubin compilation (whose cubin the disk cache keeps).
#pragma once

#include <cuda.h>

#include <cstdint>
#include <stdexcept>
#include <string>

#include "compiler/errors.h"

namespace lfce::runtime {

struct Dim3 {
  unsigned x = 1, y = 1, z = 1;
};

// CUDA's grid limits (compute capability >= 3.0): 2^31 - 1 CTAs along x, 65535 along y and z.
constexpr int64_t kMaxGridX = (int64_t{1} << 31) - 1;
constexpr int64_t kMaxGridYZ = 65535;

// CTAs along one grid axis ('x', 'y' or 'z') for `extent` items in tiles of `tile`: ceil(extent /
// tile), or OutOfResources naming the numbers over the axis's limit, so that a cast can never wrap
// a grid.
unsigned grid_dim(int64_t extent, int64_t tile, char axis);

// What ptxas allotted, read back with cuFuncGetAttribute.
struct KernelResources {
  int registers = 0;    // per thread
  int local_bytes = 0;  // per thread; > 0 means register spills
  int static_smem = 0;  // bytes per block, excluding dynamic shared memory
  int max_threads = 0;  // per block, given registers and launch bounds
};

class LoadedKernel {
 public:
  // JIT-compiles `ptx` (NUL-terminated PTX text, or a cubin image) in the
  // current context of `device` (its primary context unless the calling
  // thread already has one of that device current) and looks up `entry`.
  // Throws CompileError when the JIT rejects the code or the kernel needs more shared memory than the device has, std::invalid_argument
  // when dynamic_smem_bytes exceeds the device's opt-in limit, CudaError
  // (DriverUnavailable without a driver) for other driver failures.
  LoadedKernel(int device, const std::string& ptx, const std::string& entry,
               unsigned dynamic_smem_bytes);
  // The same from a cubin image (compile_to_cubin's, or the disk cache's):
  // no JIT, just loading. Throws std::invalid_argument if `cubin` is not an
  // ELF image, CompileError if the driver rejects it (another GPU, a newer
  // toolchain than the driver), and as the constructor otherwise.
  static LoadedKernel from_cubin(int device, const std::string& cubin,
                                 const std::string& entry,
                                 unsigned dynamic_smem_bytes);
  ~LoadedKernel();

  LoadedKernel(const LoadedKernel&) = delete;
  LoadedKernel& operator=(const LoadedKernel&) = delete;
  LoadedKernel(LoadedKernel&& other) noexcept;
  LoadedKernel& operator=(LoadedKernel&& other) noexcept;

  // Launches on `stream` with the dynamic shared memory given at load time;
  // params[i] points to the value of kernel argument i. Makes the device's
  // context current on the calling thread first. Throws std::invalid_argument
  // for dimensions the kernel or the hardware cannot take. cluster > 1: the grid runs as
  // thread-block clusters of `cluster` CTAs along x (grid.x a multiple of it).
  void launch(Dim3 grid, Dim3 block, CUstream stream, void** params, unsigned cluster = 1) const;

  const KernelResources& resources() const { return resources_; }
  CUfunction function() const { return function_; }
  int device() const { return device_; }
  const std::string& entry() const { return entry_; }
  unsigned dynamic_smem_bytes() const { return dynamic_smem_bytes_; }

 private:
  void load_module(const std::string& image);
  void read_resources();
  void configure_shared_memory();
  void unload() noexcept;

  int device_;
  std::string entry_;
  unsigned dynamic_smem_bytes_;
  CUmodule module_ = nullptr;
  CUfunction function_ = nullptr;
  KernelResources resources_;
};

// The cubin the driver's JIT makes from `ptx` (PTX text) for `device`, in the
// device's current context as for LoadedKernel, through the JIT linker
// (cuLinkCreate / cuLinkAddData / cuLinkComplete) so that it can be kept on
// disk. `name` names the kernel in errors. Throws CompileError with the JIT's
// error log if the PTX is rejected, CudaError for other driver failures.
std::string compile_to_cubin(int device, const std::string& ptx,
                             const std::string& name);

}  // namespace lfce::runtime
