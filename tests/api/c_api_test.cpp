// The C API as a user links it: liblfce.so only. No GPU needed: the driver is pointed at a
// missing file before anything loads it, so launches must fail cleanly on any machine.
#include "lfce/lfce.h"

#include <gtest/gtest.h>

#include <cstdlib>
#include <string>
#include <vector>

namespace {

const bool kNoDriver = [] { return setenv("LFCE_LIBCUDA", "/nonexistent/libcuda.so.1", 1) == 0; }();

lfce_problem small_problem() {
  lfce_problem p{};
  p.tokens = 33;
  p.hidden = 256;
  p.vocab = 1000;
  p.dtype = LFCE_DTYPE_BF16;
  p.ignore_index = -100;
  return p;
}

TEST(CApi, ReportsItsVersion) { EXPECT_STREQ(lfce_version(), "0.1.0"); }

TEST(CApi, ReportsTheGeneratorVersionOfItsCacheKeys) {
  const std::string version = lfce_generator_version();
  EXPECT_EQ(version.rfind("lfce-gen-", 0), 0u) << version;
  EXPECT_GT(version.size(), std::string("lfce-gen-").size()) << version;
}

TEST(CApi, PlanIsTunedRejectsNullOutNamingIt) {
  lfce_problem p = small_problem();
  EXPECT_EQ(lfce_plan_is_tuned(&p, 0, nullptr), LFCE_ERR_INVALID_ARGUMENT);
  EXPECT_NE(std::string(lfce_last_error()).find("tuned is NULL"), std::string::npos) << lfce_last_error();
}

TEST(CApi, PlanIsTunedRejectsABadProblemBeforeTheDriver) {
  lfce_problem p = small_problem();
  p.vocab = 0;
  int32_t tuned = -1;
  EXPECT_EQ(lfce_plan_is_tuned(&p, 0, &tuned), LFCE_ERR_INVALID_ARGUMENT);
  EXPECT_NE(std::string(lfce_last_error()).find("vocab must be >= 1, got 0"), std::string::npos) << lfce_last_error();
}

TEST(CApi, PlanIsTunedNeedsTheDevicesArch) {
  ASSERT_TRUE(kNoDriver);
  lfce_problem p = small_problem();
  int32_t tuned = -1;
  EXPECT_EQ(lfce_plan_is_tuned(&p, 0, &tuned), LFCE_ERR_CUDA);
  EXPECT_EQ(tuned, -1);
}

TEST(CApi, RejectsZeroVocabNamingIt) {
  lfce_problem p = small_problem();
  p.vocab = 0;
  size_t bytes = 0;
  EXPECT_EQ(lfce_forward_workspace_size(&p, &bytes), LFCE_ERR_INVALID_ARGUMENT);
  EXPECT_NE(std::string(lfce_last_error()).find("vocab must be >= 1, got 0"), std::string::npos) << lfce_last_error();
}

TEST(CApi, RejectsUnknownLogLevel) {
  EXPECT_EQ(lfce_set_log_level("loud"), LFCE_ERR_INVALID_ARGUMENT);
  EXPECT_NE(std::string(lfce_last_error()).find("'loud'"), std::string::npos);
  EXPECT_EQ(lfce_set_log_level("warn"), LFCE_OK);
  EXPECT_STREQ(lfce_last_error(), "");
}

TEST(CApi, WorkspaceSizesNeedNoGpu) {
  lfce_problem p = small_problem();
  size_t fwd = 0, bwd = 0;
  int64_t chunk = 0;
  ASSERT_EQ(lfce_forward_workspace_size(&p, &fwd), LFCE_OK) << lfce_last_error();
  ASSERT_EQ(lfce_backward_workspace_size(&p, &bwd), LFCE_OK) << lfce_last_error();
  ASSERT_EQ(lfce_backward_chunk_size(&p, &chunk), LFCE_OK) << lfce_last_error();
  EXPECT_GE(fwd, 3 * 33 * sizeof(float));
  EXPECT_EQ(chunk, 1000);
  EXPECT_GE(bwd, static_cast<size_t>(chunk) * 40 * 2);
}

// A forward call whose arguments are all valid for small_problem() (lse room for its rows, predicted
// ids): without a driver it fails at the driver.
struct ForwardCall {
  alignas(16) char buffer[1 << 16];
  float lse[4 * 33], loss[33], reduced, count;
  alignas(8) int64_t targets[33] = {}, predicted[34] = {};
  lfce_forward_args args{};
  ForwardCall() {
    args.hidden = buffer;
    args.weight = buffer;
    args.targets = targets;
    args.lse = lse;
    args.token_loss = loss;
    args.loss = &reduced;
    args.valid_count = &count;
    args.workspace = buffer;
    args.workspace_bytes = sizeof buffer;
  }
};

TEST(CApi, LaunchWithoutDriverFailsWithClearError) {
  ASSERT_TRUE(kNoDriver);
  lfce_problem p = small_problem();
  static ForwardCall call;
  lfce_forward_args& a = call.args;
  EXPECT_EQ(lfce_forward(&p, &a), LFCE_ERR_CUDA);
  EXPECT_NE(std::string(lfce_last_error()).find("no usable NVIDIA driver"), std::string::npos) << lfce_last_error();
}

TEST(CApi, ForwardRejectsNullHiddenBeforeTouchingTheDriver) {
  lfce_problem p = small_problem();
  lfce_forward_args a{};
  EXPECT_EQ(lfce_forward(&p, &a), LFCE_ERR_INVALID_ARGUMENT);
  EXPECT_NE(std::string(lfce_last_error()).find("hidden is NULL"), std::string::npos) << lfce_last_error();
}

// A backward call whose arguments are all valid: without a driver it fails at the driver, so
// reaching LFCE_ERR_CUDA shows the argument checks passed.
struct BackwardCall {
  alignas(16) char buffer[1 << 16];
  float lse[33], count, grad_loss = 1.0f;
  int64_t targets[33] = {};
  lfce_backward_args args{};
  BackwardCall() {
    args.hidden = buffer;
    args.weight = buffer;
    args.targets = targets;
    args.lse = lse;
    args.valid_count = &count;
    args.grad_loss = &grad_loss;
    args.grad_hidden = buffer;
    args.grad_weight = buffer;
    args.workspace = buffer;
    args.workspace_bytes = sizeof buffer;
  }
};

void expect_reaches_the_driver(const lfce_problem& p, const lfce_backward_args& a) {
  ASSERT_TRUE(kNoDriver);
  EXPECT_EQ(lfce_backward(&p, &a), LFCE_ERR_CUDA) << lfce_last_error();
  EXPECT_NE(std::string(lfce_last_error()).find("no usable NVIDIA driver"), std::string::npos) << lfce_last_error();
}

// The extra outputs: LFCE_OUTPUT_PREDICTED needs the predicted buffer (8-byte aligned int64), named
// before the driver is touched; grad_lse reaches the driver with bf16 and is refused with fp16.
TEST(CApi, ForwardWithPredictedOutputNeedsItsBuffer) {
  ASSERT_TRUE(kNoDriver);
  lfce_problem p = small_problem();
  p.outputs = LFCE_OUTPUT_PREDICTED | LFCE_OUTPUT_ENTROPY;
  static ForwardCall call;
  lfce_forward_args& a = call.args;
  int64_t* predicted = call.predicted;
  EXPECT_EQ(lfce_forward(&p, &a), LFCE_ERR_INVALID_ARGUMENT);
  EXPECT_NE(std::string(lfce_last_error()).find("predicted"), std::string::npos) << lfce_last_error();
  a.predicted = reinterpret_cast<int64_t*>(reinterpret_cast<char*>(predicted) + 4);
  EXPECT_EQ(lfce_forward(&p, &a), LFCE_ERR_INVALID_ARGUMENT);
  EXPECT_NE(std::string(lfce_last_error()).find("predicted"), std::string::npos) << lfce_last_error();
  a.predicted = predicted;
  EXPECT_EQ(lfce_forward(&p, &a), LFCE_ERR_CUDA) << lfce_last_error();
}

TEST(CApi, BackwardTakesGradLseExceptWithFp16) {
  BackwardCall call;
  float grad_lse[33] = {};
  call.args.grad_lse = grad_lse;
  expect_reaches_the_driver(small_problem(), call.args);
  lfce_problem p = small_problem();
  p.dtype = LFCE_DTYPE_FP16;
  EXPECT_EQ(lfce_backward(&p, &call.args), LFCE_ERR_INVALID_ARGUMENT);
  EXPECT_NE(std::string(lfce_last_error()).find("grad_lse (the gradients of the lse rows) needs bf16 or fp32 inputs, got fp16"),
            std::string::npos)
      << lfce_last_error();
}

TEST(CApi, BackwardAcceptsNullGradWeightForAFrozenHead) {
  BackwardCall call;
  call.args.grad_weight = nullptr;
  expect_reaches_the_driver(small_problem(), call.args);
}

TEST(CApi, BackwardAcceptsNullGradHiddenForAFrozenInput) {
  BackwardCall call;
  call.args.grad_hidden = nullptr;
  expect_reaches_the_driver(small_problem(), call.args);
}

TEST(CApi, BackwardAcceptsNullGradBiasWithABias) {
  lfce_problem p = small_problem();
  p.has_bias = 1;
  BackwardCall call;
  call.args.bias = call.buffer;
  expect_reaches_the_driver(p, call.args);
}

TEST(CApi, BackwardWithNoGradientAskedForLaunchesNothing) {
  lfce_problem p = small_problem();
  p.has_bias = 1;
  BackwardCall call;
  call.args.bias = call.buffer;
  call.args.grad_hidden = nullptr;
  call.args.grad_weight = nullptr;
  // No driver here: LFCE_OK shows nothing was launched (nor the driver loaded).
  EXPECT_EQ(lfce_backward(&p, &call.args), LFCE_OK) << lfce_last_error();
}

TEST(CApi, BackwardWithNoGradientStillChecksItsInputs) {
  BackwardCall call;
  call.args.grad_hidden = nullptr;
  call.args.grad_weight = nullptr;
  call.args.lse = nullptr;
  const lfce_problem p = small_problem();
  EXPECT_EQ(lfce_backward(&p, &call.args), LFCE_ERR_INVALID_ARGUMENT);
  EXPECT_NE(std::string(lfce_last_error()).find("lse is NULL"), std::string::npos) << lfce_last_error();
}

TEST(CApi, BackwardRejectsMisalignedGradHiddenNamingIt) {
  BackwardCall call;
  call.args.grad_hidden = call.buffer + 1;  // H = 4093: written one element at a time, element alignment
  lfce_problem p = small_problem();
  p.hidden = 4093;
  call.args.hidden = call.buffer + 2;
  call.args.weight = call.buffer + 2;
  EXPECT_EQ(lfce_backward(&p, &call.args), LFCE_ERR_INVALID_ARGUMENT);
  EXPECT_NE(std::string(lfce_last_error()).find("grad_hidden is not 2-byte aligned"), std::string::npos)
      << lfce_last_error();
}

// Rows of H = 4093 bf16 elements are copied in 2-byte pieces: hidden, weight and grad_hidden
// need only element alignment (a row of such a tensor starts anywhere even).
TEST(CApi, BackwardAcceptsElementAlignedTensorsOfOddHidden) {
  lfce_problem p = small_problem();
  p.hidden = 4093;
  BackwardCall call;
  call.args.hidden = call.buffer + 2;
  call.args.weight = call.buffer + 6;
  call.args.grad_hidden = call.buffer + 10;
  expect_reaches_the_driver(p, call.args);
}

// H = 4092: 8184-byte rows, copied in 8-byte pieces from an 8-byte aligned base.
TEST(CApi, BackwardRejectsHiddenOffItsRowAlignmentNamingIt) {
  lfce_problem p = small_problem();
  p.hidden = 4092;
  BackwardCall call;
  call.args.hidden = call.buffer + 4;
  EXPECT_EQ(lfce_backward(&p, &call.args), LFCE_ERR_INVALID_ARGUMENT);
  EXPECT_NE(std::string(lfce_last_error()).find("hidden is not 8-byte aligned"), std::string::npos)
      << lfce_last_error();
}

// Every pointer the kernels read or write is checked against the alignment of their accesses
// before the driver is touched (here there is none: a launch would fail with LFCE_ERR_CUDA).
std::string misaligned_forward(const lfce_problem& p, void (*misalign)(lfce_forward_args&, ForwardCall&)) {
  static ForwardCall call;
  lfce_forward_args a = call.args;
  misalign(a, call);
  EXPECT_EQ(lfce_forward(&p, &a), LFCE_ERR_INVALID_ARGUMENT) << lfce_last_error();
  return lfce_last_error();
}

TEST(CApi, ForwardRejectsEachMisalignedOutputNamingItsAlignment) {
  const lfce_problem p = small_problem();
  const std::pair<void (*)(lfce_forward_args&, ForwardCall&), const char*> cases[] = {
      {[](lfce_forward_args& a, ForwardCall& c) { a.lse = reinterpret_cast<float*>(reinterpret_cast<char*>(c.lse) + 1); },
       "lse is not 4-byte aligned"},
      {[](lfce_forward_args& a, ForwardCall& c) { a.token_loss = reinterpret_cast<float*>(reinterpret_cast<char*>(c.loss) + 1); },
       "token_loss is not 4-byte aligned"},
      {[](lfce_forward_args& a, ForwardCall& c) { a.loss = reinterpret_cast<float*>(reinterpret_cast<char*>(c.lse) + 2); },
       "loss is not 4-byte aligned"},
      {[](lfce_forward_args& a, ForwardCall& c) { a.valid_count = reinterpret_cast<float*>(reinterpret_cast<char*>(c.lse) + 3); },
       "valid_count is not 4-byte aligned"},
  };
  for (const auto& [misalign, message] : cases) {
    const std::string error = misaligned_forward(p, misalign);
    EXPECT_NE(error.find(message), std::string::npos) << error;
  }
}

TEST(CApi, ForwardRejectsTargetsOffTheirIndexSize) {
  lfce_problem p = small_problem();
  const auto off_by_4 = [](lfce_forward_args& a, ForwardCall& c) { a.targets = reinterpret_cast<char*>(c.targets) + 4; };
  std::string error = misaligned_forward(p, off_by_4);  // int64 ids
  EXPECT_NE(error.find("targets is not 8-byte aligned"), std::string::npos) << error;
  p.target_dtype = LFCE_INDEX_INT32;
  error = misaligned_forward(p, [](lfce_forward_args& a, ForwardCall& c) { a.targets = reinterpret_cast<char*>(c.targets) + 2; });
  EXPECT_NE(error.find("targets is not 4-byte aligned"), std::string::npos) << error;
}

TEST(CApi, ForwardRejectsAMisalignedBiasNamingItsAlignment) {
  lfce_problem p = small_problem();
  p.has_bias = 1;
  const std::string error = misaligned_forward(p, [](lfce_forward_args& a, ForwardCall& c) { a.bias = c.buffer + 1; });
  EXPECT_NE(error.find("bias is not 2-byte aligned"), std::string::npos) << error;
}

std::string misaligned_backward(const lfce_problem& p, void (*misalign)(lfce_backward_args&, BackwardCall&)) {
  static BackwardCall call;
  lfce_backward_args a = call.args;
  misalign(a, call);
  EXPECT_EQ(lfce_backward(&p, &a), LFCE_ERR_INVALID_ARGUMENT) << lfce_last_error();
  return lfce_last_error();
}

TEST(CApi, BackwardRejectsEachMisalignedInputNamingItsAlignment) {
  const lfce_problem p = small_problem();
  const std::pair<void (*)(lfce_backward_args&, BackwardCall&), const char*> cases[] = {
      {[](lfce_backward_args& a, BackwardCall& c) { a.targets = reinterpret_cast<char*>(c.targets) + 1; },
       "targets is not 8-byte aligned"},
      {[](lfce_backward_args& a, BackwardCall& c) { a.lse = reinterpret_cast<const float*>(reinterpret_cast<char*>(c.lse) + 1); },
       "lse is not 4-byte aligned"},
      {[](lfce_backward_args& a, BackwardCall& c) { a.valid_count = reinterpret_cast<const float*>(reinterpret_cast<char*>(c.lse) + 2); },
       "valid_count is not 4-byte aligned"},
      {[](lfce_backward_args& a, BackwardCall& c) { a.grad_loss = reinterpret_cast<const float*>(reinterpret_cast<char*>(c.lse) + 3); },
       "grad_loss is not 4-byte aligned"},
  };
  for (const auto& [misalign, message] : cases) {
    const std::string error = misaligned_backward(p, misalign);
    EXPECT_NE(error.find(message), std::string::npos) << error;
  }
}

// Without accumulation grad_bias is written in the problem's dtype, one element at a time.
TEST(CApi, BackwardRejectsAMisalignedGradBiasNamingItsAlignment) {
  lfce_problem p = small_problem();
  p.has_bias = 1;
  const std::string error = misaligned_backward(p, [](lfce_backward_args& a, BackwardCall& c) {
    a.bias = c.buffer;
    a.grad_bias = c.buffer + 1;
  });
  EXPECT_NE(error.find("grad_bias is not 2-byte aligned"), std::string::npos) << error;
  const std::string bias = misaligned_backward(p, [](lfce_backward_args& a, BackwardCall& c) { a.bias = c.buffer + 1; });
  EXPECT_NE(bias.find("bias is not 2-byte aligned"), std::string::npos) << bias;
}

// H = 256: the sm_90a gradients are stored in pairs of elements from registers, 4 bytes in bf16.
TEST(CApi, BackwardRejectsGradientsOffTheirPairAlignmentNamingIt) {
  const lfce_problem p = small_problem();
  const std::string weight =
      misaligned_backward(p, [](lfce_backward_args& a, BackwardCall& c) { a.grad_weight = c.buffer + 2; });
  EXPECT_NE(weight.find("grad_weight is not 4-byte aligned"), std::string::npos) << weight;
  const std::string hidden =
      misaligned_backward(p, [](lfce_backward_args& a, BackwardCall& c) { a.grad_hidden = c.buffer + 2; });
  EXPECT_NE(hidden.find("grad_hidden is not 4-byte aligned"), std::string::npos) << hidden;
}

TEST(CApi, TuneNamesAHugeBudgetReadably) {
  const lfce_problem p = small_problem();
  lfce_tune_options o{};
  o.budget_minutes = 1e308;
  EXPECT_EQ(lfce_tune(&p, &o, nullptr, nullptr, nullptr), LFCE_ERR_INVALID_ARGUMENT);
  const std::string error = lfce_last_error();
  EXPECT_NE(error.find("budget_minutes must be a number of minutes in [0, 1e9]"), std::string::npos) << error;
  EXPECT_NE(error.find("got 1e+308"), std::string::npos) << error;
  EXPECT_LT(error.size(), 200u) << error;
}

TEST(CApi, GenerateBuildsOddHiddenKernelsForSm90a) {
  lfce_problem p = small_problem();
  p.hidden = 4093;
  std::vector<std::string> specs;
  auto collect = [](const lfce_kernel_info* k, void* user) { static_cast<std::vector<std::string>*>(user)->push_back(k->spec); };
  ASSERT_EQ(lfce_generate(&p, "sm_90a", collect, &specs), LFCE_OK) << lfce_last_error();
  EXPECT_EQ(specs.size(), 6u);
  for (const std::string& spec : specs) EXPECT_EQ(spec.find("/wg"), std::string::npos) << spec;  // no TMA tile
}

TEST(CApi, GenerateHandsOverEveryKernelWithoutGpu) {
  lfce_problem p = small_problem();
  p.has_bias = 1;
  std::vector<std::string> names;
  auto collect = [](const lfce_kernel_info* k, void* user) {
    auto* out = static_cast<std::vector<std::string>*>(user);
    out->push_back(k->name);
    EXPECT_NE(std::string(k->ptx).find(".entry"), std::string::npos);
    EXPECT_EQ(std::string(k->ptx).size(), k->ptx_size);
    EXPECT_GT(k->threads, 0u);
  };
  int64_t before = lfce_compile_count();
  ASSERT_EQ(lfce_generate(&p, "sm_90a", collect, &names), LFCE_OK) << lfce_last_error();
  EXPECT_EQ(names, (std::vector<std::string>{"lse_forward", "lse_combine", "loss_reduce", "dlogits_backward",
                                             "grad_weight", "grad_input", "grad_bias"}));
  EXPECT_EQ(lfce_compile_count() - before, 7);
}

// ---- sizes beyond the limits are named, never looped on, divided by zero or wrapped ----

TEST(CApi, CheckProblemRejectsHugeTokensNamingThem) {
  lfce_problem p = small_problem();
  p.tokens = 4611686018427387905;
  EXPECT_EQ(lfce_check_problem(&p), LFCE_ERR_INVALID_ARGUMENT);
  EXPECT_NE(std::string(lfce_last_error()).find("tokens = 4611686018427387905"), std::string::npos)
      << lfce_last_error();
}

TEST(CApi, CheckProblemRejectsHugeHiddenNamingIt) {
  lfce_problem p = small_problem();
  p.hidden = int64_t{1} << 40;
  EXPECT_EQ(lfce_check_problem(&p), LFCE_ERR_INVALID_ARGUMENT);
  EXPECT_NE(std::string(lfce_last_error()).find("hidden = 1099511627776"), std::string::npos) << lfce_last_error();
}

TEST(CApi, Fp32WorkspaceSizeOfHugeTokensIsAnErrorNotSigfpe) {
  lfce_problem p = small_problem();
  p.tokens = 2305843009213693953;
  p.dtype = LFCE_DTYPE_FP32;
  size_t bytes = 0;
  EXPECT_EQ(lfce_backward_workspace_size(&p, &bytes), LFCE_ERR_INVALID_ARGUMENT);
  EXPECT_NE(std::string(lfce_last_error()).find("tokens = 2305843009213693953"), std::string::npos)
      << lfce_last_error();
}

TEST(CApi, WorkspaceSizeOfTwoToTheSixtyOneTokensIsAnErrorNotAWrappedSize) {
  lfce_problem p = small_problem();
  p.tokens = int64_t{1} << 61;
  size_t bytes = 0;
  EXPECT_EQ(lfce_forward_workspace_size(&p, &bytes), LFCE_ERR_INVALID_ARGUMENT);
  EXPECT_NE(std::string(lfce_last_error()).find("tokens = 2305843009213693952"), std::string::npos)
      << lfce_last_error();
}

TEST(CApi, GenerateRejectsHugeTokensInsteadOfLooping) {
  lfce_problem p = small_problem();
  p.tokens = 4611686018427387905;
  auto ignore = [](const lfce_kernel_info*, void*) {};
  EXPECT_EQ(lfce_generate(&p, "sm_90a", ignore, nullptr), LFCE_ERR_INVALID_ARGUMENT);
  EXPECT_NE(std::string(lfce_last_error()).find("4611686018427387905"), std::string::npos) << lfce_last_error();
}

TEST(CApi, GenerateRejectsUnknownArch) {
  lfce_problem p = small_problem();
  auto ignore = [](const lfce_kernel_info*, void*) {};
  EXPECT_EQ(lfce_generate(&p, "sm_75", ignore, nullptr), LFCE_ERR_INVALID_ARGUMENT);
  EXPECT_NE(std::string(lfce_last_error()).find("sm_75"), std::string::npos);
}

}  // namespace

