#include "runtime/driver.h"

#include <dlfcn.h>

#include <atomic>
#include <cstdlib>
#include <exception>
#include <map>
#include <memory>
#include <mutex>
#include <type_traits>

#include "compiler/errors.h"
#include "runtime/options.h"

#if __has_include(<cudaTypedefs.h>)
#include <cudaTypedefs.h>
#define LFCE_SAME_ABI(member, pfn) \
  static_assert(std::is_same_v<decltype(Driver::member), pfn>, #member)
#else
#define LFCE_SAME_ABI(member, pfn)
#endif

namespace lfce::runtime {

// Our pointer types must be the ABI that cuGetProcAddress hands out for
// kAbiVersion below: the newest version of each symbol up to CUDA 12.0.
LFCE_SAME_ABI(cuInit, PFN_cuInit_v2000);
LFCE_SAME_ABI(cuDriverGetVersion, PFN_cuDriverGetVersion_v2020);
LFCE_SAME_ABI(cuDeviceGet, PFN_cuDeviceGet_v2000);
LFCE_SAME_ABI(cuDeviceGetCount, PFN_cuDeviceGetCount_v2000);
LFCE_SAME_ABI(cuDeviceGetAttribute, PFN_cuDeviceGetAttribute_v2000);
LFCE_SAME_ABI(cuDeviceGetName, PFN_cuDeviceGetName_v2000);
LFCE_SAME_ABI(cuDevicePrimaryCtxRetain, PFN_cuDevicePrimaryCtxRetain_v7000);
LFCE_SAME_ABI(cuCtxGetCurrent, PFN_cuCtxGetCurrent_v4000);
LFCE_SAME_ABI(cuCtxSetCurrent, PFN_cuCtxSetCurrent_v4000);
LFCE_SAME_ABI(cuCtxGetDevice, PFN_cuCtxGetDevice_v2000);
LFCE_SAME_ABI(cuModuleLoadDataEx, PFN_cuModuleLoadDataEx_v2010);
LFCE_SAME_ABI(cuModuleUnload, PFN_cuModuleUnload_v2000);
LFCE_SAME_ABI(cuModuleGetFunction, PFN_cuModuleGetFunction_v2000);
LFCE_SAME_ABI(cuFuncSetAttribute, PFN_cuFuncSetAttribute_v9000);
LFCE_SAME_ABI(cuFuncGetAttribute, PFN_cuFuncGetAttribute_v2020);
LFCE_SAME_ABI(cuLaunchKernel, PFN_cuLaunchKernel_v4000);
LFCE_SAME_ABI(cuGetErrorName, PFN_cuGetErrorName_v6000);
LFCE_SAME_ABI(cuGetErrorString, PFN_cuGetErrorString_v6000);
LFCE_SAME_ABI(cuMemsetD32Async, PFN_cuMemsetD32Async_v3020);
LFCE_SAME_ABI(cuLinkCreate, PFN_cuLinkCreate_v6050);
LFCE_SAME_ABI(cuLinkAddData, PFN_cuLinkAddData_v6050);
LFCE_SAME_ABI(cuLinkComplete, PFN_cuLinkComplete_v5050);
LFCE_SAME_ABI(cuLinkDestroy, PFN_cuLinkDestroy_v5050);
LFCE_SAME_ABI(cuMemAlloc, PFN_cuMemAlloc_v3020);
LFCE_SAME_ABI(cuMemFree, PFN_cuMemFree_v3020);
LFCE_SAME_ABI(cuMemcpyHtoD, PFN_cuMemcpyHtoD_v3020);
LFCE_SAME_ABI(cuMemcpyDtoH, PFN_cuMemcpyDtoH_v3020);
LFCE_SAME_ABI(cuEventCreate, PFN_cuEventCreate_v2000);
LFCE_SAME_ABI(cuEventRecord, PFN_cuEventRecord_v2000);
LFCE_SAME_ABI(cuEventSynchronize, PFN_cuEventSynchronize_v2000);
LFCE_SAME_ABI(cuEventElapsedTime, PFN_cuEventElapsedTime_v2000);
LFCE_SAME_ABI(cuEventDestroy, PFN_cuEventDestroy_v4000);
LFCE_SAME_ABI(cuCtxSynchronize, PFN_cuCtxSynchronize_v2000);
LFCE_SAME_ABI(cuTensorMapEncodeTiled, PFN_cuTensorMapEncodeTiled_v12000);
LFCE_SAME_ABI(cuLaunchKernelEx, PFN_cuLaunchKernelEx_v11060);

namespace {

// CUDA 13 changed cuCtxGetDevice's signature (and renamed other symbols);
// asking for the 12.0 ABI keeps the un-suffixed signatures declared above.
constexpr int kAbiVersion = 12000;

using GetProcAddress = CUresult (*)(const char* symbol, void** function,
                                    int cuda_version, cuuint64_t flags,
                                    CUdriverProcAddressQueryResult* found);

// Names for the codes a caller is likely to meet when cuGetErrorName is not
// available (the driver did not load, or failed while loading).
struct CodeName {
  CUresult code;
  const char* name;
};
#define LFCE_CODE(c) \
  { c, #c }
constexpr CodeName kCodeNames[] = {
    LFCE_CODE(CUDA_SUCCESS),
    LFCE_CODE(CUDA_ERROR_INVALID_VALUE),
    LFCE_CODE(CUDA_ERROR_OUT_OF_MEMORY),
    LFCE_CODE(CUDA_ERROR_NOT_INITIALIZED),
    LFCE_CODE(CUDA_ERROR_DEINITIALIZED),
    LFCE_CODE(CUDA_ERROR_STUB_LIBRARY),
    LFCE_CODE(CUDA_ERROR_DEVICE_UNAVAILABLE),
    LFCE_CODE(CUDA_ERROR_NO_DEVICE),
    LFCE_CODE(CUDA_ERROR_INVALID_DEVICE),
    LFCE_CODE(CUDA_ERROR_INVALID_IMAGE),
    LFCE_CODE(CUDA_ERROR_INVALID_CONTEXT),
    LFCE_CODE(CUDA_ERROR_NO_BINARY_FOR_GPU),
    LFCE_CODE(CUDA_ERROR_INVALID_PTX),
    LFCE_CODE(CUDA_ERROR_JIT_COMPILER_NOT_FOUND),
    LFCE_CODE(CUDA_ERROR_UNSUPPORTED_PTX_VERSION),
    LFCE_CODE(CUDA_ERROR_INVALID_HANDLE),
    LFCE_CODE(CUDA_ERROR_NOT_FOUND),
    LFCE_CODE(CUDA_ERROR_NOT_READY),
    LFCE_CODE(CUDA_ERROR_ILLEGAL_ADDRESS),
    LFCE_CODE(CUDA_ERROR_LAUNCH_OUT_OF_RESOURCES),
    LFCE_CODE(CUDA_ERROR_LAUNCH_TIMEOUT),
    LFCE_CODE(CUDA_ERROR_MISALIGNED_ADDRESS),
    LFCE_CODE(CUDA_ERROR_ILLEGAL_INSTRUCTION),
    LFCE_CODE(CUDA_ERROR_LAUNCH_FAILED),
    LFCE_CODE(CUDA_ERROR_CONTEXT_IS_DESTROYED),
    LFCE_CODE(CUDA_ERROR_NOT_SUPPORTED),
    LFCE_CODE(CUDA_ERROR_SYSTEM_DRIVER_MISMATCH),
    LFCE_CODE(CUDA_ERROR_COMPAT_NOT_SUPPORTED_ON_DEVICE),
    LFCE_CODE(CUDA_ERROR_OPERATING_SYSTEM),
    LFCE_CODE(CUDA_ERROR_UNKNOWN),
};
#undef LFCE_CODE

std::string error_name(CUresult code) {
  const char* name = nullptr;
  if (const Driver* d = Driver::loaded();
      d && d->cuGetErrorName(code, &name) == CUDA_SUCCESS && name) {
    return name;
  }
  for (const CodeName& entry : kCodeNames) {
    if (entry.code == code) return entry.name;
  }
  return "CUDA error";
}

std::string error_string(CUresult code) {
  const char* text = nullptr;
  if (const Driver* d = Driver::loaded();
      d && d->cuGetErrorString(code, &text) == CUDA_SUCCESS && text) {
    return text;
  }
  return "";
}

std::string cuda_error_message(CUresult code, const std::string& call,
                               const std::string& detail) {
  std::string text = call + " failed: " + error_name(code) + " (" +
                     std::to_string(static_cast<int>(code)) + ")";
  if (std::string description = error_string(code); !description.empty()) {
    text += ": " + description;
  }
  if (!detail.empty()) text += "; " + detail;
  return text;
}

template <typename Fn>
void resolve(GetProcAddress get_proc, const char* symbol, Fn& function) {
  void* address = nullptr;
  CUdriverProcAddressQueryResult found = CU_GET_PROC_ADDRESS_SYMBOL_NOT_FOUND;
  const CUresult status = get_proc(symbol, &address, kAbiVersion,
                                   CU_GET_PROC_ADDRESS_DEFAULT, &found);
  if (status != CUDA_SUCCESS) {
    // The toolkit's stub libcuda answers CUDA_ERROR_STUB_LIBRARY here.
    throw DriverUnavailable(status,
                            std::string("cuGetProcAddress(") + symbol + ")",
                            error_name(status) + " (" +
                                std::to_string(static_cast<int>(status)) + ")");
  }
  if (found != CU_GET_PROC_ADDRESS_SUCCESS || !address) {
    throw DriverUnavailable(CUDA_ERROR_NOT_FOUND,
                            std::string("cuGetProcAddress(") + symbol + ")",
                            found == CU_GET_PROC_ADDRESS_VERSION_NOT_SUFFICIENT
                                ? "the driver is older than CUDA 12.0"
                                : "the driver has no such entry point");
  }
  function = reinterpret_cast<Fn>(address);
}

// Runs once per process. Never dlclose'd and never freed: modules destroyed
// during static destruction may still call cuModuleUnload through it.
const Driver* load() {
  const std::string path = Options::current().libcuda;
  void* library = dlopen(path.c_str(), RTLD_NOW | RTLD_LOCAL);
  if (!library) {
    const char* reason = dlerror();
    throw DriverUnavailable(CUDA_ERROR_NOT_INITIALIZED, "dlopen(" + path + ")",
                            reason ? reason : "unknown dlopen error");
  }
  // cuGetProcAddress_v2 exists since CUDA 12.0; plain dlsym of the other
  // names would return their oldest ABI.
  auto get_proc =
      reinterpret_cast<GetProcAddress>(dlsym(library, "cuGetProcAddress_v2"));
  if (!get_proc) {
    throw DriverUnavailable(CUDA_ERROR_NOT_FOUND, "dlsym(cuGetProcAddress_v2)",
                            path + " is older than CUDA 12.0");
  }
  auto d = std::make_unique<Driver>();
  resolve(get_proc, "cuInit", d->cuInit);
  resolve(get_proc, "cuDriverGetVersion", d->cuDriverGetVersion);
  resolve(get_proc, "cuDeviceGet", d->cuDeviceGet);
  resolve(get_proc, "cuDeviceGetCount", d->cuDeviceGetCount);
  resolve(get_proc, "cuDeviceGetAttribute", d->cuDeviceGetAttribute);
  resolve(get_proc, "cuDeviceGetName", d->cuDeviceGetName);
  resolve(get_proc, "cuDevicePrimaryCtxRetain", d->cuDevicePrimaryCtxRetain);
  resolve(get_proc, "cuCtxGetCurrent", d->cuCtxGetCurrent);
  resolve(get_proc, "cuCtxSetCurrent", d->cuCtxSetCurrent);
  resolve(get_proc, "cuCtxGetDevice", d->cuCtxGetDevice);
  resolve(get_proc, "cuModuleLoadDataEx", d->cuModuleLoadDataEx);
  resolve(get_proc, "cuModuleUnload", d->cuModuleUnload);
  resolve(get_proc, "cuModuleGetFunction", d->cuModuleGetFunction);
  resolve(get_proc, "cuFuncSetAttribute", d->cuFuncSetAttribute);
  resolve(get_proc, "cuFuncGetAttribute", d->cuFuncGetAttribute);
  resolve(get_proc, "cuLaunchKernel", d->cuLaunchKernel);
  resolve(get_proc, "cuGetErrorName", d->cuGetErrorName);
  resolve(get_proc, "cuGetErrorString", d->cuGetErrorString);
  resolve(get_proc, "cuMemsetD32Async", d->cuMemsetD32Async);
  resolve(get_proc, "cuLinkCreate", d->cuLinkCreate);
  resolve(get_proc, "cuLinkAddData", d->cuLinkAddData);
  resolve(get_proc, "cuLinkComplete", d->cuLinkComplete);
  resolve(get_proc, "cuLinkDestroy", d->cuLinkDestroy);
  resolve(get_proc, "cuMemAlloc", d->cuMemAlloc);
  resolve(get_proc, "cuMemFree", d->cuMemFree);
  resolve(get_proc, "cuMemcpyHtoD", d->cuMemcpyHtoD);
  resolve(get_proc, "cuMemcpyDtoH", d->cuMemcpyDtoH);
  resolve(get_proc, "cuEventCreate", d->cuEventCreate);
  resolve(get_proc, "cuEventRecord", d->cuEventRecord);
  resolve(get_proc, "cuEventSynchronize", d->cuEventSynchronize);
  resolve(get_proc, "cuEventElapsedTime", d->cuEventElapsedTime);
  resolve(get_proc, "cuEventDestroy", d->cuEventDestroy);
  resolve(get_proc, "cuCtxSynchronize", d->cuCtxSynchronize);
  resolve(get_proc, "cuTensorMapEncodeTiled", d->cuTensorMapEncodeTiled);
  resolve(get_proc, "cuLaunchKernelEx", d->cuLaunchKernelEx);

  // cuInit fails with CUDA_ERROR_NO_DEVICE on a machine with a driver but no
  // GPU, and with CUDA_ERROR_STUB_LIBRARY if the toolkit stub was found.
  if (const CUresult status = d->cuInit(0); status != CUDA_SUCCESS) {
    const char* name = "CUDA error";
    const char* text = "";
    d->cuGetErrorName(status, &name);
    d->cuGetErrorString(status, &text);
    throw DriverUnavailable(status, "cuInit",
                            std::string(name ? name : "CUDA error") + " (" +
                                std::to_string(static_cast<int>(status)) +
                                "): " + (text ? text : ""));
  }
  return d.release();
}

std::once_flag g_load_once;
std::atomic<const Driver*> g_driver{nullptr};
std::exception_ptr g_load_failure;  // written once inside call_once

// Per-device state, created on first use of an ordinal.
struct DeviceState {
  DeviceInfo info;
  CUdevice handle = 0;
  // Retained once and never released: PyTorch keeps the primary context for
  // the life of the process, and releasing it would unload our modules.
  CUcontext primary = nullptr;
};

struct DeviceRegistry {
  std::mutex mutex;
  std::map<int, DeviceState> devices;  // node-based: references stay valid
};

// Leaked so that destructors running at exit can still use it.
DeviceRegistry& registry() {
  static DeviceRegistry* instance = new DeviceRegistry;
  return *instance;
}

struct AttributeField {
  int DeviceInfo::*field;
  CUdevice_attribute attribute;
};
constexpr AttributeField kDeviceAttributes[] = {
    {&DeviceInfo::cc_major, CU_DEVICE_ATTRIBUTE_COMPUTE_CAPABILITY_MAJOR},
    {&DeviceInfo::cc_minor, CU_DEVICE_ATTRIBUTE_COMPUTE_CAPABILITY_MINOR},
    {&DeviceInfo::sm_count, CU_DEVICE_ATTRIBUTE_MULTIPROCESSOR_COUNT},
    {&DeviceInfo::max_smem_optin,
     CU_DEVICE_ATTRIBUTE_MAX_SHARED_MEMORY_PER_BLOCK_OPTIN},
    {&DeviceInfo::max_threads_per_block,
     CU_DEVICE_ATTRIBUTE_MAX_THREADS_PER_BLOCK},
};

// Caller holds registry().mutex.
DeviceState& device_state(const Driver& d, int ordinal) {
  auto& devices = registry().devices;
  if (auto it = devices.find(ordinal); it != devices.end()) return it->second;

  int count = 0;
  check(d.cuDeviceGetCount(&count), "cuDeviceGetCount");
  if (ordinal < 0 || ordinal >= count) {
    throw std::invalid_argument("CUDA device ordinal " +
                                std::to_string(ordinal) +
                                " is out of range: the driver reports " +
                                std::to_string(count) + " device(s)");
  }
  DeviceState state;
  state.info.ordinal = ordinal;
  check(d.cuDeviceGet(&state.handle, ordinal), "cuDeviceGet");
  for (const AttributeField& a : kDeviceAttributes) {
    check(d.cuDeviceGetAttribute(&(state.info.*a.field), a.attribute,
                                 state.handle),
          "cuDeviceGetAttribute");
  }
  char name[256] = {};
  check(d.cuDeviceGetName(name, sizeof(name) - 1, state.handle),
        "cuDeviceGetName");
  state.info.name = name;
  // Forced limits (Options: a smaller GPU, for tests): tiles, grids and the loader's shared-
  // memory check then all see the smaller device.
  const Options options = Options::current();
  if (options.device_smem_limit > 0 && options.device_smem_limit < state.info.max_smem_optin)
    state.info.max_smem_optin = static_cast<int>(options.device_smem_limit);
  if (options.device_sm_count > 0 && options.device_sm_count < state.info.sm_count)
    state.info.sm_count = static_cast<int>(options.device_sm_count);
  state.info.forced_arch = options.device_arch;
  return devices.emplace(ordinal, std::move(state)).first->second;
}

}  // namespace

CudaError::CudaError(CUresult code, std::string call, std::string detail)
    : CudaError(code, call, Message{cuda_error_message(code, call, detail)}) {}

CudaError::CudaError(CUresult code, std::string call, Message message)
    : std::runtime_error(message.text), code_(code), call_(std::move(call)) {}

DriverUnavailable::DriverUnavailable(CUresult code, std::string call,
                                     std::string reason)
    : CudaError(code, call,
                Message{"no usable NVIDIA driver/GPU: " + call +
                        " failed: " + reason +
                        ". lfce can still generate kernels (PTX) but cannot "
                        "launch them on this machine."}) {}

const Driver& Driver::get() {
  std::call_once(g_load_once, [] {
    try {
      g_driver.store(load(), std::memory_order_release);
    } catch (...) {
      g_load_failure = std::current_exception();
    }
  });
  if (const Driver* d = g_driver.load(std::memory_order_acquire)) return *d;
  std::rethrow_exception(g_load_failure);
}

const Driver* Driver::loaded() noexcept {
  return g_driver.load(std::memory_order_acquire);
}

void check(CUresult status, const char* call) {
  if (status != CUDA_SUCCESS) throw CudaError(status, call);
}

int driver_version() {
  static const int version = [] {
    int v = 0;
    check(Driver::get().cuDriverGetVersion(&v), "cuDriverGetVersion");
    return v;
  }();
  return version;
}

Arch DeviceInfo::arch() const {
  try {
    const Arch own = arch_for_compute_capability(cc_major, cc_minor);  // the one table: compiler/arch.cpp
    if (forced_arch.empty()) return own;
    const Arch forced = parse_arch(forced_arch);
    if (forced != Arch::SM80 && forced != own)
      throw SpecError("LFCE_DEVICE_ARCH = " + forced_arch + " cannot run on a device whose own target is " +
                      std::string(arch_name(own)) + " (only sm_80, the portable path, can be forced)");
    return forced;
  } catch (const SpecError& e) {
    throw SpecError("CUDA device " + std::to_string(ordinal) + " (" + name + "): " + e.what());
  }
}

const DeviceInfo& device_info(int ordinal) {
  const Driver& d = Driver::get();
  std::lock_guard<std::mutex> lock(registry().mutex);
  return device_state(d, ordinal).info;
}

void make_context_current(int ordinal) {
  const Driver& d = Driver::get();
  CUdevice handle = 0;
  {
    std::lock_guard<std::mutex> lock(registry().mutex);
    handle = device_state(d, ordinal).handle;
  }
  CUcontext current = nullptr;
  check(d.cuCtxGetCurrent(&current), "cuCtxGetCurrent");
  CUdevice current_device = -1;
  // A destroyed current context fails cuCtxGetDevice: replace it as well.
  if (current && d.cuCtxGetDevice(&current_device) == CUDA_SUCCESS &&
      current_device == handle) {
    return;
  }
  CUcontext primary = nullptr;
  {
    std::lock_guard<std::mutex> lock(registry().mutex);
    DeviceState& state = device_state(d, ordinal);
    if (!state.primary) {
      check(d.cuDevicePrimaryCtxRetain(&state.primary, handle),
            "cuDevicePrimaryCtxRetain");
    }
    primary = state.primary;
  }
  check(d.cuCtxSetCurrent(primary), "cuCtxSetCurrent");
}

}  // namespace lfce::runtime
