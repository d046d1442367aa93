// The kernel cache on a real GPU (label gpu): cubins the driver made are kept on disk, and a
// new process loads them with neither LLVM nor the driver's JIT (kernels compiled whole: their
// PTX, without LLVM); damaged cubins are replaced.
// Prints, for the llama3-8b kernels, the cold (LLVM + JIT) and warm (disk) time per kernel.
// Skips without a GPU; fails on a machine that should have one (tests/runtime/gpu_required.h).
#include <gtest/gtest.h>

#include <cstdio>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <optional>
#include <string>
#include <vector>

#include "compiler/nvptx_backend.h"
#include "runtime/driver.h"
#include "runtime/kernel_cache.h"
#include "runtime/plan.h"
#include "tests/runtime/gpu_required.h"
#include "tests/runtime/helper_process.h"

namespace lfce::runtime {
namespace {

namespace fs = std::filesystem;
using testing_helpers::field;
using testing_helpers::number;
using testing_helpers::run_helpers;

class KernelCacheGpu : public testing::Test {
 protected:
  void SetUp() override {
    LFCE_SKIP_OR_FAIL_WITHOUT_GPU();
    arch_ = device_info(0).arch();
    char tmpl[] = "/tmp/lfce_kernel_cache_gpu_XXXXXX";
    dir_ = mkdtemp(tmpl);
  }
  void TearDown() override {
    if (!dir_.empty()) fs::remove_all(dir_);
  }

  // The kernels of one llama3-8b forward and backward on this GPU.
  std::vector<std::string> llama3_specs() const {
    Problem p;
    p.tokens = 8192;
    p.hidden = 4096;
    p.vocab = 128256;
    const Plan plan(p, arch_);
    std::vector<std::string> specs;
    for (KernelKind kind : {KernelKind::LseForward, KernelKind::LseCombine, KernelKind::LossReduce,
                            KernelKind::DlogitsBackward, KernelKind::GradWeight, KernelKind::GradInput})
      specs.push_back(plan.spec(kind).text());
    return specs;
  }

  std::string cubin_path(const std::string& spec) const {
    const DeviceInfo& info = device_info(0);
    return dir_ + "/kernels/" +
           cubin_key(ptx_key(KernelSpec::parse(spec)), {info.cc_major, info.cc_minor, driver_version()}) + ".cubin";
  }

