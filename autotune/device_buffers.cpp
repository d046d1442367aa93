#include "autotune/device_buffers.h"

#include <dlfcn.h>

#include <mutex>
#include <stdexcept>
#include <string>
#include <type_traits>
#include <utility>

#include "runtime/driver.h"

#if __has_include(<cudaTypedefs.h>)
#include <cudaTypedefs.h>
#define LFCE_SAME_ABI(member, pfn) static_assert(std::is_same_v<decltype(DeviceApi::member), pfn>, #member)
#else
#define LFCE_SAME_ABI(member, pfn)
#endif

namespace lfce::autotune {

// The ABI cuGetProcAddress hands out for CUDA 12.0 (as runtime/driver.cpp asks for).
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

namespace {

using runtime::check;
using runtime::CudaError;

constexpr int kAbiVersion = 12000;

using GetProcAddress = CUresult (*)(const char* symbol, void** function, int cuda_version, cuuint64_t flags,
                                    CUdriverProcAddressQueryResult* found);

template <typename Fn>
void resolve(GetProcAddress get_proc, const char* symbol, Fn& function) {
  void* address = nullptr;
  CUdriverProcAddressQueryResult found = CU_GET_PROC_ADDRESS_SYMBOL_NOT_FOUND;
  CUresult status = get_proc(symbol, &address, kAbiVersion, CU_GET_PROC_ADDRESS_DEFAULT, &found);
  if (status == CUDA_SUCCESS && (found != CU_GET_PROC_ADDRESS_SUCCESS || !address)) status = CUDA_ERROR_NOT_FOUND;
  check(status, (std::string("cuGetProcAddress(") + symbol + ")").c_str());
  function = reinterpret_cast<Fn>(address);
}

const DeviceApi* load() {
  const runtime::Driver& driver = runtime::Driver::get();
  // The library runtime::Driver loaded (whatever path it came from) is the one that holds
  // cuInit: find it by address and reopen it without loading anything new.
  Dl_info info{};
  if (!dladdr(reinterpret_cast<void*>(driver.cuInit), &info) || !info.dli_fname)
    throw CudaError(CUDA_ERROR_NOT_FOUND, "dladdr(cuInit)", "cannot find the loaded libcuda");
  void* library = dlopen(info.dli_fname, RTLD_NOW | RTLD_NOLOAD);
  auto get_proc = library ? reinterpret_cast<GetProcAddress>(dlsym(library, "cuGetProcAddress_v2")) : nullptr;
  if (!get_proc)
    throw CudaError(CUDA_ERROR_NOT_FOUND, "dlsym(cuGetProcAddress_v2)", std::string("in ") + info.dli_fname);
  auto* api = new DeviceApi;  // never freed, as the Driver: destructors at exit may use it
  resolve(get_proc, "cuMemAlloc", api->cuMemAlloc);
  resolve(get_proc, "cuMemFree", api->cuMemFree);
  resolve(get_proc, "cuMemcpyHtoD", api->cuMemcpyHtoD);
  resolve(get_proc, "cuMemcpyDtoH", api->cuMemcpyDtoH);
  resolve(get_proc, "cuEventCreate", api->cuEventCreate);
  resolve(get_proc, "cuEventRecord", api->cuEventRecord);
  resolve(get_proc, "cuEventSynchronize", api->cuEventSynchronize);
  resolve(get_proc, "cuEventElapsedTime", api->cuEventElapsedTime);
  resolve(get_proc, "cuEventDestroy", api->cuEventDestroy);
  resolve(get_proc, "cuCtxSynchronize", api->cuCtxSynchronize);
  return api;
}

}  // namespace

const DeviceApi& DeviceApi::get() {
  static std::once_flag once;
  static const DeviceApi* api = nullptr;
  std::call_once(once, [] { api = load(); });  // a throw leaves the flag unset: retried
  return *api;
}

DeviceBuffer::DeviceBuffer(size_t bytes) : bytes_(bytes) {
  if (bytes > 0) check(DeviceApi::get().cuMemAlloc(&ptr_, bytes), "cuMemAlloc");
}

DeviceBuffer::~DeviceBuffer() {
  if (ptr_) DeviceApi::get().cuMemFree(ptr_);  // a failure here has nobody to report to
}

DeviceBuffer::DeviceBuffer(DeviceBuffer&& other) noexcept
    : ptr_(std::exchange(other.ptr_, 0)), bytes_(std::exchange(other.bytes_, 0)) {}

DeviceBuffer& DeviceBuffer::operator=(DeviceBuffer&& other) noexcept {
  if (this != &other) {
    if (ptr_) DeviceApi::get().cuMemFree(ptr_);
    ptr_ = std::exchange(other.ptr_, 0);
    bytes_ = std::exchange(other.bytes_, 0);
  }
  return *this;
}

void DeviceBuffer::upload(const void* host, size_t bytes) {
  if (bytes > bytes_) throw std::invalid_argument("DeviceBuffer::upload: " + std::to_string(bytes) + " bytes > size");
  if (bytes) check(DeviceApi::get().cuMemcpyHtoD(ptr_, host, bytes), "cuMemcpyHtoD");
}

void DeviceBuffer::download(void* host, size_t bytes) const {
  if (bytes > bytes_) throw std::invalid_argument("DeviceBuffer::download: " + std::to_string(bytes) + " bytes > size");
  if (bytes) check(DeviceApi::get().cuMemcpyDtoH(host, ptr_, bytes), "cuMemcpyDtoH");
}

EventTimer::EventTimer() {
  const DeviceApi& api = DeviceApi::get();
  check(api.cuEventCreate(&start_, CU_EVENT_DEFAULT), "cuEventCreate");
  if (CUresult status = api.cuEventCreate(&end_, CU_EVENT_DEFAULT); status != CUDA_SUCCESS) {
    api.cuEventDestroy(start_);
    check(status, "cuEventCreate");
  }
}

EventTimer::~EventTimer() {
  const DeviceApi& api = DeviceApi::get();
  api.cuEventDestroy(start_);
  api.cuEventDestroy(end_);
}

void EventTimer::start(CUstream stream) { check(DeviceApi::get().cuEventRecord(start_, stream), "cuEventRecord"); }

double EventTimer::stop(CUstream stream) {
  const DeviceApi& api = DeviceApi::get();
  check(api.cuEventRecord(end_, stream), "cuEventRecord");
  check(api.cuEventSynchronize(end_), "cuEventSynchronize");
  float ms = 0;
  check(api.cuEventElapsedTime(&ms, start_, end_), "cuEventElapsedTime");
  return ms;
}

void synchronize() { check(DeviceApi::get().cuCtxSynchronize(), "cuCtxSynchronize"); }

}  // namespace lfce::autotune
