// The sweep with a fake bench, no GPU: it resumes from what the store holds, scores failures
// +inf and goes on, fixes earlier kinds' winners for later kinds, stops cleanly on its time
// budget, reports progress, and leaves winners that stored_tuning() returns.
#include "autotune/tuner.h"

#include <gtest/gtest.h>

#include <chrono>
#include <filesystem>
#include <set>
#include <thread>

#include "runtime/driver.h"

namespace lfce::autotune {
namespace {

namespace fs = std::filesystem;

runtime::Problem problem() {
  runtime::Problem p;
  p.tokens = 4096;
  p.hidden = 2048;
  p.vocab = 50304;
  p.workspace_budget = 16 << 20;  // several chunks: the chunk is swept
  return p;
}

// Times are a function of the tuning: smaller BN is "faster", one config "fails".
class FakeBench : public Bench {
 public:
  std::string device_name() const override { return "fake GPU"; }
  void prepare() override {
    ++prepared;
    if (out_of_memory) throw runtime::CudaError(CUDA_ERROR_OUT_OF_MEMORY, "cuMemAlloc");
  }
  runtime::Measurement measure(KernelKind kind, const runtime::Tuning& tuning) override {
    calls.push_back({kind, tuning});
    if (sleep_ms) std::this_thread::sleep_for(std::chrono::milliseconds(sleep_ms));
    const TileConfig t = tuning.tiles.at(kind);
    if (fatal_bn && t.bn == fatal_bn) throw runtime::CudaError(CUDA_ERROR_ILLEGAL_ADDRESS, "cuEventSynchronize");
    runtime::Measurement m;
    if (t.bn == failing_bn) {
      m.error = "spills: 64 bytes of local memory per thread";
      return m;
    }
    m.ms = 1.0 + t.bn / 64.0 + t.stages / 100.0;
    return m;
  }

  std::vector<std::pair<KernelKind, runtime::Tuning>> calls;
  int failing_bn = -1, fatal_bn = 0, sleep_ms = 0, prepared = 0;
  bool out_of_memory = false;
};

class TunerTest : public testing::Test {
 protected:
  void SetUp() override {
    char tmpl[] = "/tmp/lfce_tuner_XXXXXX";
    dir_ = mkdtemp(tmpl);
    setenv("LFCE_CACHE_DIR", dir_.c_str(), 1);
    options_.space = "small";
    options_.cache_dir = dir_;
  }
  void TearDown() override {
    unsetenv("LFCE_CACHE_DIR");
    fs::remove_all(dir_);
  }

  size_t space_size(KernelKind kind, const char* space = "small") const {
    return config_space(kind, problem(), Arch::SM90A, space).kept.size();
  }

