#include "autotune/device_buffers.h"

#include <stdexcept>
#include <string>
#include <utility>

#include "runtime/driver.h"

namespace lfce::autotune {
namespace {

using runtime::check;

// The one driver entry-point table (runtime/driver.h); throws DriverUnavailable without one.
const runtime::Driver& api() { return runtime::Driver::get(); }

}  // namespace

DeviceBuffer::DeviceBuffer(size_t bytes) : bytes_(bytes) {
  if (bytes > 0) check(api().cuMemAlloc(&ptr_, bytes), "cuMemAlloc");
}

DeviceBuffer::~DeviceBuffer() {
  if (ptr_) api().cuMemFree(ptr_);  // a failure here has nobody to report to
}

DeviceBuffer::DeviceBuffer(DeviceBuffer&& other) noexcept
    : ptr_(std::exchange(other.ptr_, 0)), bytes_(std::exchange(other.bytes_, 0)) {}

DeviceBuffer& DeviceBuffer::operator=(DeviceBuffer&& other) noexcept {
  if (this != &other) {
    if (ptr_) api().cuMemFree(ptr_);
    ptr_ = std::exchange(other.ptr_, 0);
    bytes_ = std::exchange(other.bytes_, 0);
  }
  return *this;
}

void DeviceBuffer::upload(const void* host, size_t bytes) {
  if (bytes > bytes_) throw std::invalid_argument("DeviceBuffer::upload: " + std::to_string(bytes) + " bytes > size");
  if (bytes) check(api().cuMemcpyHtoD(ptr_, host, bytes), "cuMemcpyHtoD");
}

void DeviceBuffer::download(void* host, size_t bytes) const {
  if (bytes > bytes_) throw std::invalid_argument("DeviceBuffer::download: " + std::to_string(bytes) + " bytes > size");
  if (bytes) check(api().cuMemcpyDtoH(host, ptr_, bytes), "cuMemcpyDtoH");
}

EventTimer::EventTimer() {
  const runtime::Driver& driver = api();
  check(driver.cuEventCreate(&start_, CU_EVENT_DEFAULT), "cuEventCreate");
  if (CUresult status = driver.cuEventCreate(&end_, CU_EVENT_DEFAULT); status != CUDA_SUCCESS) {
    driver.cuEventDestroy(start_);
    check(status, "cuEventCreate");
  }
}

EventTimer::~EventTimer() {
  const runtime::Driver& driver = api();
  driver.cuEventDestroy(start_);
  driver.cuEventDestroy(end_);
}

void EventTimer::start(CUstream stream) { check(api().cuEventRecord(start_, stream), "cuEventRecord"); }

double EventTimer::stop(CUstream stream) {
  const runtime::Driver& driver = api();
  check(driver.cuEventRecord(end_, stream), "cuEventRecord");
  check(driver.cuEventSynchronize(end_), "cuEventSynchronize");
  float ms = 0;
  check(driver.cuEventElapsedTime(&ms, start_, end_), "cuEventElapsedTime");
  return ms;
}

void synchronize() { check(api().cuCtxSynchronize(), "cuCtxSynchronize"); }

}  // namespace lfce::autotune
