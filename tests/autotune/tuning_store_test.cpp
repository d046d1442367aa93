// The tuning store with no GPU: entries round-trip through their JSON file, writes are atomic,
// a damaged file reads as missing, and stored_tuning() returns the stored winners for problems
// of the same key and N bucket (and the defaults for others), reading each file once.
#include "autotune/tuning_store.h"

#include <gtest/gtest.h>
#include <sys/stat.h>

#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <nlohmann/json.hpp>

#include "autotune/config_space.h"
#include "compiler/errors.h"
#include "runtime/tuning.h"
#include "tests/log_capture.h"

namespace lfce::autotune {
namespace {

namespace fs = std::filesystem;
using testing_log::WarningCapture;

runtime::Problem problem(int64_t tokens = 8192) {
  runtime::Problem p;
  p.tokens = tokens;
  p.hidden = 4096;
  p.vocab = 128256;
  p.workspace_budget = runtime::kDefaultWorkspaceBudget;
  return p;
}

// A fresh cache directory, also exported as LFCE_CACHE_DIR.
class StoreTest : public testing::Test {
 protected:
  void SetUp() override {
    char tmpl[] = "/tmp/lfce_tuning_XXXXXX";
    dir_ = mkdtemp(tmpl);
    setenv("LFCE_CACHE_DIR", dir_.c_str(), 1);
  }
  void TearDown() override {
    unsetenv("LFCE_CACHE_DIR");
    fs::remove_all(dir_);
  }

  runtime::TuningEntry entry(KernelKind kind, const runtime::Problem& p, const runtime::Candidate& fast) {
    runtime::TuningEntry e;
    e.key = runtime::TuningKey::of(kind, p, Arch::SM90A);
    e.tokens = p.tokens;
    e.device = "NVIDIA H200";
    e.default_config = default_candidate(kind, p, Arch::SM90A);
    e.measured_with = {{"lse_forward", "128x128x64/2x4/s3;ctas=264"}};
    e.records.push_back({e.default_config, runtime::Measurement{2.0, "", 0.0}});
    e.records.push_back({fast, runtime::Measurement{1.5, "", 0.001}});
    runtime::Measurement failed;
    failed.error = "spills: 96 bytes of local memory per thread";
    e.records.push_back({runtime::Candidate{kind, TileConfig{256, 128, 64, 2, 4, 4}, fast.forward_ctas, fast.chunk}, failed});
    return e;
  }

