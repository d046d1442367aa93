// How a C++ GPU test (label gpu) chooses between running, skipping and failing, as
// tests/python/conftest.py does for the Python suite: on a machine without a GPU it skips,
// visibly; on a machine that should have one (/dev/nvidia0 exists, or LFCE_REQUIRE_GPU=1) a
// driver or device that cannot be used FAILS with the reason. A GPU test never skips silently
// on a GPU machine.
#pragma once

#include <gtest/gtest.h>
#include <unistd.h>

#include <cstdlib>
#include <exception>
#include <string>

#include "runtime/driver.h"

namespace lfce::testing_gpu {

inline bool gpu_expected() {
  const char* require = std::getenv("LFCE_REQUIRE_GPU");
  return access("/dev/nvidia0", F_OK) == 0 || (require && std::string(require) == "1");
}

// Why device 0 cannot be used, or "" when it can.
inline std::string gpu_unusable_reason() {
  try {
    runtime::device_info(0);
    return "";
  } catch (const std::exception& e) {
    return e.what();
  }
}

}  // namespace lfce::testing_gpu

// For SetUp(): when device 0 cannot be used, skips the test (no GPU here) or fails it (this
// machine should have one), and returns from SetUp() either way.
#define LFCE_SKIP_OR_FAIL_WITHOUT_GPU()                                                                    \
  do {                                                                                                     \
    const std::string lfce_unusable = ::lfce::testing_gpu::gpu_unusable_reason();                          \
    if (!lfce_unusable.empty()) {                                                                          \
      if (::lfce::testing_gpu::gpu_expected())                                                             \
        FAIL() << "this machine should have a GPU (/dev/nvidia0 exists or LFCE_REQUIRE_GPU=1) but device " \
                  "0 cannot be used: "                                                                     \
               << lfce_unusable;                                                                           \
      GTEST_SKIP() << "no CUDA GPU: " << lfce_unusable;                                                    \
    }                                                                                                      \
  } while (0)
