// Reading persisted tunings is the runtime's: this test links lfce_runtime (and the layers
// below it) but not the autotuner, writes tuning files as text, and reads them back through
// runtime::TuningFiles and runtime::stored_tuning(). Keys hold the device's limits class, so a
// winner tuned on a 227 KiB GPU is never looked up for a 99 KiB one; files of the older
// format (no limits in the key) read as "no winner", quietly.
#include "runtime/tuning_files.h"

#include <gtest/gtest.h>
#include <stdlib.h>

#include <filesystem>
#include <fstream>
#include <nlohmann/json.hpp>
#include <string>

#include "tests/log_capture.h"

namespace lfce::runtime {
namespace {

namespace fs = std::filesystem;
using testing_log::WarningCapture;

constexpr DeviceLimits kH200{227 * 1024, 132};
constexpr DeviceLimits kL40S{99 * 1024, 142};

Problem problem() {
  Problem p;
  p.tokens = 8192;
  p.hidden = 4096;
  p.vocab = 128256;
  p.workspace_budget = kDefaultWorkspaceBudget;
  return p;
}

// 128x128x64 in 2 stages fits 99 KiB and 227 KiB alike: only the key can keep it apart.
const Candidate kWinner{KernelKind::GradWeight, TileConfig{128, 128, 64, 2, 4, 2}, 0, 0};

class TuningFilesTest : public testing::Test {
 protected:
  void SetUp() override {
    char tmpl[] = "/tmp/lfce_tuning_files_XXXXXX";
    dir_ = mkdtemp(tmpl);
  }
  void TearDown() override { fs::remove_all(dir_); }

  // A tuning file as `lfce tune` writes it (autotune/tuning_store.cpp), by hand.
  std::string write(const TuningKey& key, const Candidate& winner, int format = kTuningFormat) {
    nlohmann::ordered_json j = {{"format", format},
                                {"key", key_json(key)},
                                {"tokens", 8192},
                                {"device", "NVIDIA H200"},
                                {"default", "128x256x64/2x4/s2"},
                                {"measured_with", nlohmann::json::object()},
                                {"candidates",
                                 {{{"config", "128x256x64/2x4/s2"}, {"ms", 2.0}},
                                  {{"config", winner.text()}, {"ms", 1.5}}}}};
    const TuningFiles files(dir_);
    fs::create_directories(files.dir());
    std::ofstream(files.path(key)) << j.dump(2);
    return files.path(key);
  }

  std::string dir_;
};

TEST_F(TuningFilesTest, RuntimeReadsAWinnerWithoutTheAutotuner) {
  write(TuningKey::of(KernelKind::GradWeight, problem(), Arch::SM90A, kH200), kWinner);
  const Tuning tuned = stored_tuning(TuningFiles(dir_), problem(), Arch::SM90A, kH200);
  EXPECT_EQ(tuned.tiles.at(KernelKind::GradWeight), kWinner.tile);
  EXPECT_EQ(tuned.tiles.size(), 1u);
}

TEST_F(TuningFilesTest, WinnerTunedOnA227KiBDeviceIsNotLookedUpForA99KiBOne) {
  const TuningKey big = TuningKey::of(KernelKind::GradWeight, problem(), Arch::SM90A, kH200);
  const TuningKey small = TuningKey::of(KernelKind::GradWeight, problem(), Arch::SM90A, kL40S);
  EXPECT_FALSE(big == small);
  EXPECT_NE(TuningFiles(dir_).path(big), TuningFiles(dir_).path(small));
  EXPECT_NE(big.text().find("smem232448-sms132"), std::string::npos) << big.text();
  write(big, kWinner);
  EXPECT_EQ(stored_tuning(TuningFiles(dir_), problem(), Arch::SM90A, kL40S), Tuning{});
  EXPECT_FALSE(stored_tuning(TuningFiles(dir_), problem(), Arch::SM90A, kH200) == Tuning{});
}

TEST_F(TuningFilesTest, WinnerTunedOnAnotherSmCountIsNotLookedUp) {
  write(TuningKey::of(KernelKind::GradWeight, problem(), Arch::SM90A, kH200), kWinner);
  EXPECT_EQ(stored_tuning(TuningFiles(dir_), problem(), Arch::SM90A, DeviceLimits{kH200.smem_per_block, 108}),
            Tuning{});
}

TEST_F(TuningFilesTest, UnknownLimitsAreTheArchTablesAsThePlanFillsThem) {
  // Offline (no device): the arch table's shared memory and kDefaultForwardCtas, as Plan uses.
  EXPECT_EQ(TuningKey::of(KernelKind::GradWeight, problem(), Arch::SM90A),
            TuningKey::of(KernelKind::GradWeight, problem(), Arch::SM90A, DeviceLimits{227 * 1024, kDefaultForwardCtas}));
  // A device reporting more than the table (never trusted beyond it) shares the table's key.
  EXPECT_EQ(TuningKey::of(KernelKind::GradWeight, problem(), Arch::SM90A, DeviceLimits{1 << 20, 132}),
            TuningKey::of(KernelKind::GradWeight, problem(), Arch::SM90A, kH200));
}

TEST_F(TuningFilesTest, FileOfTheOlderFormatReadsAsNoWinnerWithoutAWarning) {
  const TuningKey key = TuningKey::of(KernelKind::GradWeight, problem(), Arch::SM90A, kH200);
  write(key, kWinner, kTuningFormat - 1);
  WarningCapture log;
  EXPECT_FALSE(TuningFiles(dir_).load(key));
  EXPECT_EQ(stored_tuning(TuningFiles(dir_), problem(), Arch::SM90A, kH200), Tuning{});
  EXPECT_EQ(log.text(), "");
}

TEST_F(TuningFilesTest, FileOfANewerFormatReadsAsNoWinnerNamingTheFormat) {
  const TuningKey key = TuningKey::of(KernelKind::GradWeight, problem(), Arch::SM90A, kH200);
  const std::string path = write(key, kWinner, kTuningFormat + 1);
  WarningCapture log;
  EXPECT_FALSE(TuningFiles(dir_).load(key));
  EXPECT_NE(log.text().find(path), std::string::npos) << log.text();
  EXPECT_NE(log.text().find("format " + std::to_string(kTuningFormat + 1)), std::string::npos) << log.text();
}

}  // namespace
}  // namespace lfce::runtime
