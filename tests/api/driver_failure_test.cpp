// Every driver call lfce makes, made to fail one at a time, with no GPU: a stand-in libcuda
// (fake_libcuda.c, through LFCE_LIBCUDA) succeeds at everything but the one call named in
// LFCE_FAKE_CUDA_FAIL. Each case runs in a fresh process (driver_failure_probe.cpp: lfce loads
// the driver and reads its options once per process), which must exit on its own, neither
// crashing nor hanging, and the C API must return LFCE_ERR_CUDA with a message naming the call.
//
// The calls are not listed here: a first run with every call succeeding logs the ones lfce
// makes (LFCE_FAKE_CUDA_LOG), cold (empty cache: LLVM, then the driver's JIT) and warm (the
// cubins from the disk cache); each call is then failed on the path that makes it.
#include <gtest/gtest.h>
#include <signal.h>
#include <stdlib.h>
#include <sys/wait.h>
#include <unistd.h>

#include <algorithm>
#include <chrono>
#include <filesystem>
#include <fstream>
#include <map>
#include <set>
#include <sstream>
#include <string>
#include <thread>
#include <vector>

#include "lfce/lfce.h"

namespace {

namespace fs = std::filesystem;

std::string read_text(const fs::path& path) {
  std::ifstream in(path);
  std::stringstream s;
  s << in.rdbuf();
  return s.str();
}

bool contains(const std::string& text, const std::string& part) { return text.find(part) != std::string::npos; }

struct Outcome {
  std::string how;   // "" when the process exited by itself with status 0, else what went wrong
  int status = -1;   // the C API's return code
  std::string message;
  std::string output;  // everything the probe printed
};

class DriverFailure : public testing::Test {
 protected:
  void SetUp() override {
    char tmpl[] = "/tmp/lfce_driver_failure_XXXXXX";
    root_ = mkdtemp(tmpl);
  }
  void TearDown() override { fs::remove_all(root_); }

  fs::path fresh_dir() {
    const fs::path dir = root_ / ("case" + std::to_string(cases_++));
    fs::create_directories(dir);
    return dir;
  }

  // The probe in a process of its own, with the fake libcuda and `env`; killed after a minute.
  Outcome probe(const std::string& scenario, const fs::path& cache_dir, const std::map<std::string, std::string>& env) {
    const std::string n = std::to_string(probes_++);
    const fs::path out = root_ / ("probe" + n + ".out"), err = root_ / ("probe" + n + ".err");
    const pid_t pid = fork();
    if (pid == 0) {
      setenv("LFCE_LIBCUDA", LFCE_FAKE_LIBCUDA, 1);
      setenv("LFCE_CACHE_DIR", cache_dir.c_str(), 1);
      unsetenv("LFCE_DEVICE_SMEM_LIMIT");
      unsetenv("LFCE_DEVICE_SM_COUNT");
      for (const auto& [name, value] : env) setenv(name.c_str(), value.c_str(), 1);
      if (!freopen(out.c_str(), "w", stdout) || !freopen(err.c_str(), "w", stderr)) _exit(126);
      execl(LFCE_DRIVER_FAILURE_PROBE, LFCE_DRIVER_FAILURE_PROBE, scenario.c_str(), static_cast<char*>(nullptr));
      _exit(127);
    }
    Outcome o;
    int wstatus = 0;
    const auto deadline = std::chrono::steady_clock::now() + std::chrono::seconds(60);
    while (waitpid(pid, &wstatus, WNOHANG) == 0) {
      if (std::chrono::steady_clock::now() > deadline) {
        kill(pid, SIGKILL);
        waitpid(pid, &wstatus, 0);
        o.how = "hung (killed after 60 s)";
        break;
      }
      std::this_thread::sleep_for(std::chrono::milliseconds(5));
    }
    if (o.how.empty() && WIFSIGNALED(wstatus)) o.how = "killed by signal " + std::to_string(WTERMSIG(wstatus));
    if (o.how.empty() && (!WIFEXITED(wstatus) || WEXITSTATUS(wstatus) != 0))
      o.how = "exited with " + std::to_string(WEXITSTATUS(wstatus));
    o.output = read_text(out);
    if (!o.how.empty()) o.how += "; stderr: " + read_text(err);
    if (auto at = o.output.find("status="); at != std::string::npos) o.status = std::atoi(o.output.c_str() + at + 7);
    if (auto at = o.output.find("message="); at != std::string::npos) o.message = o.output.substr(at + 8);
    return o;
  }

  // The distinct driver calls a successful run of `scenario` makes in `cache_dir`, in order.
  std::vector<std::string> calls_made(const std::string& scenario, const fs::path& cache_dir) {
    const fs::path log = root_ / "calls.log";
    fs::remove(log);
    const Outcome o = probe(scenario, cache_dir, {{"LFCE_FAKE_CUDA_LOG", log.string()}});
    EXPECT_EQ(o.how, "");
    EXPECT_EQ(o.status, LFCE_OK) << o.message;
    std::vector<std::string> calls;
    std::istringstream lines(read_text(log));
    for (std::string line; std::getline(lines, line);)
      if (std::find(calls.begin(), calls.end(), line) == calls.end()) calls.push_back(line);
    return calls;
  }

