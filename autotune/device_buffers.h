// Device memory, copies and events for the autotuner, which (unlike the library's launch
// path) owns its buffers and times its runs, through runtime::Driver's entry points.
#pragma once

#include <cuda.h>

#include <cstddef>

namespace lfce::autotune {

// cuMemAlloc'd memory in the current context, freed on destruction.
class DeviceBuffer {
 public:
  DeviceBuffer() = default;
  explicit DeviceBuffer(size_t bytes);
  ~DeviceBuffer();
  DeviceBuffer(DeviceBuffer&& other) noexcept;
  DeviceBuffer& operator=(DeviceBuffer&& other) noexcept;
  DeviceBuffer(const DeviceBuffer&) = delete;
  DeviceBuffer& operator=(const DeviceBuffer&) = delete;

  void* get() const { return reinterpret_cast<void*>(ptr_); }
  CUdeviceptr ptr() const { return ptr_; }
  size_t bytes() const { return bytes_; }
  void upload(const void* host, size_t bytes);          // synchronous
  void download(void* host, size_t bytes) const;        // synchronous

 private:
  CUdeviceptr ptr_ = 0;
  size_t bytes_ = 0;
};

// Elapsed GPU time between two events recorded on one stream.
class EventTimer {
 public:
  EventTimer();
  ~EventTimer();
  EventTimer(const EventTimer&) = delete;
  EventTimer& operator=(const EventTimer&) = delete;

  void start(CUstream stream);
  // Records the end, waits for it and returns the milliseconds since start().
  double stop(CUstream stream);

 private:
  CUevent start_ = nullptr, end_ = nullptr;
};

// Waits for all work of the current context; throws CudaError with the first failure.
void synchronize();

}  // namespace lfce::autotune
