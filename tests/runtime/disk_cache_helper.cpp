// One "rank" for the disk cache tests: a separate process that asks the cache for kernels,
// as each of the ranks of a node does when training starts, and reports what they cost.
//
//   disk_cache_helper precompile|load SPEC_TEXT...
//
// If $LFCE_HELPER_GO names a file, waits until it exists (so that many helpers start at the
// same moment). Then, per spec, calls precompile(spec) (no GPU) or kernel_for(0, spec) and
// prints one line:
//   key=<ptx key> hit=<0|1> compiles=<LLVM compilations so far in this process>
//   source=<llvm|ptx-cache|cubin-cache> ms=<the call> llvm_ms=<> jit_ms=<>
// The cache directory comes from LFCE_CACHE_DIR, as in production. Exit status 1 on error.
#include <unistd.h>

#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <exception>
#include <string>
#include <thread>

#include "compiler/kernel_spec.h"
#include "compiler/nvptx_backend.h"
#include "runtime/driver.h"
#include "runtime/kernel_cache.h"
#include "runtime/logging.h"

namespace {

using lfce::runtime::KernelLoadStats;

void report(const std::string& key, bool hit, const std::string& source, double ms, double llvm_ms, double jit_ms) {
  std::printf("key=%s hit=%d compiles=%lld source=%s ms=%.3f llvm_ms=%.3f jit_ms=%.3f\n", key.c_str(), hit ? 1 : 0,
              static_cast<long long>(lfce::emitted_module_count()), source.c_str(), ms, llvm_ms, jit_ms);
}

}  // namespace

int main(int argc, char** argv) {
  if (argc < 3) {
    std::fprintf(stderr, "usage: %s precompile|load SPEC_TEXT...\n", argv[0]);
    return 2;
  }
  const std::string mode = argv[1];
  lfce::runtime::init_logging();  // to stderr: stdout carries the result lines
  try {
    if (const char* go = std::getenv("LFCE_HELPER_GO"); go && *go) {
      while (access(go, F_OK) != 0) std::this_thread::sleep_for(std::chrono::microseconds(200));
    }
    // Per-process driver and context setup is not any kernel's load time.
    if (mode == "load") lfce::runtime::make_context_current(0);
    for (int i = 2; i < argc; ++i) {
      const lfce::KernelSpec spec = lfce::KernelSpec::parse(argv[i]);
      if (mode == "precompile") {
        const lfce::runtime::PrecompileResult r = lfce::runtime::precompile(spec);
        report(r.key, r.hit, r.hit ? "ptx-cache" : "llvm", r.elapsed_ms, r.hit ? 0 : r.compile_ms, 0);
      } else if (mode == "load") {
        lfce::runtime::kernel_for(0, spec);
        const KernelLoadStats s = lfce::runtime::kernel_load_stats().back();
        report(lfce::runtime::ptx_key(spec), s.source == "cubin-cache", s.source, s.total_ms, s.llvm_ms, s.jit_ms);
      } else {
        std::fprintf(stderr, "unknown mode '%s'\n", mode.c_str());
        return 2;
      }
    }
  } catch (const std::exception& e) {
    std::fprintf(stderr, "disk_cache_helper: %s\n", e.what());
    return 1;
  }
  return 0;
}