  // A copy of `warm` (its kernels), without tuning files (so that a sweep measures again).
  fs::path copy_of(const fs::path& warm) {
    const fs::path dir = fresh_dir();
    fs::copy(warm, dir, fs::copy_options::recursive);
    fs::remove_all(dir / "tuning");
    return dir;
  }

  // Each call of a successful run of `scenario` but those in `skip`, failed: `check` judges
  // each outcome.
  template <typename Check>
  void fail_each_call(const std::string& scenario, const std::vector<std::string>& must_include,
                      const std::vector<std::string>& skip, Check check) {
    const fs::path warm = fresh_dir();
    const std::vector<std::string> cold_calls = calls_made(scenario, warm);  // fills the cache
    fs::remove_all(warm / "tuning");
    const std::vector<std::string> warm_calls = calls_made(scenario, warm);
    for (const std::string& call : must_include)
      EXPECT_NE(std::find(cold_calls.begin(), cold_calls.end(), call), cold_calls.end()) << call << " was not called";
    for (const std::string& call : cold_calls) {
      if (std::find(skip.begin(), skip.end(), call) != skip.end()) continue;
      const bool on_warm_path = std::find(warm_calls.begin(), warm_calls.end(), call) != warm_calls.end();
      SCOPED_TRACE(call + (on_warm_path ? " (warm cache)" : " (cold cache)"));
      const Outcome o = probe(scenario, on_warm_path ? copy_of(warm) : fresh_dir(), {{"LFCE_FAKE_CUDA_FAIL", call}});
      EXPECT_EQ(o.how, "") << "the process must end by itself, cleanly";
      check(call, o);
    }
  }

  fs::path root_;
  int cases_ = 0, probes_ = 0;
};

// Calls whose failure lfce survives by design: cleanup (cuLinkDestroy, cuModuleUnload,
// cuMemFree, cuEventDestroy: nothing to do about it), and cuCtxGetDevice (a failure means the
// current context was destroyed: lfce replaces it). cuGetErrorName / cuGetErrorString only
// name errors; lfce falls back to its own names.
const std::set<std::string> kSurvivable = {"cuLinkDestroy", "cuModuleUnload", "cuMemFree",     "cuEventDestroy",
                                           "cuCtxGetDevice", "cuGetErrorName", "cuGetErrorString"};

TEST_F(DriverFailure, EveryCallOfForwardAndBackwardFailsWithACudaErrorNamingIt) {
  fail_each_call("run",
                 {"cuInit", "cuDeviceGetAttribute", "cuDevicePrimaryCtxRetain", "cuLinkAddData", "cuLinkComplete",
                  "cuModuleLoadDataEx", "cuModuleGetFunction", "cuFuncGetAttribute", "cuLaunchKernel"},
                 {}, [](const std::string& call, const Outcome& o) {
                   if (kSurvivable.count(call)) {
                     EXPECT_EQ(o.status, LFCE_OK) << o.message;
                     return;
                   }
                   EXPECT_EQ(o.status, LFCE_ERR_CUDA) << o.output;
                   EXPECT_TRUE(contains(o.message, call)) << o.message;
                 });
}

// A sweep keeps a failing candidate as data (+inf and the reason, in the tuning file) and goes
// on; a failure outside any one candidate (setting up the device, its buffers) ends it with
// LFCE_ERR_CUDA. Either way the call is named. The calls a forward or backward makes as well
// are failed in the test above only (each case is a process: the suite stays fast).
TEST_F(DriverFailure, EveryCallOfATuneFailsWithACudaErrorOrAFailedCandidateNamingIt) {
  const std::vector<std::string> covered = calls_made("run", fresh_dir());
  fail_each_call("tune", {"cuMemAlloc", "cuMemcpyHtoD", "cuEventCreate", "cuEventElapsedTime", "cuCtxSynchronize"},
                 covered, [](const std::string& call, const Outcome& o) {
                   if (kSurvivable.count(call)) {
                     EXPECT_EQ(o.status, LFCE_OK) << o.message;
                     return;
                   }
                   if (o.status == LFCE_ERR_CUDA) {
                     EXPECT_TRUE(contains(o.message, call)) << o.message;
                     return;
                   }
                   ASSERT_EQ(o.status, LFCE_OK) << o.output;
                   // Candidates failed: their reasons, in the tuning files, name the call.
                   std::string reasons;
                   std::istringstream lines(o.output);
                   for (std::string line; std::getline(lines, line);)
                     if (auto at = line.find(" path="); line.rfind("result ", 0) == 0 && at != std::string::npos)
                       reasons += read_text(line.substr(at + 6));
                   EXPECT_TRUE(contains(o.output, "failed=")) << o.output;
                   EXPECT_TRUE(contains(reasons, call)) << o.output << reasons;
                 });
}

TEST_F(DriverFailure, AnEntryPointTheDriverLacksIsACudaErrorNamingIt) {
  const Outcome o = probe("run", fresh_dir(), {{"LFCE_FAKE_CUDA_UNRESOLVED", "cuLinkComplete"}});
  EXPECT_EQ(o.how, "");
  EXPECT_EQ(o.status, LFCE_ERR_CUDA) << o.output;
  EXPECT_TRUE(contains(o.message, "cuGetProcAddress(cuLinkComplete)")) << o.message;
}

}  // namespace