// lfce_forward_backward (eager mode): its arguments are checked, each naming the bad one, before the
// driver is touched; with all of them valid it fails at the driver here.
struct EagerCall {
  alignas(256) char workspace[1 << 20];
  alignas(16) char tensors[1 << 16];
  float lse[33], loss[33], reduced, count;
  int64_t targets[33] = {};
  lfce_forward_args args{};
  EagerCall() {
    args.hidden = tensors;
    args.weight = tensors;
    args.targets = targets;
    args.lse = lse;
    args.token_loss = loss;
    args.loss = &reduced;
    args.valid_count = &count;
    args.workspace = workspace;
    args.workspace_bytes = sizeof workspace;
  }
};

lfce_problem eager_problem() {
  lfce_problem p = small_problem();
  p.mode = LFCE_MODE_EAGER;
  return p;
}

std::string eager_error(const lfce_problem& p, const lfce_forward_args* a, void* grad_hidden, void* grad_weight) {
  EXPECT_EQ(lfce_forward_backward(&p, a, grad_hidden, grad_weight, nullptr), LFCE_ERR_INVALID_ARGUMENT);
  return lfce_last_error();
}

TEST(CApi, ForwardBackwardNeedsEagerMode) {
  static EagerCall call;
  const std::string message = eager_error(small_problem(), &call.args, call.tensors, nullptr);
  EXPECT_NE(message.find("lfce_forward_backward needs lfce_problem.mode = LFCE_MODE_EAGER"), std::string::npos) << message;
}

