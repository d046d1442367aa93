// Runs disk_cache_helper processes (tests/runtime/disk_cache_helper.cpp) and reads what they
// report, for the tests of a cache shared by several processes.
#pragma once

#include <fcntl.h>
#include <gtest/gtest.h>
#include <sys/wait.h>
#include <unistd.h>

#include <cstdlib>
#include <fstream>
#include <iterator>
#include <sstream>
#include <string>
#include <utility>
#include <vector>

namespace lfce::runtime::testing_helpers {

// Starts `count` helpers with LFCE_CACHE_DIR=cache_dir, all released at once, each running
// `mode` (precompile or load) over `specs`; returns each one's output lines. A helper that
// fails fails the test, with its stderr.
inline std::vector<std::vector<std::string>> run_helpers(const std::string& cache_dir, const std::string& mode,
                                                         const std::vector<std::string>& specs, int count) {
  // $LFCE_DISK_CACHE_HELPER overrides the build's path, for test binaries copied elsewhere.
  const char* env = std::getenv("LFCE_DISK_CACHE_HELPER");
  const std::string helper = env && *env ? env : LFCE_DISK_CACHE_HELPER;
  const std::string go = cache_dir + "/go";
  std::vector<std::pair<pid_t, std::string>> children;
  for (int i = 0; i < count; ++i) {
    const std::string out = cache_dir + "/helper" + std::to_string(i);
    const pid_t pid = fork();
    if (pid == 0) {
      setenv("LFCE_CACHE_DIR", cache_dir.c_str(), 1);
      setenv("LFCE_HELPER_GO", go.c_str(), 1);
      dup2(open((out + ".out").c_str(), O_WRONLY | O_CREAT | O_TRUNC, 0644), 1);
      dup2(open((out + ".err").c_str(), O_WRONLY | O_CREAT | O_TRUNC, 0644), 2);
      std::vector<char*> argv = {const_cast<char*>(helper.c_str()), const_cast<char*>(mode.c_str())};
      for (const std::string& s : specs) argv.push_back(const_cast<char*>(s.c_str()));
      argv.push_back(nullptr);
      execv(helper.c_str(), argv.data());
      _exit(127);
    }
    children.emplace_back(pid, out);
  }
  std::ofstream{go};  // all start now
  std::vector<std::vector<std::string>> outputs;
  for (const auto& [pid, out] : children) {
    int status = 0;
    waitpid(pid, &status, 0);
    std::ifstream err(out + ".err"), lines(out + ".out");
    EXPECT_TRUE(WIFEXITED(status) && WEXITSTATUS(status) == 0)
        << "helper " << pid << " failed:\n" << std::string(std::istreambuf_iterator<char>(err), {});
    outputs.emplace_back();
    for (std::string line; std::getline(lines, line);) outputs.back().push_back(line);
    std::remove((out + ".out").c_str());
    std::remove((out + ".err").c_str());
  }
  std::remove(go.c_str());
  return outputs;
}

// The value of `name=` in a helper's line, as text ("" if absent).
inline std::string field(const std::string& line, const std::string& name) {
  std::istringstream words(line);
  for (std::string word; words >> word;)
    if (word.rfind(name + "=", 0) == 0) return word.substr(name.size() + 1);
  return "";
}

inline double number(const std::string& line, const std::string& name) {
  return std::atof(field(line, name).c_str());
}

}  // namespace lfce::runtime::testing_helpers