  std::string dir_;
  TuneOptions options_;
};

TEST_F(TunerTest, MeasuresEveryKeptCandidateOnceAndPicksTheFastest) {
  FakeBench bench;
  TuneResult r = tune_with(bench, problem(), Arch::SM90A, options_);
  size_t total = 0;
  for (KernelKind kind : tuned_kinds()) total += space_size(kind);
  EXPECT_EQ(bench.calls.size(), total);
  ASSERT_EQ(r.kinds.size(), 4u);
  for (const KindResult& k : r.kinds) {
    ASSERT_TRUE(k.winner) << kind_name(k.kind);
    int narrowest = 1 << 30;  // the fake's fastest
    for (const runtime::Candidate& c : config_space(k.kind, problem(), Arch::SM90A, "small").kept)
      narrowest = std::min(narrowest, c.tile.bn);
    EXPECT_EQ(k.winner->tile.bn, narrowest) << kind_name(k.kind);
    ASSERT_TRUE(k.speedup);
    EXPECT_GT(*k.speedup, 1.0);
    EXPECT_EQ(k.measured, static_cast<int>(space_size(k.kind)));
    EXPECT_TRUE(fs::exists(k.path)) << k.path;
  }
  EXPECT_FALSE(r.stopped_by_budget);
}

TEST_F(TunerTest, ResumeMeasuresOnlyTheRemainingCandidates) {
  const KernelKind kind = KernelKind::GradInput;
  const std::vector<runtime::Candidate> all = config_space(kind, problem(), Arch::SM90A, "small").kept;
  ASSERT_GE(all.size(), 3u);
  // A sweep interrupted after the first two candidates.
  runtime::TuningEntry partial;
  partial.key = runtime::TuningKey::of(kind, problem(), Arch::SM90A);
  partial.default_config = all[0];
  partial.records = {{all[0], runtime::Measurement{3.0, "", -1}}, {all[1], runtime::Measurement{2.5, "", -1}}};
  TuningStore(dir_).save(partial);
  EXPECT_EQ(remaining(partial, all), std::vector<runtime::Candidate>(all.begin() + 2, all.end()));

  options_.kinds = {kind};
  FakeBench bench;
  TuneResult r = tune_with(bench, problem(), Arch::SM90A, options_);
  ASSERT_EQ(bench.calls.size(), all.size() - 2);
  std::set<TileConfig> measured, expected;
  for (const auto& call : bench.calls) measured.insert(call.second.tiles.at(kind));
  for (size_t i = 2; i < all.size(); ++i) expected.insert(all[i].tile);
  EXPECT_EQ(measured, expected);
  EXPECT_EQ(r.kinds[0].reused, 2);
  std::optional<runtime::TuningEntry> stored = TuningStore(dir_).load(partial.key);
  ASSERT_TRUE(stored);
  EXPECT_EQ(stored->records.size(), all.size());
  EXPECT_EQ(stored->records[0].result.ms, 3.0);  // kept, not re-measured

  FakeBench again;
  tune_with(again, problem(), Arch::SM90A, options_);
  EXPECT_TRUE(again.calls.empty());
}

TEST_F(TunerTest, FailedCandidateScoresInfinityAndTheSweepGoesOn) {
  options_.kinds = {KernelKind::GradWeight};
  FakeBench bench;
  bench.failing_bn = 64;  // the would-be winner
  TuneResult r = tune_with(bench, problem(), Arch::SM90A, options_);
  EXPECT_EQ(bench.calls.size(), space_size(KernelKind::GradWeight));
  EXPECT_EQ(r.kinds[0].failed, 1);
  ASSERT_TRUE(r.kinds[0].winner);
  EXPECT_NE(r.kinds[0].winner->tile.bn, 64);
  std::optional<runtime::TuningEntry> stored = TuningStore(dir_).load(runtime::TuningKey::of(KernelKind::GradWeight, problem(), Arch::SM90A));
  int failures = 0;
  for (const runtime::Record& rec : stored->records)
    if (!rec.result.ok()) {
      ++failures;
      EXPECT_EQ(rec.result.error, "spills: 64 bytes of local memory per thread");
    }
  EXPECT_EQ(failures, 1);
}

TEST_F(TunerTest, FatalErrorIsRecordedThenRethrown) {
  options_.kinds = {KernelKind::GradWeight};
  FakeBench bench;
  bench.fatal_bn = 64;
  EXPECT_THROW(tune_with(bench, problem(), Arch::SM90A, options_), runtime::CudaError);
  std::optional<runtime::TuningEntry> stored = TuningStore(dir_).load(runtime::TuningKey::of(KernelKind::GradWeight, problem(), Arch::SM90A));
  ASSERT_TRUE(stored);
  const runtime::Record& last = stored->records.back();
  EXPECT_EQ(last.candidate.tile.bn, 64);
  EXPECT_FALSE(last.result.ok());
  EXPECT_NE(last.result.error.find("CUDA_ERROR_ILLEGAL_ADDRESS"), std::string::npos) << last.result.error;

  FakeBench resumed;  // a fresh process skips the culprit
  tune_with(resumed, problem(), Arch::SM90A, options_);
  for (const auto& call : resumed.calls)
    if (call.second.tiles.count(KernelKind::GradWeight)) EXPECT_NE(call.second.tiles.at(KernelKind::GradWeight).bn, 64);
}

TEST_F(TunerTest, MeasuresTheDefaultFirst) {
  FakeBench bench;
  options_.space = "default";
  options_.kinds = {KernelKind::GradInput};
  options_.budget_minutes = 1e-9;  // stops before the first candidate: then nothing measured
  tune_with(bench, problem(), Arch::SM90A, options_);
  EXPECT_TRUE(bench.calls.empty());
  options_.budget_minutes = 0;
  tune_with(bench, problem(), Arch::SM90A, options_);
  ASSERT_FALSE(bench.calls.empty());
  EXPECT_EQ(bench.calls.front().second.tiles.at(KernelKind::GradInput),
            runtime::default_tile(KernelKind::GradInput, DType::BF16, Arch::SM90A));
  EXPECT_EQ(bench.calls.size(), space_size(KernelKind::GradInput, "default"));
}

TEST_F(TunerTest, SetupFailureBlamesNoCandidate) {
  FakeBench bench;
  bench.out_of_memory = true;
  EXPECT_THROW(tune_with(bench, problem(), Arch::SM90A, options_), runtime::CudaError);
  EXPECT_TRUE(bench.calls.empty());
  EXPECT_FALSE(TuningStore(dir_).load(runtime::TuningKey::of(KernelKind::LseForward, problem(), Arch::SM90A)));
}

TEST_F(TunerTest, NothingLeftToMeasureNeedsNoDevice) {
  FakeBench first;
  tune_with(first, problem(), Arch::SM90A, options_);
  EXPECT_EQ(first.prepared, 1);
  FakeBench second;
  second.out_of_memory = true;  // would throw if it were set up
  EXPECT_NO_THROW(tune_with(second, problem(), Arch::SM90A, options_));
  EXPECT_EQ(second.prepared, 0);
}

TEST_F(TunerTest, LaterKindsAreMeasuredWithTheEarlierWinners) {
  FakeBench bench;
  TuneResult r = tune_with(bench, problem(), Arch::SM90A, options_);
  const runtime::Candidate dlogits_winner = *r.kinds[1].winner;
  for (const auto& [kind, tuning] : bench.calls) {
    if (kind == KernelKind::GradWeight || kind == KernelKind::GradInput) {
      EXPECT_EQ(tuning.tiles.at(KernelKind::DlogitsBackward), dlogits_winner.tile);
      EXPECT_EQ(tuning.chunk, dlogits_winner.chunk);
    }
    if (kind == KernelKind::DlogitsBackward) {
      EXPECT_EQ(tuning.tiles.count(KernelKind::GradWeight), 0u);  // not tuned yet: the default
    }
  }
}

TEST_F(TunerTest, BudgetStopsCleanlyKeepingWhatWasMeasured) {
  FakeBench bench;
  bench.sleep_ms = 40;
  options_.budget_minutes = 0.1 / 60;  // 100 ms: two or three candidates
  TuneResult r = tune_with(bench, problem(), Arch::SM90A, options_);
  EXPECT_TRUE(r.stopped_by_budget);
  ASSERT_GE(bench.calls.size(), 1u);
  EXPECT_LE(bench.calls.size(), 4u);
  std::optional<runtime::TuningEntry> stored = TuningStore(dir_).load(runtime::TuningKey::of(KernelKind::LseForward, problem(), Arch::SM90A));
  ASSERT_TRUE(stored);
  EXPECT_EQ(stored->records.size(), std::min(bench.calls.size(), space_size(KernelKind::LseForward)));

  FakeBench rest;  // no budget: finishes the sweep without repeating anything
  options_.budget_minutes = 0;
  tune_with(rest, problem(), Arch::SM90A, options_);
  size_t total = 0;
  for (KernelKind kind : tuned_kinds()) total += space_size(kind);
  EXPECT_EQ(bench.calls.size() + rest.calls.size(), total);
}

TEST_F(TunerTest, ProgressCountsUpToTheTotal) {
  std::vector<Progress> seen;
  options_.progress = [&](const Progress& p) { seen.push_back(p); };
  FakeBench bench;
  tune_with(bench, problem(), Arch::SM90A, options_);
  ASSERT_FALSE(seen.empty());
  const int total = static_cast<int>(bench.calls.size());
  for (size_t i = 1; i < seen.size(); ++i) EXPECT_GE(seen[i].done, seen[i - 1].done);
  EXPECT_EQ(seen.front().done, 0);
  EXPECT_EQ(seen.front().total, total);
  EXPECT_FALSE(seen.front().candidate.empty());
  EXPECT_EQ(seen.back().done, total);
  EXPECT_GE(seen.back().eta_seconds, 0);
}

TEST_F(TunerTest, LookupReturnsTheTunedWinners) {
  FakeBench bench;
  TuneResult r = tune_with(bench, problem(), Arch::SM90A, options_);
  EXPECT_EQ(runtime::stored_tuning(TuningStore(dir_), problem(), Arch::SM90A), r.tuning);
  EXPECT_FALSE(r.tuning == runtime::Tuning{});
}

}  // namespace
}  // namespace lfce::autotune