TEST(CApi, ForwardBackwardRejectsNullArgsAndTensorsNamingThem) {
  static EagerCall call;
  EXPECT_NE(eager_error(eager_problem(), nullptr, call.tensors, nullptr).find("args is NULL"), std::string::npos);
  lfce_forward_args a = call.args;
  a.targets = nullptr;
  EXPECT_NE(eager_error(eager_problem(), &a, call.tensors, nullptr).find("targets is NULL"), std::string::npos);
  a = call.args;
  a.token_loss = nullptr;
  EXPECT_NE(eager_error(eager_problem(), &a, call.tensors, nullptr).find("token_loss is NULL"), std::string::npos);
  lfce_problem biased = eager_problem();
  biased.has_bias = 1;
  EXPECT_NE(eager_error(biased, &call.args, call.tensors, nullptr).find("bias is NULL"), std::string::npos);
}

TEST(CApi, ForwardBackwardRejectsMisalignedGradientsNamingThem) {
  static EagerCall call;
  const std::string hidden = eager_error(eager_problem(), &call.args, call.tensors + 1, nullptr);
  EXPECT_NE(hidden.find("grad_hidden is not 4-byte aligned"), std::string::npos) << hidden;  // bf16 pairs
  const std::string weight = eager_error(eager_problem(), &call.args, nullptr, call.tensors + 2);
  EXPECT_NE(weight.find("grad_weight is not 4-byte aligned"), std::string::npos) << weight;
}

