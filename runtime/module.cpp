#include "runtime/module.h"

#include <spdlog/fmt/fmt.h>
#include <spdlog/spdlog.h>

#include <cstdint>
#include <cstring>
#include <iterator>
#include <sstream>
#include <utility>

#include "compiler/checked_int.h"
#include "compiler/errors.h"
#include "runtime/driver.h"

namespace lfce::runtime {
namespace {

// Static plus dynamic shared memory a block may use without opting in with
// CU_FUNC_ATTRIBUTE_MAX_DYNAMIC_SHARED_SIZE_BYTES (every GPU since Volta).
constexpr unsigned kSharedMemoryWithoutOptIn = 48 * 1024;

// Hardware launch limits of compute capability >= 3.0 (the grid's: kMaxGridX, kMaxGridYZ in module.h).
constexpr unsigned kMaxBlockZ = 64;
constexpr unsigned kMaxPortableCluster = 8;  // larger clusters need a non-portable opt-in

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

// Error and info log buffers for the driver's JIT and the options that point
// it at them; sizes and the verbose flag are passed by value in the pointer.
// Must outlive the call (or link state) the options are given to.
struct JitLogs {
  std::string errors = std::string(kJitLogBytes, '\0');
  std::string info = std::string(kJitLogBytes, '\0');
  CUjit_option options[5] = {
      CU_JIT_ERROR_LOG_BUFFER, CU_JIT_ERROR_LOG_BUFFER_SIZE_BYTES,
      CU_JIT_INFO_LOG_BUFFER,  CU_JIT_INFO_LOG_BUFFER_SIZE_BYTES,
      CU_JIT_LOG_VERBOSE,
  };
  void* values[5] = {
      errors.data(),
      reinterpret_cast<void*>(std::uintptr_t{kJitLogBytes}),
      info.data(),
      reinterpret_cast<void*>(std::uintptr_t{kJitLogBytes}),
      reinterpret_cast<void*>(std::uintptr_t{1}),
  };

  JitLogs() = default;
  JitLogs(const JitLogs&) = delete;  // values point into this object
  JitLogs& operator=(const JitLogs&) = delete;

