#include "runtime/kernel_cache.h"

#include <spdlog/spdlog.h>

#include <map>
#include <memory>
#include <mutex>
#include <utility>

#include "templates/templates.h"

namespace lfce::runtime {

const Kernel& kernel_for(int device, const KernelSpec& spec) {
  static std::mutex mutex;
  // Leaked on purpose: kernels must outlive every thread that may still launch them.
  static auto* loaded = new std::map<std::pair<int, KernelSpec>, std::unique_ptr<Kernel>>();
  std::lock_guard<std::mutex> lock(mutex);
  auto& slot = (*loaded)[{device, spec}];
  if (!slot) {
    GeneratedKernel kernel = generate_kernel(spec);
    spdlog::info("compiled {} in {:.1f} ms ({} bytes of PTX)", spec.text(), kernel.compile_ms, kernel.ptx.size());
    slot.reset(new Kernel{LoadedKernel(device, kernel.ptx, kernel.shape.entry,
                                       static_cast<unsigned>(kernel.shape.smem_bytes)),
                          kernel.shape.threads});
  }
  return *slot;
}

}  // namespace lfce::runtime
