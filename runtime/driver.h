// CUDA Driver API access without linking libcuda: the library loads and
// generates PTX on machines without a GPU; only launching needs the driver.
#pragma once

#include <cuda.h>  // types and enums only; no symbol of libcuda is linked

#include <cstddef>
#include <stdexcept>
#include <string>

#include "compiler/arch.h"

namespace lfce::runtime {

// A driver call failed. what() names the call, the code's name and number,
// the driver's description and any detail.
class CudaError : public std::runtime_error {
 public:
  CudaError(CUresult code, std::string call, std::string detail = "");

  CUresult code() const { return code_; }
  const std::string& call() const { return call_; }

 protected:
  struct Message {
    std::string text;
  };
  CudaError(CUresult code, std::string call, Message message);

 private:
  CUresult code_;
  std::string call_;
};

// libcuda.so.1 could not be loaded or cuInit failed: this machine cannot
// launch kernels, but code generation still works.
class DriverUnavailable : public CudaError {
 public:
  DriverUnavailable(CUresult code, std::string call, std::string reason);
};

// Entry points resolved through cuGetProcAddress with the CUDA 12.0 ABI; the
// pointer types are the un-suffixed signatures (checked against
// cudaTypedefs.h in driver.cpp when that header exists).
struct Driver {
  // Loads the driver on first use (thread-safe) and returns it; throws
  // DriverUnavailable, the same failure on every call once it has failed.
  // The library path is libcuda.so.1 or $LFCE_LIBCUDA, read at the first call.
  static const Driver& get();
  // The driver if a get() has already succeeded, else nullptr. Never loads,
  // never throws: for error messages and destructors.
  static const Driver* loaded() noexcept;

