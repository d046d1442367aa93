// The kernel cache through the C API, as a user links it (liblfce.so only; no GPU): what
// lfce_cache_clear accepts as an age, and the status of a cache it cannot use.
#include "lfce/lfce.h"

#include <gtest/gtest.h>
#include <stdlib.h>
#include <unistd.h>

#include <cmath>
#include <filesystem>
#include <limits>
#include <string>

namespace {

namespace fs = std::filesystem;

// A fresh cache directory holding the PTX entries of one small problem for sm_80.
class CacheWithEntries : public ::testing::Test {
 protected:
  void SetUp() override {
    char tmpl[] = "/tmp/lfce_c_api_cache_XXXXXX";
    dir_ = mkdtemp(tmpl);
    ASSERT_EQ(lfce_set_cache_dir((dir_ + "/cache").c_str()), LFCE_OK) << lfce_last_error();
    lfce_problem p{};
    p.tokens = 64;
    p.hidden = 64;
    p.vocab = 1000;
    p.ignore_index = -100;
    ASSERT_EQ(lfce_precompile(&p, "sm_80", nullptr, nullptr), LFCE_OK) << lfce_last_error();
    ASSERT_GT(entries(), 0);
  }
  void TearDown() override {
    std::error_code ec;
    fs::remove_all(dir_, ec);
  }
  static int entries() {
    int count = 0;
    EXPECT_EQ(lfce_cache_list([](const lfce_cache_entry*, void* n) { ++*static_cast<int*>(n); }, &count), LFCE_OK);
    return count;
  }
  std::string dir_;
};

TEST_F(CacheWithEntries, ClearRejectsANegativeOrNonFiniteAgeNamingIt) {
  const int before = entries();
  for (const auto& [days, text] : {std::pair{-1.0, "-1"}, std::pair{std::nan(""), "nan"},
                                   std::pair{-std::numeric_limits<double>::infinity(), "-inf"}}) {
    int64_t removed = -7;
    EXPECT_EQ(lfce_cache_clear(days, &removed, nullptr), LFCE_ERR_INVALID_ARGUMENT) << text;
    EXPECT_NE(std::string(lfce_last_error()).find(text), std::string::npos) << lfce_last_error();
  }
  EXPECT_EQ(entries(), before) << "an invalid age removed entries";
}

TEST_F(CacheWithEntries, ClearWithAgeZeroRemovesEveryEntry) {
  const int before = entries();
  int64_t removed = 0, bytes = 0;
  ASSERT_EQ(lfce_cache_clear(0, &removed, &bytes), LFCE_OK) << lfce_last_error();
  EXPECT_EQ(removed, before);
  EXPECT_GT(bytes, 0);
  EXPECT_EQ(entries(), 0);
}

TEST_F(CacheWithEntries, AKernelsFolderThatIsALinkIsAnIoErrorNamingIt) {
  const std::string kernels = dir_ + "/cache/kernels";
  fs::rename(kernels, dir_ + "/elsewhere");
  fs::create_directory_symlink(dir_ + "/elsewhere", kernels);
  int64_t checked = 0, bad = 0;
  EXPECT_EQ(lfce_cache_verify(1, nullptr, nullptr, &checked, &bad), LFCE_ERR_IO);
  EXPECT_NE(std::string(lfce_last_error()).find(kernels), std::string::npos) << lfce_last_error();
  EXPECT_EQ(lfce_cache_clear(0, nullptr, nullptr), LFCE_ERR_IO);
  EXPECT_FALSE(fs::is_empty(dir_ + "/elsewhere")) << "files behind the link were removed";
}

}  // namespace
