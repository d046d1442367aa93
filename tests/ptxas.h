// Assembling generated PTX with the CUDA toolkit's ptxas (found at configure time: LFCE_PTXAS)
// and reading its resource report. No GPU.
#pragma once

#include <gtest/gtest.h>
#include <unistd.h>

#include <cstdio>
#include <fstream>
#include <regex>
#include <string>

#include "compiler/arch.h"

namespace lfce::testing_ptxas {

inline bool have_ptxas() {
  const std::string path = LFCE_PTXAS;
  return !path.empty() && path.find("NOTFOUND") == std::string::npos;
}

struct PtxasReport {
  int status = -1;
  std::string log;
};

inline PtxasReport assemble(const std::string& ptx, Arch arch) {
  char path[] = "/tmp/lfce_codegen_XXXXXX";
  int fd = mkstemp(path);
  EXPECT_GE(fd, 0);
  close(fd);
  std::ofstream(path) << ptx;
  std::string cmd = std::string(LFCE_PTXAS) + " -arch=" + std::string(arch_name(arch)) + " -v -o /dev/null " + path + " 2>&1";
  PtxasReport report;
  FILE* pipe = popen(cmd.c_str(), "r");
  char buf[512];
  while (fgets(buf, sizeof buf, pipe)) report.log += buf;
  report.status = pclose(pipe);
  std::remove(path);
  return report;
}

// Asserts that ptxas accepts `ptx` for `arch` and spills nothing (stores and loads).
// `spill_bytes`: the spill stores (and loads) allowed, 0 unless a caller says why.
inline void expect_assembles_without_spills(const std::string& ptx, Arch arch, int spill_bytes = 0) {
  PtxasReport r = assemble(ptx, arch);
  ASSERT_EQ(r.status, 0) << r.log;
  std::smatch m;
  ASSERT_TRUE(std::regex_search(r.log, m, std::regex(R"((\d+) bytes spill stores, (\d+) bytes spill loads)"))) << r.log;
  EXPECT_LE(std::stoi(m[1]), spill_bytes) << r.log;
  EXPECT_LE(std::stoi(m[2]), spill_bytes) << r.log;
  // ptxas's C7515: a subroutine call or a non-wgmma write of an accumulator between wgmmas makes
  // it serialise every wgmma (each waits for the previous one): about 0.6x of the tensor rate.
  EXPECT_EQ(r.log.find("wgmma.mma_async instructions are serialized"), std::string::npos) << r.log;
}

}  // namespace lfce::testing_ptxas