  // The whole log at debug level; the compiler's "Potential Performance Loss" lines (a
  // setmaxnreg ignored, wgmma serialised) as a warning: the kernel runs, slower than it should.
  void report(const std::string& entry) const {
    const std::string text = log_text(info);
    if (text.empty()) return;
    spdlog::debug("lfce: driver JIT log for {}:\n{}", entry, text);
    std::istringstream lines(text);
    for (std::string line; std::getline(lines, line);) {
      if (line.find("Potential Performance Loss") != std::string::npos)
        spdlog::warn("lfce: the driver's JIT on kernel {}: {}", entry, line);
    }
  }
};

// A failed JIT step: CompileError with the JIT's log if the code was
// rejected, CudaError if the driver failed otherwise.
[[noreturn]] void throw_jit_failure(CUresult status, const char* call,
                                    const char* action,
                                    const std::string& entry, int device,
                                    const JitLogs& logs) {
  const std::string errors = log_text(logs.errors);
  if (is_compile_failure(status) || !errors.empty()) {
    const CudaError cause(status, call);
    throw CompileError("driver JIT failed to compile kernel '" + entry +
                           "' for CUDA device " + std::to_string(device) +
                           ": " + cause.what(),
                       errors);
  }
  throw CudaError(status, call, std::string(action) + " kernel " + entry);
}

}  // namespace

unsigned grid_dim(int64_t extent, int64_t tile, char axis) {
  const int64_t blocks = ceil_div(extent, tile);
  const int64_t limit = axis == 'x' ? kMaxGridX : kMaxGridYZ;
  if (blocks > limit)
    throw OutOfResources("problem too large: " + std::to_string(extent) + " / " + std::to_string(tile) + " = " +
                             std::to_string(blocks) + " CTAs along grid " + axis + ", over CUDA's limit of " +
                             std::to_string(limit) + ": give fewer tokens per call",
                         std::string("CTAs along grid ") + axis, blocks, limit);
  return static_cast<unsigned>(blocks);
}

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

void LoadedKernel::load_module(const std::string& image) {
  JitLogs logs;
  const CUresult status = Driver::get().cuModuleLoadDataEx(
      &module_, image.c_str(), std::size(logs.options), logs.options,
      logs.values);
  if (status != CUDA_SUCCESS) {
    module_ = nullptr;
    throw_jit_failure(status, "cuModuleLoadDataEx", "loading", entry_, device_,
                      logs);
  }
  logs.report(entry_);
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
    // The tile, hence the shared memory, is lfce's choice (default or tuned), never the
    // caller's: a kernel that does not fit is lfce's fault, not a bad argument.
    throw CompileError(fmt::format(
        "kernel {} needs {} bytes of dynamic shared memory (+ {} static) "
        "but device {} ({}) allows at most {} bytes per block: lfce chose a tile this GPU "
        "cannot run (a bug, or a tuning file from another GPU: retune with `lfce tune`)",
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
                          void** params, unsigned cluster) const {
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
  if (cluster == 0 || cluster > kMaxPortableCluster || grid.x % cluster != 0) {
    throw std::invalid_argument(fmt::format(
        "kernel {}: clusters of {} CTAs need 1..{} CTAs and grid.x a multiple of it, got grid {}",
        entry_, cluster, kMaxPortableCluster, str(grid)));
  }
  make_context_current(device_);
  if (cluster > 1) {
    CUlaunchAttribute attribute{};
    attribute.id = CU_LAUNCH_ATTRIBUTE_CLUSTER_DIMENSION;
    attribute.value.clusterDim.x = cluster;
    attribute.value.clusterDim.y = 1;
    attribute.value.clusterDim.z = 1;
    CUlaunchConfig config{};
    config.gridDimX = grid.x;
    config.gridDimY = grid.y;
    config.gridDimZ = grid.z;
    config.blockDimX = block.x;
    config.blockDimY = block.y;
    config.blockDimZ = block.z;
    config.sharedMemBytes = dynamic_smem_bytes_;
    config.hStream = stream;
    config.attrs = &attribute;
    config.numAttrs = 1;
    check(Driver::get().cuLaunchKernelEx(&config, function_, params, nullptr), "cuLaunchKernelEx");
    return;
  }
  check(Driver::get().cuLaunchKernel(function_, grid.x, grid.y, grid.z, block.x,
                                     block.y, block.z, dynamic_smem_bytes_,
                                     stream, params, nullptr),
        "cuLaunchKernel");
}

LoadedKernel LoadedKernel::from_cubin(int device, const std::string& cubin,
                                      const std::string& entry,
                                      unsigned dynamic_smem_bytes) {
  // cuModuleLoadDataEx tells a cubin from PTX by its ELF magic: anything
  // else would be parsed as PTX text.
  constexpr char kElfMagic[] = {0x7f, 'E', 'L', 'F'};
  if (cubin.compare(0, sizeof kElfMagic, kElfMagic, sizeof kElfMagic) != 0) {
    throw std::invalid_argument("kernel " + entry +
                                ": the cubin image is not an ELF file");
  }
  return LoadedKernel(device, cubin, entry, dynamic_smem_bytes);
}

std::string compile_to_cubin(int device, const std::string& ptx,
                             const std::string& name) {
  const Driver& d = Driver::get();
  // The link targets the device of the current context.
  make_context_current(device);
  JitLogs logs;  // outlives the link state, which writes into it
  CUlinkState state = nullptr;
  check(d.cuLinkCreate(std::size(logs.options), logs.options, logs.values,
                       &state),
        "cuLinkCreate");
  struct Destroy {
    const Driver& d;
    CUlinkState state;
    ~Destroy() { d.cuLinkDestroy(state); }
  } destroy{d, state};
  // The size counts the terminating NUL, which the PTX parser expects.
  CUresult status =
      d.cuLinkAddData(state, CU_JIT_INPUT_PTX, const_cast<char*>(ptx.c_str()),
                      ptx.size() + 1, name.c_str(), 0, nullptr, nullptr);
  if (status != CUDA_SUCCESS) {
    throw_jit_failure(status, "cuLinkAddData", "compiling", name, device, logs);
  }
  void* cubin = nullptr;
  std::size_t size = 0;
  status = d.cuLinkComplete(state, &cubin, &size);
  if (status != CUDA_SUCCESS) {
    throw_jit_failure(status, "cuLinkComplete", "linking", name, device, logs);
  }
  logs.report(name);
  // The image belongs to the link state: copy it before cuLinkDestroy.
  return std::string(static_cast<const char*>(cubin), size);
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
