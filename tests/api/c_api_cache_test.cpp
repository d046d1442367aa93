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
#include <utility>
#include <vector>

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

// Offline precompilation for a GPU other than the arch's reference: its limits change the default
// tiles (a 99 KiB GPU cannot run the H200's), so the kernels it would load.
lfce_problem problem(int64_t tokens, int64_t hidden, int64_t vocab) {
  lfce_problem p{};
  p.tokens = tokens;
  p.hidden = hidden;
  p.vocab = vocab;
  p.ignore_index = -100;
  return p;
}

std::vector<std::string> precompiled_specs(const lfce_problem& p, const char* arch, const lfce_device_limits* limits) {
  std::vector<std::string> specs;
  const int status = lfce_precompile_for(
      &p, arch, limits,
      [](const lfce_precompiled* k, void* out) { static_cast<std::vector<std::string>*>(out)->push_back(k->spec); },
      &specs);
  EXPECT_EQ(status, LFCE_OK) << lfce_last_error();
  return specs;
}

TEST_F(CacheWithEntries, PrecompileForADeviceWithLessSharedMemoryPicksOtherTiles) {
  const lfce_problem p = problem(8192, 4096, 128256);
  const lfce_device_limits reference{0, 0}, small{108, 101376};  // 99 KiB, 108 SMs (A100-class)
  for (const char* arch : {"sm_90a", "sm_80"}) {
    const std::vector<std::string> plain = precompiled_specs(p, arch, nullptr);
    EXPECT_EQ(precompiled_specs(p, arch, &reference), plain) << arch << ": zeros are the reference device";
    const std::vector<std::string> limited = precompiled_specs(p, arch, &small);
    ASSERT_EQ(limited.size(), plain.size());
    int changed = 0;
    for (size_t i = 0; i < plain.size(); ++i) changed += limited[i] != plain[i];
    EXPECT_GT(changed, 0) << arch << ": the H200's tiles do not fit 99 KiB, yet no spec changed";
  }
}

// With an entropy or logprob output the backward that differentiates it (grad_lse) is precompiled
// too: one more dlogits_backward, with lse_grad; the predicted ids alone need none.
TEST_F(CacheWithEntries, PrecompileWithDifferentiableOutputsAddsTheirBackwardKernel) {
  lfce_problem p = problem(64, 64, 1000);
  const std::vector<std::string> plain = precompiled_specs(p, "sm_80", nullptr);
  p.outputs = LFCE_OUTPUT_PREDICTED;
  EXPECT_EQ(precompiled_specs(p, "sm_80", nullptr).size(), plain.size());
  p.outputs = LFCE_OUTPUT_ENTROPY | LFCE_OUTPUT_LOGPROB;
  const std::vector<std::string> specs = precompiled_specs(p, "sm_80", nullptr);
  ASSERT_EQ(specs.size(), plain.size() + 1);
  EXPECT_EQ(specs.back().rfind("dlogits_backward;", 0), 0u) << specs.back();
  EXPECT_NE(specs.back().find(";entropy=1;logprob=1;lse_grad=1"), std::string::npos) << specs.back();
  int with_lse_grad = 0;
  for (const std::string& s : specs) with_lse_grad += s.find("lse_grad=1") != std::string::npos;
  EXPECT_EQ(with_lse_grad, 1);
}

// A GPU whose shared memory per block is below what the smallest tile needs: LFCE_ERR_OUT_OF_RESOURCES,
// and lfce_last_resource_error gives the resource, the bytes required and the limit; any later
// outcome (a success, another error) clears them; NULL outputs are refused.
TEST_F(CacheWithEntries, PrecompileForATooSmallSharedMemoryIsOutOfResourcesWithItsNumbers) {
  const lfce_problem p = problem(64, 64, 1000);
  const lfce_device_limits small{0, 1024};
  ASSERT_EQ(lfce_precompile_for(&p, "sm_80", &small, nullptr, nullptr), LFCE_ERR_OUT_OF_RESOURCES) << lfce_last_error();
  EXPECT_NE(std::string(lfce_last_error()).find("shared memory per block = 1024 bytes"), std::string::npos)
      << lfce_last_error();
  const char* resource = nullptr;
  int64_t required = 0, limit = 0;
  EXPECT_EQ(lfce_last_resource_error(nullptr, &required, &limit), LFCE_ERR_INVALID_ARGUMENT);
  ASSERT_EQ(lfce_last_resource_error(&resource, &required, &limit), LFCE_OK);
  EXPECT_STREQ(resource, "shared memory per block");
  EXPECT_EQ(limit, 1024);
  EXPECT_GT(required, 1024);
  // The limit it names is enough: precompiling with it succeeds, and the numbers are gone.
  const lfce_device_limits enough{0, static_cast<int32_t>(required)};
  EXPECT_EQ(lfce_precompile_for(&p, "sm_80", &enough, nullptr, nullptr), LFCE_OK) << lfce_last_error();
  EXPECT_EQ(lfce_last_resource_error(&resource, &required, &limit), LFCE_ERR_INVALID_ARGUMENT);
  const lfce_device_limits negative{0, -5};
  EXPECT_EQ(lfce_precompile_for(&p, "sm_80", &negative, nullptr, nullptr), LFCE_ERR_INVALID_ARGUMENT);
  EXPECT_EQ(lfce_last_resource_error(&resource, &required, &limit), LFCE_ERR_INVALID_ARGUMENT);
}

TEST_F(CacheWithEntries, PrecompileForRejectsLimitsOutOfRangeNamingThem) {
  const lfce_problem p = problem(64, 64, 1000);
  for (const auto& [limits, name] : {std::pair{lfce_device_limits{-1, 0}, "sm_count = -1"},
                                     std::pair{lfce_device_limits{(1 << 20) + 1, 0}, "sm_count = 1048577"},
                                     std::pair{lfce_device_limits{0, -5}, "smem_per_block = -5"},
                                     std::pair{lfce_device_limits{0, (1 << 30) + 1}, "smem_per_block = 1073741825"}}) {
    EXPECT_EQ(lfce_precompile_for(&p, "sm_80", &limits, nullptr, nullptr), LFCE_ERR_INVALID_ARGUMENT) << name;
    EXPECT_NE(std::string(lfce_last_error()).find(name), std::string::npos) << lfce_last_error();
  }
}