TEST(CApi, ForwardBackwardRejectsAMisalignedGradBiasNamingIt) {
  static EagerCall call;
  lfce_problem p = eager_problem();
  p.has_bias = 1;
  lfce_forward_args a = call.args;
  a.bias = call.tensors;
  EXPECT_EQ(lfce_forward_backward(&p, &a, nullptr, nullptr, call.tensors + 1), LFCE_ERR_INVALID_ARGUMENT);
  EXPECT_NE(std::string(lfce_last_error()).find("grad_bias is not 2-byte aligned"), std::string::npos)
      << lfce_last_error();
}

TEST(CApi, ForwardBackwardRejectsASmallWorkspaceNamingBothSizes) {
  static EagerCall call;
  const lfce_problem p = eager_problem();
  size_t needed = 0;
  ASSERT_EQ(lfce_forward_backward_workspace_size(&p, &needed), LFCE_OK) << lfce_last_error();
  // dz [V, ld] bf16 (ld = 40 tokens), two [V / 64, N] fp32 partials, target logits and residuals.
  EXPECT_GE(needed, size_t{1000} * 40 * 2 + 2 * 16 * 33 * 4 + 2 * 33 * 4);
  ASSERT_LE(needed, sizeof call.workspace);
  lfce_forward_args a = call.args;
  a.workspace_bytes = needed - 1;
  const std::string message = eager_error(p, &a, call.tensors, nullptr);
  EXPECT_NE(message.find("lfce_forward_backward: workspace_bytes = " + std::to_string(needed - 1) + " is below the " +
                         std::to_string(needed) + " bytes this problem needs"),
            std::string::npos)
      << message;
}

