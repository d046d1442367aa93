#include "runtime/module.h"

#include <spdlog/fmt/fmt.h>
#include <spdlog/spdlog.h>

#include <cstdint>
#include <cstring>
#include <iterator>
#include <utility>

#include "runtime/driver.h"

namespace lfce::runtime {
namespace {

// Static plus dynamic shared memory a block may use without opting in with
// CU_FUNC_ATTRIBUTE_MAX_DYNAMIC_SHARED_SIZE_BYTES (every GPU since Volta).
constexpr unsigned kSharedMemoryWithoutOptIn = 48 * 1024;

// Hardware launch limits of compute capability >= 3.0.
constexpr unsigned kMaxGridX = 0x7fffffffu;
constexpr unsigned kMaxGridYZ = 65535;
constexpr unsigned kMaxBlockZ = 64;

constexpr std::size_t kJitLogBytes = 16 * 1024;

// Statuses of cuModuleLoadDataEx that mean the code was rejected rather than
// the driver failing (out of memory, no context, ...).
constexpr CUresult kCompileFailures[] = {
    CUDA_ERROR_INVALID_PTX,
    CUDA_ERROR_UNSUPPORTED_PTX_VERSION,
    CUDA_ERROR_INVALID_IMAGE,
    CUDA_ERROR_NO_BINARY_FOR_GPU,
    CUDA_ERROR_JIT_COMPILER_NOT_FOUND,
    CUDA_ERROR_JIT_COMPILATION_DISABLED,
    CUDA_ERROR_INVALID_SOURCE,
};

bool is_compile_failure(CUresult status) {
  for (CUresult code : kCompileFailures) {
    if (code == status) return true;
  }
  return false;
}

std::string log_text(const std::string& buffer) {
  return std::string(buffer.c_str(), strnlen(buffer.c_str(), buffer.size()));
}

std::string str(Dim3 d) { return fmt::format("({}, {}, {})", d.x, d.y, d.z); }

}  // namespace

CompileError::CompileError(const std::string& message, std::string log)
    : lfce::CompileError(log.empty() ? message : message + "\n" + log),
      log_(std::move(log)) {}

LoadedKernel::LoadedKernel(int device, const std::string& ptx,
                           const std::string& entry,
                           unsigned dynamic_smem_bytes)
    : device_(device), entry_(entry), dynamic_smem_bytes_(dynamic_smem_bytes) {
  make_context_current(device_);
  configure_shared_memory();  // rejects an impossible request before the JIT
  load_module(ptx);
  try {
    check(
        Driver::get().cuModuleGetFunction(&function_, module_, entry_.c_str()),
        ("cuModuleGetFunction(" + entry_ + ")").c_str());
    read_resources();
    configure_shared_memory();
  } catch (...) {
    unload();
    throw;
  }
  spdlog::debug(
      "lfce: loaded {} on device {}: {} registers, {} bytes local, {} bytes "
      "static + {} bytes dynamic shared memory, at most {} threads per block",
      entry_, device_, resources_.registers, resources_.local_bytes,
      resources_.static_smem, dynamic_smem_bytes_, resources_.max_threads);
  if (resources_.local_bytes > 0) {
    spdlog::warn(
        "lfce: kernel {} spills: {} bytes of local memory per thread with {} "
        "registers",
        entry_, resources_.local_bytes, resources_.registers);
  }
}

void LoadedKernel::load_module(const std::string& ptx) {
  const Driver& d = Driver::get();
  std::string error_log(kJitLogBytes, '\0');
  std::string info_log(kJitLogBytes, '\0');
  // Buffer sizes and the verbose flag are passed by value in the pointer.
  CUjit_option options[] = {
      CU_JIT_ERROR_LOG_BUFFER, CU_JIT_ERROR_LOG_BUFFER_SIZE_BYTES,
      CU_JIT_INFO_LOG_BUFFER,  CU_JIT_INFO_LOG_BUFFER_SIZE_BYTES,
      CU_JIT_LOG_VERBOSE,
  };
  void* values[] = {
      error_log.data(),
      reinterpret_cast<void*>(std::uintptr_t{kJitLogBytes}),
      info_log.data(),
      reinterpret_cast<void*>(std::uintptr_t{kJitLogBytes}),
      reinterpret_cast<void*>(std::uintptr_t{1}),
  };
  const CUresult status = d.cuModuleLoadDataEx(
      &module_, ptx.c_str(), std::size(options), options, values);
  const std::string errors = log_text(error_log);
  if (status != CUDA_SUCCESS) {
    module_ = nullptr;
    if (is_compile_failure(status) || !errors.empty()) {
      const CudaError cause(status, "cuModuleLoadDataEx");
      throw CompileError("driver JIT failed to compile kernel '" + entry_ +
                             "' for CUDA device " + std::to_string(device_) +
                             ": " + cause.what(),
                         errors);
    }
    throw CudaError(status, "cuModuleLoadDataEx", "loading kernel " + entry_);
  }
  if (const std::string info = log_text(info_log); !info.empty()) {
    spdlog::debug("lfce: driver JIT log for {}:\n{}", entry_, info);
  }
}

void LoadedKernel::read_resources() {
  const Driver& d = Driver::get();
  struct Field {
    int KernelResources::*field;
    CUfunction_attribute attribute;
  };
  static constexpr Field kFields[] = {
      {&KernelResources::registers, CU_FUNC_ATTRIBUTE_NUM_REGS},
      {&KernelResources::local_bytes, CU_FUNC_ATTRIBUTE_LOCAL_SIZE_BYTES},
      {&KernelResources::static_smem, CU_FUNC_ATTRIBUTE_SHARED_SIZE_BYTES},
      {&KernelResources::max_threads, CU_FUNC_ATTRIBUTE_MAX_THREADS_PER_BLOCK},
  };
  for (const Field& f : kFields) {
    check(d.cuFuncGetAttribute(&(resources_.*f.field), f.attribute, function_),
          "cuFuncGetAttribute");
  }
}

// Called before loading (static_smem still 0) and after reading resources.
void LoadedKernel::configure_shared_memory() {
  const std::uint64_t total =
      std::uint64_t{dynamic_smem_bytes_} + resources_.static_smem;
  if (total <= kSharedMemoryWithoutOptIn) return;
  const DeviceInfo& info = device_info(device_);
  if (total > static_cast<std::uint64_t>(info.max_smem_optin)) {
    throw std::invalid_argument(fmt::format(
        "kernel {} asks for {} bytes of dynamic shared memory (+ {} static) "
        "but device {} ({}) allows at most {} bytes per block",
        entry_, dynamic_smem_bytes_, resources_.static_smem, device_, info.name,
        info.max_smem_optin));
  }
  if (!function_) return;
  check(Driver::get().cuFuncSetAttribute(
            function_, CU_FUNC_ATTRIBUTE_MAX_DYNAMIC_SHARED_SIZE_BYTES,
            static_cast<int>(dynamic_smem_bytes_)),
        "cuFuncSetAttribute(MAX_DYNAMIC_SHARED_SIZE_BYTES)");
}

void LoadedKernel::launch(Dim3 grid, Dim3 block, CUstream stream,
                          void** params) const {
  if (!function_) {
    throw std::logic_error("lfce: launch of a moved-from LoadedKernel");
  }
  if (grid.x == 0 || grid.y == 0 || grid.z == 0 || block.x == 0 ||
      block.y == 0 || block.z == 0) {
    throw std::invalid_argument(fmt::format(
        "kernel {}: grid {} and block {} must be at least 1 in every dimension",
        entry_, str(grid), str(block)));
  }
  if (grid.x > kMaxGridX || grid.y > kMaxGridYZ || grid.z > kMaxGridYZ) {
    throw std::invalid_argument(fmt::format(
        "kernel {}: grid {} exceeds the hardware limit ({}, {}, {})", entry_,
        str(grid), kMaxGridX, kMaxGridYZ, kMaxGridYZ));
  }
  const std::uint64_t threads = std::uint64_t{block.x} * block.y * block.z;
  if (threads > static_cast<std::uint64_t>(resources_.max_threads) ||
      block.z > kMaxBlockZ) {
    throw std::invalid_argument(fmt::format(
        "kernel {}: block {} has {} threads but the kernel allows at most {} "
        "per block ({} registers per thread; block z at most {})",
        entry_, str(block), threads, resources_.max_threads,
        resources_.registers, kMaxBlockZ));
  }
  make_context_current(device_);
  check(Driver::get().cuLaunchKernel(function_, grid.x, grid.y, grid.z, block.x,
                                     block.y, block.z, dynamic_smem_bytes_,
                                     stream, params, nullptr),
        "cuLaunchKernel");
}

LoadedKernel::~LoadedKernel() { unload(); }

LoadedKernel::LoadedKernel(LoadedKernel&& other) noexcept
    : device_(other.device_),
      entry_(std::move(other.entry_)),
      dynamic_smem_bytes_(other.dynamic_smem_bytes_),
      module_(std::exchange(other.module_, nullptr)),
      function_(std::exchange(other.function_, nullptr)),
      resources_(other.resources_) {}

LoadedKernel& LoadedKernel::operator=(LoadedKernel&& other) noexcept {
  if (this != &other) {
    unload();
    device_ = other.device_;
    entry_ = std::move(other.entry_);
    dynamic_smem_bytes_ = other.dynamic_smem_bytes_;
    module_ = std::exchange(other.module_, nullptr);
    function_ = std::exchange(other.function_, nullptr);
    resources_ = other.resources_;
  }
  return *this;
}

void LoadedKernel::unload() noexcept {
  CUmodule module = std::exchange(module_, nullptr);
  function_ = nullptr;
  const Driver* d = Driver::loaded();
  if (!module || !d) return;
  // cuModuleUnload acts in the current context: switch to this device's and
  // back, so that destroying a kernel never changes the caller's device.
  // After the driver shut down at exit every call fails, harmlessly.
  CUcontext previous = nullptr;
  const bool restore = d->cuCtxGetCurrent(&previous) == CUDA_SUCCESS;
  try {
    make_context_current(device_);
  } catch (...) {
  }
  d->cuModuleUnload(module);
  if (restore) d->cuCtxSetCurrent(previous);
}

}  // namespace lfce::runtime
