// Driver-API tests that need no GPU. This binary points LFCE_LIBCUDA at a
// missing file before main(), so every test sees "no driver" even on a
// machine with a GPU: keep it a test executable of its own.
#include "runtime/driver.h"

#include <gtest/gtest.h>

#include <cstdlib>
#include <string>

#include "runtime/module.h"

namespace lfce::runtime {
namespace {

constexpr const char* kMissingLibcuda = "/nonexistent/libcuda.so.1";

// Runs during static initialisation, before any test can call Driver::get(),
// which reads LFCE_LIBCUDA once per process.
const bool kDriverForcedMissing =
    setenv("LFCE_LIBCUDA", kMissingLibcuda, /*overwrite=*/1) == 0;

bool contains(const std::string& text, const std::string& part) {
  return text.find(part) != std::string::npos;
}

TEST(CudaError, MessageNamesCallAndCode) {
  const CudaError error(CUDA_ERROR_INVALID_VALUE, "cuLaunchKernel");
  const std::string message = error.what();
  EXPECT_TRUE(contains(message, "cuLaunchKernel")) << message;
  EXPECT_TRUE(contains(message, "CUDA_ERROR_INVALID_VALUE")) << message;
  EXPECT_TRUE(contains(message, "(1)")) << message;
}

TEST(CudaError, KeepsCodeCallAndDetail) {
  const CudaError error(CUDA_ERROR_OUT_OF_MEMORY, "cuModuleLoadDataEx",
                        "loading kernel lse_forward");
  EXPECT_EQ(error.code(), CUDA_ERROR_OUT_OF_MEMORY);
  EXPECT_EQ(error.call(), "cuModuleLoadDataEx");
  EXPECT_TRUE(contains(error.what(), "loading kernel lse_forward"))
      << error.what();
}

TEST(CudaError, NamesCommonCodesWithoutDriver) {
  ASSERT_EQ(Driver::loaded(), nullptr);
  EXPECT_TRUE(contains(CudaError(CUDA_ERROR_ILLEGAL_ADDRESS, "x").what(),
                       "CUDA_ERROR_ILLEGAL_ADDRESS"));
  EXPECT_TRUE(contains(CudaError(CUDA_ERROR_INVALID_PTX, "x").what(),
                       "CUDA_ERROR_INVALID_PTX"));
}

TEST(CudaError, FallsBackToTheNumberForUnknownCodes) {
  const std::string message =
      CudaError(static_cast<CUresult>(12345), "x").what();
  EXPECT_TRUE(contains(message, "12345")) << message;
}

TEST(Check, ThrowsCudaErrorNamingTheCall) {
  try {
    check(CUDA_ERROR_LAUNCH_OUT_OF_RESOURCES, "cuLaunchKernel");
    FAIL() << "check did not throw";
  } catch (const CudaError& e) {
    EXPECT_EQ(e.code(), CUDA_ERROR_LAUNCH_OUT_OF_RESOURCES);
    EXPECT_EQ(e.call(), "cuLaunchKernel");
    EXPECT_TRUE(contains(e.what(), "CUDA_ERROR_LAUNCH_OUT_OF_RESOURCES"))
        << e.what();
  }
}

TEST(Driver, ReportsMissingDriverWithClearMessage) {
  ASSERT_TRUE(kDriverForcedMissing);
  try {
    Driver::get();
    FAIL() << "Driver::get() loaded " << kMissingLibcuda;
  } catch (const DriverUnavailable& e) {
    const std::string message = e.what();
    EXPECT_TRUE(contains(message, "NVIDIA driver")) << message;
    EXPECT_TRUE(contains(message, "generate kernels")) << message;
    EXPECT_TRUE(contains(message, "cannot launch")) << message;
    EXPECT_TRUE(contains(message, kMissingLibcuda)) << message;  // dlerror()
    EXPECT_TRUE(contains(e.call(), "dlopen")) << e.call();
  }
}

TEST(Driver, RemembersFailedLoad) {
  std::string first, second;
  try {
    Driver::get();
  } catch (const DriverUnavailable& e) {
    first = e.what();
  }
  try {
    Driver::get();
  } catch (const DriverUnavailable& e) {
    second = e.what();
  }
  EXPECT_FALSE(first.empty());
  EXPECT_EQ(first, second);
  EXPECT_EQ(Driver::loaded(), nullptr);
}

TEST(Driver, UnavailableIsACudaError) {
  EXPECT_THROW(Driver::get(), CudaError);
}

DeviceInfo device(int major, int minor) {
  DeviceInfo info;
  info.ordinal = 0;
  info.cc_major = major;
  info.cc_minor = minor;
  info.name = "Test GPU";
  return info;
}

TEST(DeviceInfo, UsesSm90aOnHopper) {
  EXPECT_EQ(device(9, 0).arch(), Arch::SM90A);
}

TEST(DeviceInfo, FallsBackToSm80OnOtherAmpereOrNewer) {
  for (auto [major, minor] :
       {std::pair{8, 0}, {8, 6}, {8, 9}, {10, 0}, {12, 0}}) {
    EXPECT_EQ(device(major, minor).arch(), Arch::SM80)
        << "compute capability " << major << "." << minor;
  }
}

TEST(DeviceInfo, RejectsPreAmpereNamingTheRequirement) {
  try {
    device(7, 5).arch();
    FAIL() << "sm_75 was accepted";
  } catch (const std::invalid_argument& e) {
    EXPECT_TRUE(contains(e.what(), "Ampere")) << e.what();
    EXPECT_TRUE(contains(e.what(), "7.5")) << e.what();
  }
}

TEST(DeviceInfo, NeedsTheDriver) {
  EXPECT_THROW(device_info(0), DriverUnavailable);
}

TEST(Context, NeedsTheDriver) {
  EXPECT_THROW(make_context_current(0), DriverUnavailable);
}

TEST(LoadedKernel, ReportsMissingDriverInsteadOfLoading) {
  EXPECT_THROW(LoadedKernel(0, ".version 8.5\n.target sm_90a\n", "k", 0),
               DriverUnavailable);
}

TEST(CompileError, CarriesTheJitLog) {
  const CompileError error("driver JIT failed to compile kernel 'k'",
                           "ptxas fatal: Unresolved extern function 'f'");
  EXPECT_EQ(error.log(), "ptxas fatal: Unresolved extern function 'f'");
  EXPECT_TRUE(contains(error.what(), "kernel 'k'")) << error.what();
  EXPECT_TRUE(contains(error.what(), "Unresolved extern")) << error.what();
}

}  // namespace
}  // namespace lfce::runtime