TEST(CApi, ForwardBackwardWithValidArgumentsReachesTheDriver) {
  ASSERT_TRUE(kNoDriver);
  static EagerCall call;
  const lfce_problem p = eager_problem();
  EXPECT_EQ(lfce_forward_backward(&p, &call.args, call.tensors, call.tensors, nullptr), LFCE_ERR_CUDA)
      << lfce_last_error();
  EXPECT_NE(std::string(lfce_last_error()).find("no usable NVIDIA driver"), std::string::npos) << lfce_last_error();
  // No gradient asked for: the forward alone, which needs the driver too.
  EXPECT_EQ(lfce_forward_backward(&p, &call.args, nullptr, nullptr, nullptr), LFCE_ERR_CUDA) << lfce_last_error();
}

TEST(CApi, EagerScheduleTellsTheThreeGemmsAndTheirTokenChunk) {
  lfce_problem p = eager_problem();
  p.tokens = 4096;
  int32_t three_gemm = -1;
  int64_t chunk = -1;
  ASSERT_EQ(lfce_eager_schedule(&p, &three_gemm, &chunk), LFCE_OK) << lfce_last_error();
  EXPECT_EQ(three_gemm, 1);
  EXPECT_EQ(chunk, 4096);
  p.workspace_budget = 1000 * 2 * 1000;  // 1000 tokens of V = 1000 bf16 exponentials: 960 in rows of 64
  ASSERT_EQ(lfce_eager_schedule(&p, &three_gemm, &chunk), LFCE_OK) << lfce_last_error();
  EXPECT_EQ(chunk, 960);
  p.softcap = 30.f;  // a softcap's slope needs the logits: the forward, then the recompute backward
  ASSERT_EQ(lfce_eager_schedule(&p, &three_gemm, &chunk), LFCE_OK) << lfce_last_error();
  EXPECT_EQ(three_gemm, 0);
  EXPECT_EQ(chunk, 4096);
  lfce_problem recompute = small_problem();
  EXPECT_EQ(lfce_eager_schedule(&recompute, &three_gemm, &chunk), LFCE_ERR_INVALID_ARGUMENT);
  EXPECT_NE(std::string(lfce_last_error()).find("needs lfce_problem.mode = LFCE_MODE_EAGER"), std::string::npos)
      << lfce_last_error();
  EXPECT_EQ(lfce_eager_schedule(&p, nullptr, &chunk), LFCE_ERR_INVALID_ARGUMENT);
  EXPECT_NE(std::string(lfce_last_error()).find("three_gemm is NULL"), std::string::npos) << lfce_last_error();
}

