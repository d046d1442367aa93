// The sweep on a real GPU (label gpu): every config of the small space (run with --verify)
// matches the fp64 host reference within the dtype's bounds, and the winners it stores are what
// the next stored_tuning() returns. Skips without a GPU; fails on a machine that
// should have one (tests/runtime/gpu_required.h).
#include <gtest/gtest.h>

#include <cstdlib>
#include <filesystem>

#include "autotune/tuner.h"
#include "runtime/driver.h"
#include "tests/runtime/gpu_required.h"

namespace lfce::autotune {
namespace {

namespace fs = std::filesystem;

class TunerGpu : public testing::TestWithParam<DType> {
 protected:
  void SetUp() override {
    LFCE_SKIP_OR_FAIL_WITHOUT_GPU();
    char tmpl[] = "/tmp/lfce_tuner_gpu_XXXXXX";
    dir_ = mkdtemp(tmpl);
    setenv("LFCE_CACHE_DIR", dir_.c_str(), 1);
  }
  void TearDown() override {
    unsetenv("LFCE_CACHE_DIR");
    if (!dir_.empty()) fs::remove_all(dir_);
  }
  std::string dir_;
};

TEST_P(TunerGpu, SmallSpaceMatchesTheHostReferenceAndItsWinnersAreUsed) {
  runtime::Problem p;
  p.tokens = 1000;  // not a multiple of any tile: edges are exercised
  p.hidden = 512;
  p.vocab = 5000;
  p.dtype = GetParam();
  p.bias = true;
  p.workspace_budget = 1 << 20;  // several vocabulary chunks
  TuneOptions options;
  options.space = "small";
  options.cache_dir = dir_;  // explicit, as the Session passes it (the environment is read once)
  options.verify = true;
  options.warmup = 1;
  options.repetitions = 3;
  TuneResult r = tune(p, 0, options);
  const runtime::DeviceInfo& info = runtime::device_info(0);
  const Arch arch = info.arch();
  const runtime::DeviceLimits limits{info.max_smem_optin, info.sm_count};  // the tuner's key
  ASSERT_EQ(r.kinds.size(), 4u);
  TuningStore store(dir_);
  for (const KindResult& k : r.kinds) {
    SCOPED_TRACE(std::string(kind_name(k.kind)));
    EXPECT_EQ(k.failed, 0);
    EXPECT_TRUE(k.winner);
    std::optional<runtime::TuningEntry> entry = store.load(runtime::TuningKey::of(k.kind, p, arch, limits));
    ASSERT_TRUE(entry);
    for (const runtime::Record& rec : entry->records) {
      EXPECT_TRUE(rec.result.ok()) << rec.candidate.text() << ": " << rec.result.error;
      EXPECT_GE(rec.result.verify_error, 0) << rec.candidate.text();
      EXPECT_LE(rec.result.verify_error, 1.0) << rec.candidate.text();  // within the bounds of the fp64 reference
    }
  }
  // A later process: no memo, only the files.
  EXPECT_EQ(runtime::stored_tuning(TuningStore(dir_), p, arch, limits), r.tuning);
  // and nothing is measured again
  TuneResult again = tune(p, 0, options);
  for (const KindResult& k : again.kinds) EXPECT_EQ(k.measured, 0);
}

INSTANTIATE_TEST_SUITE_P(Autotune, TunerGpu, testing::Values(DType::BF16, DType::FP32),
                         [](const testing::TestParamInfo<DType>& info) { return std::string(dtype_name(info.param)); });

}  // namespace
}  // namespace lfce::autotune