  CUresult (*cuInit)(unsigned flags) = nullptr;
  CUresult (*cuDriverGetVersion)(int* version) = nullptr;
  CUresult (*cuDeviceGet)(CUdevice* device, int ordinal) = nullptr;
  CUresult (*cuDeviceGetCount)(int* count) = nullptr;
  CUresult (*cuDeviceGetAttribute)(int* value, CUdevice_attribute attribute,
                                   CUdevice device) = nullptr;
  CUresult (*cuDeviceGetName)(char* name, int length,
                              CUdevice device) = nullptr;
  CUresult (*cuDevicePrimaryCtxRetain)(CUcontext* context,
                                       CUdevice device) = nullptr;
  CUresult (*cuCtxGetCurrent)(CUcontext* context) = nullptr;
  CUresult (*cuCtxSetCurrent)(CUcontext context) = nullptr;
  CUresult (*cuCtxGetDevice)(CUdevice* device) = nullptr;
  CUresult (*cuModuleLoadDataEx)(CUmodule* module, const void* image,
                                 unsigned num_options, CUjit_option* options,
                                 void** option_values) = nullptr;
  CUresult (*cuModuleUnload)(CUmodule module) = nullptr;
  CUresult (*cuModuleGetFunction)(CUfunction* function, CUmodule module,
                                  const char* name) = nullptr;
  CUresult (*cuFuncSetAttribute)(CUfunction function,
                                 CUfunction_attribute attribute,
                                 int value) = nullptr;
  CUresult (*cuFuncGetAttribute)(int* value, CUfunction_attribute attribute,
                                 CUfunction function) = nullptr;
  CUresult (*cuLaunchKernel)(CUfunction function, unsigned grid_x,
                             unsigned grid_y, unsigned grid_z, unsigned block_x,
                             unsigned block_y, unsigned block_z,
                             unsigned shared_bytes, CUstream stream,
                             void** params, void** extra) = nullptr;
  CUresult (*cuGetErrorName)(CUresult code, const char** name) = nullptr;
  CUresult (*cuGetErrorString)(CUresult code, const char** text) = nullptr;
  CUresult (*cuMemsetD32Async)(CUdeviceptr destination, unsigned value,
                               size_t count, CUstream stream) = nullptr;
  // The JIT linker, to keep the cubin the driver makes from PTX. cuda.h
  // #defines cuLinkCreate and cuLinkAddData to their _v2 names; the members
  // are renamed with them, consistently, and cuGetProcAddress resolves the
  // un-suffixed names to those _v2 entry points.
  CUresult (*cuLinkCreate)(unsigned num_options, CUjit_option* options,
                           void** option_values, CUlinkState* state) = nullptr;
  CUresult (*cuLinkAddData)(CUlinkState state, CUjitInputType type, void* data,
                            size_t size, const char* name, unsigned num_options,
                            CUjit_option* options,
                            void** option_values) = nullptr;
  CUresult (*cuLinkComplete)(CUlinkState state, void** cubin,
                             size_t* size) = nullptr;
  CUresult (*cuLinkDestroy)(CUlinkState state) = nullptr;
  // Memory, copies and events: the autotuner owns its buffers and times its runs.
  CUresult (*cuMemAlloc)(CUdeviceptr* ptr, size_t bytes) = nullptr;
  CUresult (*cuMemFree)(CUdeviceptr ptr) = nullptr;
  CUresult (*cuMemcpyHtoD)(CUdeviceptr dst, const void* src, size_t bytes) = nullptr;
  CUresult (*cuMemcpyDtoH)(void* dst, CUdeviceptr src, size_t bytes) = nullptr;
  CUresult (*cuEventCreate)(CUevent* event, unsigned flags) = nullptr;
  CUresult (*cuEventRecord)(CUevent event, CUstream stream) = nullptr;
  CUresult (*cuEventSynchronize)(CUevent event) = nullptr;
  CUresult (*cuEventElapsedTime)(float* ms, CUevent start, CUevent end) = nullptr;
  CUresult (*cuEventDestroy)(CUevent event) = nullptr;
  CUresult (*cuCtxSynchronize)() = nullptr;
  // TMA descriptors of the sm_90a pipeline (host-side encoding only).
  CUresult (*cuTensorMapEncodeTiled)(CUtensorMap* map, CUtensorMapDataType type, cuuint32_t rank, void* address,
                                     const cuuint64_t* dims, const cuuint64_t* strides, const cuuint32_t* box,
                                     const cuuint32_t* element_strides, CUtensorMapInterleave interleave,
                                     CUtensorMapSwizzle swizzle, CUtensorMapL2promotion l2,
                                     CUtensorMapFloatOOBfill oob_fill) = nullptr;
  // Launches with attributes: thread-block clusters (the sm_90a pipeline's CTA pairs).
  CUresult (*cuLaunchKernelEx)(const CUlaunchConfig* config, CUfunction function, void** params,
                               void** extra) = nullptr;
};

// cuDriverGetVersion, e.g. 13000 for CUDA 13.0; read once. Throws
// DriverUnavailable without a driver.
int driver_version();

// Throws CudaError naming `call` unless status is CUDA_SUCCESS.
void check(CUresult status, const char* call);

struct DeviceInfo {
  int ordinal = 0;
  int cc_major = 0, cc_minor = 0;
  // The device's own, or less where Options force a smaller GPU (LFCE_DEVICE_SM_COUNT,
  // LFCE_DEVICE_SMEM_LIMIT), read at the first use of the device.
  int sm_count = 0;
  int max_smem_optin = 0;  // bytes per block with the opt-in attribute
  int max_threads_per_block = 0;
  std::string name;
  std::string forced_arch;  // LFCE_DEVICE_ARCH, empty if unset

  // PTX target for this device: "sm_90a" on Hopper (wgmma, TMA, setmaxnreg),
  // "sm_80" (mma.sync path) on every other GPU of compute capability >= 8.0.
  // Throws std::invalid_argument below 8.0.
  Arch arch() const;  // the kernels it runs; throws SpecError before Ampere
};

// Cached per ordinal, thread-safe. Throws std::invalid_argument for an
// ordinal outside [0, cuDeviceGetCount).
const DeviceInfo& device_info(int ordinal);

// Makes a context of device `ordinal` current on the calling thread: keeps the
// current one if it belongs to that device, else sets the device's primary
// context (the one the CUDA runtime, hence PyTorch, uses).
void make_context_current(int ordinal);

}  // namespace lfce::runtime