  std::string dir_;
};

const runtime::Candidate kFastForward{KernelKind::LseForward, TileConfig{128, 256, 64, 2, 4, 3}, 528, 0};

TEST_F(StoreTest, RoundTripsAnEntry) {
  TuningStore store(dir_);
  runtime::TuningEntry saved = entry(KernelKind::LseForward, problem(), kFastForward);
  store.save(saved);
  std::optional<runtime::TuningEntry> loaded = store.load(saved.key);
  ASSERT_TRUE(loaded);
  EXPECT_EQ(loaded->tokens, 8192);
  EXPECT_EQ(loaded->device, "NVIDIA H200");
  EXPECT_EQ(loaded->default_config, saved.default_config);
  EXPECT_EQ(loaded->measured_with, saved.measured_with);
  ASSERT_EQ(loaded->records.size(), 3u);
  for (size_t i = 0; i < 3; ++i) {
    EXPECT_EQ(loaded->records[i].candidate, saved.records[i].candidate);
    EXPECT_EQ(loaded->records[i].result.ms, saved.records[i].result.ms);
    EXPECT_EQ(loaded->records[i].result.error, saved.records[i].result.error);
    EXPECT_EQ(loaded->records[i].result.verify_error, saved.records[i].result.verify_error);
  }
  EXPECT_FALSE(loaded->records[2].result.ok());
  ASSERT_TRUE(loaded->winner());
  EXPECT_EQ(loaded->winner()->candidate, kFastForward);
  EXPECT_DOUBLE_EQ(*loaded->speedup(), 2.0 / 1.5);
}

TEST_F(StoreTest, FileIsReadableJsonNamedAfterTheKey) {
  TuningStore store(dir_);
  runtime::TuningEntry saved = entry(KernelKind::LseForward, problem(5000), kFastForward);
  store.save(saved);
  const std::string path = store.path(saved.key);
  EXPECT_EQ(fs::path(path).filename(), "lse_forward-sm_90a-smem232448-sms132-bf16-V128256-H4096-N8192-recompute-mean-i64-nobias.json");
  nlohmann::json j = nlohmann::json::parse(std::ifstream(path));
  EXPECT_EQ(j["key"]["n_bucket"], 8192);
  EXPECT_EQ(j["winner"]["config"], kFastForward.text());
  EXPECT_TRUE(j["candidates"][2]["ms"].is_null());  // +inf: failed
  EXPECT_EQ(j["candidates"][2]["error"], "spills: 96 bytes of local memory per thread");
}

TEST_F(StoreTest, WriteLeavesNoTemporaryFiles) {
  TuningStore store(dir_);
  for (int i = 0; i < 3; ++i) store.save(entry(KernelKind::LseForward, problem(), kFastForward));
  int files = 0;
  for (const auto& f : fs::directory_iterator(store.dir())) {
    EXPECT_EQ(f.path().extension(), ".json") << f.path();
    EXPECT_NE(f.path().filename().string()[0], '.') << f.path();
    ++files;
  }
  EXPECT_EQ(files, 1);
}

TEST_F(StoreTest, CorruptFileReadsAsMissing) {
  TuningStore store(dir_);
  runtime::TuningEntry saved = entry(KernelKind::GradInput, problem(), runtime::Candidate{KernelKind::GradInput, TileConfig{64, 128, 64, 2, 2, 3}, 0, 0});
  store.save(saved);
  std::ofstream(store.path(saved.key), std::ios::trunc) << "{\"format\": 1, \"key\":";
  EXPECT_FALSE(store.load(saved.key));
}

TEST_F(StoreTest, FileOfAnotherKeyReadsAsMissing) {
  TuningStore store(dir_);
  runtime::TuningEntry saved = entry(KernelKind::LseForward, problem(), kFastForward);
  store.save(saved);
  runtime::TuningKey other = saved.key;
  other.hidden = 2048;
  fs::copy_file(store.path(saved.key), store.path(other));
  EXPECT_FALSE(store.load(other));
}

TEST_F(StoreTest, LookupReturnsTheStoredWinnerForTheSameBucket) {
  TuningStore store(dir_);
  const runtime::Candidate fast_gw{KernelKind::GradWeight, TileConfig{128, 64, 64, 2, 2, 4}, 0, 0};
  store.save(entry(KernelKind::LseForward, problem(8192), kFastForward));
  store.save(entry(KernelKind::GradWeight, problem(8192), fast_gw));

  runtime::Tuning tuned = runtime::stored_tuning(TuningStore(dir_), problem(5000), Arch::SM90A);  // bucket 8192 as well
  EXPECT_EQ(tuned.tiles.at(KernelKind::LseForward), kFastForward.tile);
  EXPECT_EQ(tuned.forward_ctas, 528);
  EXPECT_EQ(tuned.tiles.at(KernelKind::GradWeight), fast_gw.tile);
  EXPECT_EQ(tuned.tiles.count(KernelKind::GradInput), 0u);  // none stored: the default
  EXPECT_EQ(tuned.chunk, 0);

  EXPECT_EQ(runtime::stored_tuning(TuningStore(dir_), problem(8193), Arch::SM90A), runtime::Tuning{});  // bucket 16384
  EXPECT_EQ(runtime::stored_tuning(TuningStore(dir_), problem(8192), Arch::SM80), runtime::Tuning{});   // another arch
}

// A FIFO in place of a tuning file once hung the first forward (std::ifstream blocks on
// open until a writer comes). Now it is "not a regular file": logged, read as missing.
TEST_F(StoreTest, AFifoInPlaceOfATuningFileReadsAsMissingWithoutBlocking) {
  TuningStore store(dir_);
  const runtime::TuningKey key = runtime::TuningKey::of(KernelKind::LseForward, problem(), Arch::SM90A);
  fs::create_directories(store.dir());
  ASSERT_EQ(mkfifo(store.path(key).c_str(), 0600), 0);
  WarningCapture log;
  EXPECT_FALSE(store.load(key));
  EXPECT_NE(log.text().find("not a regular file"), std::string::npos) << log.text();
  EXPECT_EQ(runtime::stored_tuning(store, problem(), Arch::SM90A), runtime::Tuning{});
}

// One tuning per generated kernel. lse_forward's code does not read the mode,
// so recompute and eager problems share its winner; dlogits_backward reads it, so they do not.
TEST(TuningKey, ProblemsWhoseKernelIsTheSameCodeShareOneKey) {
  runtime::Problem recompute = problem(), eager = problem();
  eager.mode = Mode::Eager;
  EXPECT_EQ(runtime::TuningKey::of(KernelKind::LseForward, recompute, Arch::SM90A),
            runtime::TuningKey::of(KernelKind::LseForward, eager, Arch::SM90A));
  EXPECT_FALSE(runtime::TuningKey::of(KernelKind::DlogitsBackward, recompute, Arch::SM90A) ==
               runtime::TuningKey::of(KernelKind::DlogitsBackward, eager, Arch::SM90A));
  runtime::Problem sum = problem();
  sum.reduction = Reduction::Sum;  // bf16 grad_weight does not read the reduction (fp16 does: dz_scale)
  EXPECT_EQ(runtime::TuningKey::of(KernelKind::GradWeight, recompute, Arch::SM90A),
            runtime::TuningKey::of(KernelKind::GradWeight, sum, Arch::SM90A));
  sum.dtype = recompute.dtype = DType::FP16;
  EXPECT_FALSE(runtime::TuningKey::of(KernelKind::GradWeight, recompute, Arch::SM90A) ==
               runtime::TuningKey::of(KernelKind::GradWeight, sum, Arch::SM90A));
  // V, H and the N bucket stay in every key: they change the timing.
  runtime::Problem wider = problem();
  wider.vocab += 128;
  EXPECT_FALSE(runtime::TuningKey::of(KernelKind::GradWeight, problem(), Arch::SM90A) ==
               runtime::TuningKey::of(KernelKind::GradWeight, wider, Arch::SM90A));
}

TEST_F(StoreTest, LookupIgnoresAWinnerThePrunerRejects) {
  TuningStore store(dir_);
  // As a file from another generator version might hold: over sm_90a's shared memory.
  store.save(entry(KernelKind::LseForward, problem(), runtime::Candidate{KernelKind::LseForward, TileConfig{256, 256, 64, 2, 4, 4}, 264, 0}));
  EXPECT_EQ(runtime::stored_tuning(TuningStore(dir_), problem(), Arch::SM90A), runtime::Tuning{});
}

// Tuning files are data from disk: a winner that would overflow or divide by zero is logged,
// naming the file and the field, and the kind runs with its default.
TEST_F(StoreTest, LookupIgnoresAWinnerWhoseWarpsOverflowTheThreadCount) {
  TuningStore store(dir_);
  const runtime::Candidate bad{KernelKind::LseForward, TileConfig{128, 128, 64, 2, 67108864, 3}, 264, 0};
  store.save(entry(KernelKind::LseForward, problem(), bad));
  WarningCapture log;
  EXPECT_EQ(runtime::stored_tuning(TuningStore(dir_), problem(), Arch::SM90A), runtime::Tuning{});
  const std::string path = store.path(runtime::TuningKey::of(KernelKind::LseForward, problem(), Arch::SM90A));
  EXPECT_NE(log.text().find(path), std::string::npos) << log.text();
  EXPECT_NE(log.text().find("tile warps_n = 67108864 is outside 1..32"), std::string::npos) << log.text();
}

TEST_F(StoreTest, LookupIgnoresAWinnerWithANegativeTileAndKeepsTheOtherKinds) {
  TuningStore store(dir_);
  // N = 64: ceil(64 / -64) = 0 row blocks, which the forward's CTA target was once divided by.
  const runtime::Problem p = problem(64);
  const runtime::Candidate good_gx{KernelKind::GradInput, TileConfig{64, 128, 64, 2, 2, 3}, 0, 0};
  store.save(entry(KernelKind::LseForward, p,
                   runtime::Candidate{KernelKind::LseForward, TileConfig{-64, 256, 64, 1, 4, 2}, 264, 0}));
  store.save(entry(KernelKind::GradWeight, p,
                   runtime::Candidate{KernelKind::GradWeight, TileConfig{-128, 128, 64, 2, 4, 3}, 0, 0}));
  store.save(entry(KernelKind::GradInput, p, good_gx));
  WarningCapture log;
  const runtime::Tuning tuned = runtime::stored_tuning(TuningStore(dir_), p, Arch::SM90A);
  runtime::Tuning expected;
  expected.tiles[KernelKind::GradInput] = good_gx.tile;
  EXPECT_EQ(tuned, expected);
  EXPECT_NE(log.text().find("tile BM = -64 is outside 1..1024"), std::string::npos) << log.text();
  EXPECT_NE(log.text().find("tile BM = -128 is outside 1..1024"), std::string::npos) << log.text();
  EXPECT_NE(log.text().find(store.path(runtime::TuningKey::of(KernelKind::GradWeight, p, Arch::SM90A))),
            std::string::npos)
      << log.text();
  // The runtime then plans and generates with the defaults for those kinds.
  const runtime::Plan plan(p, Arch::SM90A, tuned);
  EXPECT_NO_THROW(plan.spec(KernelKind::LseForward).validate());
  EXPECT_NO_THROW(plan.spec(KernelKind::GradWeight).validate());
}

TEST(TokenBucket, IsTheNextPowerOfTwo) {
  EXPECT_EQ(runtime::token_bucket(1), 1);
  EXPECT_EQ(runtime::token_bucket(4097), 8192);
  EXPECT_EQ(runtime::token_bucket(8192), 8192);
}

TEST(TokenBucket, NamesATokenCountWithoutABucket) {
  try {
    runtime::token_bucket(4611686018427387905);  // 2^62 + 1: once doubled forever
    FAIL() << "no error";
  } catch (const SpecError& e) {
    EXPECT_NE(std::string(e.what()).find("4611686018427387905"), std::string::npos) << e.what();
  }
}

}  // namespace
}  // namespace lfce::autotune
