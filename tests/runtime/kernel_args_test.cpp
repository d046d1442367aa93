// Kernel arguments bound by name (runtime/kernel_args.h): every declared parameter gets the value
// of its name and type, in the kernel's order, and each defect is an InternalError naming the
// kernel and the argument, before any launch.
#include <gtest/gtest.h>

#include <cstring>
#include <string>

#include "compiler/errors.h"
#include "runtime/kernel_args.h"
#include "templates/templates.h"

namespace lfce::runtime {
namespace {

const KernelSignature kSignature = {
    {"x", ParamType::GlobalPtr}, {"n", ParamType::I64}, {"splits", ParamType::I32}, {"scale", ParamType::F32}};

std::string bind_error(const KernelArgs& args, const KernelSignature& params = kSignature) {
  try {
    args.bind("lse_forward;V=8", params);
  } catch (const InternalError& e) {
    return e.what();
  }
  return "(no error)";
}

template <typename T>
T read(void* p) {
  T value;
  std::memcpy(&value, p, sizeof value);
  return value;
}

TEST(KernelArgs, BindsEachDeclaredParameterByNameInTheKernelsOrder) {
  float buffer[4];
  KernelArgs args;
  args.set("scale", 0.5f);
  args.set("n", int64_t{1000});
  args.set("splits", int32_t{3});
  args.set("x", buffer);
  const std::vector<void*> bound = args.bind("k", kSignature);
  ASSERT_EQ(bound.size(), 4u);
  EXPECT_EQ(read<void*>(bound[0]), static_cast<void*>(buffer));
  EXPECT_EQ(read<int64_t>(bound[1]), 1000);
  EXPECT_EQ(read<int32_t>(bound[2]), 3);
  EXPECT_EQ(read<float>(bound[3]), 0.5f);
}

TEST(KernelArgs, AKernelTakesTheOfferedValuesItDeclaresAndIgnoresTheRest) {
  OfferedArgs schedule;
  schedule.set("x", static_cast<const void*>(nullptr));
  schedule.set("n", int64_t{7});
  schedule.set("splits", int32_t{1});
  schedule.set("scale", 1.f);
  schedule.set("class_weight", static_cast<const float*>(nullptr));  // declared by another kernel only
  EXPECT_EQ(KernelArgs(schedule).bind("k", kSignature).size(), 4u);
}

TEST(KernelArgs, AChunksValueHidesTheSchedulesOfTheSameName) {
  OfferedArgs schedule;
  schedule.set("x", static_cast<const void*>(nullptr));
  schedule.set("n", int64_t{7});
  schedule.set("splits", int32_t{1});
  schedule.set("scale", 1.f);
  OfferedArgs chunk(&schedule);
  chunk.set("n", int64_t{5});
  const std::vector<void*> bound = KernelArgs(chunk).bind("k", kSignature);
  EXPECT_EQ(read<int64_t>(bound[1]), 5);
}

TEST(KernelArgs, AMissingArgumentNamesTheKernelAndTheParameter) {
  OfferedArgs schedule;
  schedule.set("x", static_cast<const void*>(nullptr));
  schedule.set("n", int64_t{7});
  schedule.set("scale", 1.f);
  EXPECT_EQ(bind_error(schedule), "kernel lse_forward;V=8: no value for its parameter 'splits' (i32)");
}

TEST(KernelArgs, AWronglyTypedArgumentNamesBothTypes) {
  OfferedArgs schedule;
  schedule.set("x", static_cast<const void*>(nullptr));
  schedule.set("n", int32_t{7});  // the kernel takes an i64
  schedule.set("splits", int32_t{1});
  schedule.set("scale", 1.f);
  EXPECT_EQ(bind_error(schedule), "kernel lse_forward;V=8: its parameter 'n' is i64, the launch passes i32");
}

TEST(KernelArgs, AnArgumentOfTheLaunchItsKernelDoesNotDeclareIsAnError) {
  OfferedArgs schedule;
  schedule.set("x", static_cast<const void*>(nullptr));
  schedule.set("n", int64_t{7});
  schedule.set("splits", int32_t{1});
  schedule.set("scale", 1.f);
  KernelArgs args(schedule);
  args.set("grad_lse", static_cast<const float*>(nullptr));
  EXPECT_EQ(bind_error(args),
            "kernel lse_forward;V=8: the launch passes 'grad_lse', which the kernel does not declare");
}

TEST(KernelArgs, ANameSetTwiceInOneScopeIsAnError) {
  OfferedArgs schedule;
  schedule.set("n", int64_t{7});
  try {
    schedule.set("n", int64_t{8});
    FAIL() << "no error";
  } catch (const InternalError& e) {
    EXPECT_STREQ(e.what(), "kernel arguments: 'n' is set twice");
  }
}

TEST(KernelArgs, ATensorMapIsPassedByValue) {
  CUtensorMap map;
  std::memset(&map, 0xab, sizeof map);
  KernelArgs args;
  args.set("tma_a", map);
  const std::vector<void*> bound = args.bind("k", {{"tma_a", ParamType::TensorMap}});
  EXPECT_EQ(std::memcmp(bound[0], &map, sizeof map), 0);
}

// The builder returns the signature the kernel was built with: the GEMM's tensor maps last on
// wgmma tiles, named.
TEST(KernelArgs, AGeneratedKernelCarriesItsSignature) {
  const KernelSpec spec = KernelSpec::parse(
      "lse_forward;V=128256;H=4096;chunk=0;mode=recompute;dtype=bf16;targets=i64;reduction=mean;bias=0;arch=sm_90a;"
      "tile=128x256x64/wg2/s4");
  const GeneratedKernel kernel = generate_kernel(spec);
  const KernelSignature& params = kernel.shape.params;
  ASSERT_GE(params.size(), 3u);
  EXPECT_EQ(params.front(), (KernelParam{"x", ParamType::GlobalPtr}));
  EXPECT_EQ(params[params.size() - 2], (KernelParam{"tma_a", ParamType::TensorMap}));
  EXPECT_EQ(params.back(), (KernelParam{"tma_b", ParamType::TensorMap}));
}

}  // namespace
}  // namespace lfce::runtime
