// Session: one cache directory for kernels and tuning winners, tunings read once per problem,
// options read once with an explicit reload. No GPU needed (tunings and plans by arch).
#include "api/session.h"

#include <gtest/gtest.h>
#include <stdlib.h>

#include <filesystem>
#include <string>

#include "autotune/config_space.h"
#include "autotune/tuning_store.h"
#include "compiler/errors.h"
#include "runtime/kernel_cache.h"

namespace lfce::api {
namespace {

namespace fs = std::filesystem;
using runtime::Candidate;
using runtime::Measurement;
using runtime::TuningEntry;
using runtime::TuningKey;
using autotune::TuningStore;

runtime::Problem problem() {
  runtime::Problem p;
  p.tokens = 8192;
  p.hidden = 4096;
  p.vocab = 128256;
  p.workspace_budget = runtime::kDefaultWorkspaceBudget;
  return p;
}

const Candidate kFastForward{KernelKind::LseForward, TileConfig{128, 256, 64, 2, 4, 3}, 528, 0};

// A winner for lse_forward in <dir>/tuning.
void store_winner(const std::string& dir) {
  TuningEntry e;
  e.key = TuningKey::of(KernelKind::LseForward, problem(), Arch::SM90A);
  e.tokens = 8192;
  e.device = "NVIDIA H200";
  e.default_config = autotune::default_candidate(KernelKind::LseForward, problem(), Arch::SM90A);
  e.records.push_back({e.default_config, Measurement{2.0, "", -1}});
  e.records.push_back({kFastForward, Measurement{1.5, "", -1}});
  TuningStore(dir).save(e);
}

class SessionTest : public testing::Test {
 protected:
  void SetUp() override {
    for (std::string* d : {&a_, &b_}) {
      char tmpl[] = "/tmp/lfce_session_XXXXXX";
      *d = mkdtemp(tmpl);
    }
    setenv("LFCE_CACHE_DIR", a_.c_str(), 1);
  }
  void TearDown() override {
    unsetenv("LFCE_CACHE_DIR");
    unsetenv("LFCE_DEVICE_SMEM_LIMIT");
    unsetenv("LFCE_EXPERIMENTAL");
    fs::remove_all(a_);
    fs::remove_all(b_);
  }
  std::string a_, b_;
};

// A regression: `lfce precompile --cache-dir X` compiled with the winners of the environment's
// directory, not X's. A cache directory holds both; setting it moves both.
TEST_F(SessionTest, SetCacheDirMovesKernelsAndTuningWinnersTogether) {
  store_winner(b_);
  Session session(runtime::Options::from_env());
  EXPECT_EQ(session.cache_dir(), a_);
  EXPECT_EQ(session.tuning(problem(), Arch::SM90A), runtime::Tuning{});  // none in a_
  session.set_cache_dir(b_);
  EXPECT_EQ(session.cache_dir(), b_);
  EXPECT_EQ(runtime::disk_cache()->dir(), b_);  // the kernels
  const runtime::Tuning tuned = session.tuning(problem(), Arch::SM90A);
  EXPECT_EQ(tuned.tiles.at(KernelKind::LseForward), kFastForward.tile);
  EXPECT_EQ(tuned.forward_ctas, 528);
}

TEST_F(SessionTest, ReadsTheTuningFilesOncePerProblemUntilForgotten) {
  store_winner(a_);
  Session session(runtime::Options::from_env());
  const runtime::Tuning first = session.tuning(problem(), Arch::SM90A);
  EXPECT_FALSE(first == runtime::Tuning{});
  fs::remove_all(fs::path(a_) / "tuning");
  EXPECT_EQ(session.tuning(problem(), Arch::SM90A), first);  // memoized
  session.forget_tunings();
  EXPECT_EQ(session.tuning(problem(), Arch::SM90A), runtime::Tuning{});
}

TEST_F(SessionTest, ReadsTheEnvironmentOnceAndAgainOnReload) {
  Session session(runtime::Options::from_env());
  setenv("LFCE_CACHE_DIR", b_.c_str(), 1);
  EXPECT_EQ(session.cache_dir(), a_);  // not re-read behind the user's back
  session.reload();
  EXPECT_EQ(session.cache_dir(), b_);
  EXPECT_EQ(runtime::Options::current().cache_dir_env, b_);
}

TEST_F(SessionTest, ReloadKeepsADirectoryTheUserSet) {
  Session session(runtime::Options::from_env());
  session.set_cache_dir(b_);
  session.reload();
  EXPECT_EQ(session.cache_dir(), b_);
}

TEST_F(SessionTest, ReloadNamesAMalformedLimitAndKeepsTheOldOptions) {
  Session session(runtime::Options::from_env());
  setenv("LFCE_DEVICE_SMEM_LIMIT", "99KiB", 1);
  try {
    session.reload();
    FAIL() << "a malformed LFCE_DEVICE_SMEM_LIMIT was accepted";
  } catch (const SpecError& e) {
    EXPECT_NE(std::string(e.what()).find("LFCE_DEVICE_SMEM_LIMIT = '99KiB'"), std::string::npos) << e.what();
  }
  EXPECT_EQ(session.cache_dir(), a_);
  setenv("LFCE_DEVICE_SMEM_LIMIT", "101376", 1);
  session.reload();
  EXPECT_EQ(session.options().device_smem_limit, 101376);
}

// LFCE_EXPERIMENTAL=eager_operand switches the GEMMs' operand transform on; a reload with a
// malformed list keeps the options it had.
TEST_F(SessionTest, EagerOperandIsOffUnlessTheExperimentalSwitchAsksForIt) {
  Session session(runtime::Options::from_env());
  EXPECT_FALSE(session.options().eager_operand);
  setenv("LFCE_EXPERIMENTAL", "eager_operand", 1);
  session.reload();
  EXPECT_TRUE(session.options().eager_operand);
  setenv("LFCE_EXPERIMENTAL", "yes", 1);
  try {
    session.reload();
    FAIL() << "a malformed LFCE_EXPERIMENTAL was accepted";
  } catch (const SpecError& e) {
    EXPECT_NE(std::string(e.what()).find("LFCE_EXPERIMENTAL = 'yes': unknown switch 'yes'"), std::string::npos)
        << e.what();
  }
  EXPECT_TRUE(session.options().eager_operand);
  unsetenv("LFCE_EXPERIMENTAL");
  session.reload();
  EXPECT_FALSE(session.options().eager_operand);
}

}  // namespace
}  // namespace lfce::api