// lfce_scale_gradient (eager mode's backward): each bad argument named before the driver is touched;
// nothing to scale touches nothing.
TEST(CApi, ScaleGradientChecksItsArgumentsBeforeTheDriver) {
  alignas(16) static char buffer[256];
  const float* scale = reinterpret_cast<const float*>(buffer + 128);
  auto error = [&](int32_t dtype, const void* src, void* dst, int64_t count, const float* s) {
    EXPECT_EQ(lfce_scale_gradient(dtype, src, dst, count, s, 0, nullptr), LFCE_ERR_INVALID_ARGUMENT);
    return std::string(lfce_last_error());
  };
  EXPECT_NE(error(3, buffer, buffer, 8, scale).find("dtype = 3 is not valid"), std::string::npos);
  EXPECT_NE(error(LFCE_DTYPE_BF16, buffer, buffer, -1, scale).find("count must be >= 0, got -1"), std::string::npos);
  EXPECT_NE(error(LFCE_DTYPE_BF16, nullptr, buffer, 8, scale).find("src is NULL"), std::string::npos);
  EXPECT_NE(error(LFCE_DTYPE_BF16, buffer, buffer + 2, 8, scale).find("dst is not 16-byte aligned"), std::string::npos);
  EXPECT_NE(error(LFCE_DTYPE_BF16, buffer, buffer, 8, nullptr).find("scale is NULL"), std::string::npos);
  EXPECT_EQ(lfce_scale_gradient(LFCE_DTYPE_FP32, buffer, buffer, 0, scale, 0, nullptr), LFCE_OK) << lfce_last_error();
  ASSERT_TRUE(kNoDriver);
  EXPECT_EQ(lfce_scale_gradient(LFCE_DTYPE_FP16, buffer, buffer, 8, scale, 0, nullptr), LFCE_ERR_CUDA);
}