  Arch arch_ = Arch::SM80;
  std::string dir_;
};

TEST_F(KernelCacheGpu, ANewProcessLoadsCubinsFromDiskWithoutLLVMOrJit) {
  const std::vector<std::string> specs = llama3_specs();
  const auto cold = run_helpers(dir_, "load", specs, 1).at(0);
  const auto warm = run_helpers(dir_, "load", specs, 1).at(0);
  ASSERT_EQ(cold.size(), specs.size());
  ASSERT_EQ(warm.size(), specs.size());
  std::printf("%-18s %10s %10s %10s\n", "kernel", "LLVM ms", "JIT ms", "warm ms");
  for (std::size_t i = 0; i < specs.size(); ++i) {
    // Kernels compiled whole keep no cubin: their warm path is the PTX entry (and the driver's cache).
    const bool whole = compiled_whole(KernelSpec::parse(specs[i]));
    EXPECT_EQ(field(cold[i], "source"), "llvm") << cold[i];
    EXPECT_EQ(field(warm[i], "source"), whole ? "ptx-cache" : "cubin-cache") << warm[i];
    EXPECT_EQ(field(warm[i], "compiles"), "0") << warm[i];
    EXPECT_EQ(fs::exists(cubin_path(specs[i])), !whole) << specs[i];
    std::printf("%-18s %10.1f %10.1f %10.2f\n", specs[i].substr(0, specs[i].find(';')).c_str(),
                number(cold[i], "llvm_ms"), number(cold[i], "jit_ms"), number(warm[i], "ms"));
  }
}

TEST_F(KernelCacheGpu, APrecompiledPtxCacheNeedsOnlyTheDriverJit) {
  const std::vector<std::string> specs = {llama3_specs().at(1)};
  run_helpers(dir_, "precompile", specs, 1);  // as in a container build, without a GPU
  const std::string line = run_helpers(dir_, "load", specs, 1).at(0).at(0);
  EXPECT_EQ(field(line, "source"), "ptx-cache") << line;
  EXPECT_EQ(field(line, "compiles"), "0") << line;
  EXPECT_GT(number(line, "jit_ms"), 0) << line;
}

TEST_F(KernelCacheGpu, ReplacesADamagedCubin) {
  const std::vector<std::string> specs = {llama3_specs().at(1)};
  run_helpers(dir_, "load", specs, 1);
  const std::string path = cubin_path(specs[0]);
  ASSERT_TRUE(fs::exists(path));
  fs::resize_file(path, fs::file_size(path) / 2);
  const std::string again = run_helpers(dir_, "load", specs, 1).at(0).at(0);
  EXPECT_EQ(field(again, "source"), "ptx-cache") << again;  // compiled again from the PTX entry
  const std::string warm = run_helpers(dir_, "load", specs, 1).at(0).at(0);
  EXPECT_EQ(field(warm, "source"), "cubin-cache") << warm;
}

// A cubin whose checksums are right but which does not load (its entry name is not in the
// module: CUDA_ERROR_NOT_FOUND, a driver error rather than a JIT one) is removed and rebuilt.
TEST_F(KernelCacheGpu, RebuildsACachedCubinThatDoesNotLoad) {
  const std::vector<std::string> specs = {llama3_specs().at(1)};
  run_helpers(dir_, "load", specs, 1);
  const DeviceInfo& info = device_info(0);
  const std::string key =
      cubin_key(ptx_key(KernelSpec::parse(specs[0])), {info.cc_major, info.cc_minor, driver_version()});
  DiskCache cache(dir_);
  std::optional<Entry> cubin = cache.load(key);
  ASSERT_TRUE(cubin);
  cubin->record.entry = "no_such_kernel";
  cache.store(*cubin);  // sealed again: only loading it can tell
  const std::string again = run_helpers(dir_, "load", specs, 1).at(0).at(0);
  EXPECT_EQ(field(again, "source"), "ptx-cache") << again;
  const std::string warm = run_helpers(dir_, "load", specs, 1).at(0).at(0);
  EXPECT_EQ(field(warm, "source"), "cubin-cache") << warm;
}

// A PTX entry whose checksums are right but which the driver's JIT rejects is generated again:
// lse_combine's (kept as a cubin) and lse_forward's (compiled whole on sm_90a).
TEST_F(KernelCacheGpu, RegeneratesACachedPtxTheDriverRejects) {
  for (int which : {1, 0}) {
    const std::vector<std::string> specs = {llama3_specs().at(which)};
    run_helpers(dir_, "precompile", specs, 1);
    DiskCache cache(dir_);
    std::optional<Entry> ptx = cache.load(ptx_key(KernelSpec::parse(specs[0])));
    ASSERT_TRUE(ptx);
    ptx->payload = ".version 8.0\n.target sm_80\n.address_size 64\nthis is not PTX\n";
    cache.store(*ptx);  // sealed again: only the driver can tell
    const std::string line = run_helpers(dir_, "load", specs, 1).at(0).at(0);
    EXPECT_EQ(field(line, "source"), "llvm") << line;
    const std::string warm = run_helpers(dir_, "load", specs, 1).at(0).at(0);
    EXPECT_EQ(field(warm, "source"), compiled_whole(KernelSpec::parse(specs[0])) ? "ptx-cache" : "cubin-cache") << warm;
  }
}

TEST_F(KernelCacheGpu, ASecondCallInTheProcessReturnsTheLoadedKernel) {
  use_cache_dir(dir_);
  const KernelSpec spec = KernelSpec::parse(llama3_specs().at(2));
  const int64_t before = emitted_module_count();
  const Kernel& first = kernel_for(0, spec);
  const Kernel& second = kernel_for(0, spec);
  EXPECT_EQ(&first, &second);
  EXPECT_EQ(emitted_module_count(), before + 1);
  EXPECT_GT(first.loaded.resources().registers, 0);
}

}  // namespace
}  // namespace lfce::runtime
