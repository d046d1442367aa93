// What `lfce tune --verify` compares with, with no GPU: the host reference's gradients are the
// derivatives of its loss (central differences), and the comparison rejects an output with one
// element off by more than its bound while accepting one within it, naming the element.
#include "autotune/host_reference.h"

#include <gtest/gtest.h>

#include <cmath>
#include <cstring>
#include <limits>
#include <string>
#include <vector>

namespace lfce::autotune {
namespace {

bool contains(const std::string& text, const std::string& part) { return text.find(part) != std::string::npos; }

runtime::Problem tiny(Reduction reduction) {
  runtime::Problem p;
  p.tokens = 5;
  p.hidden = 8;
  p.vocab = 70;  // two vocabulary blocks of the reference
  p.dtype = DType::FP32;
  p.bias = true;
  p.reduction = reduction;
  return p;
}

ProblemData tiny_data(const runtime::Problem& p) {
  ProblemData d = make_problem_data(p, 11);
  const int64_t ignored = p.ignore_index;
  std::memcpy(d.targets.data() + 8 * 3, &ignored, 8);  // token 3 contributes nothing
  return d;
}

float& f32(std::vector<uint8_t>& bytes, size_t i) { return reinterpret_cast<float*>(bytes.data())[i]; }

double loss_of(const runtime::Problem& p, const ProblemData& d) {
  const Reference r = host_reference(p, d, false);
  double sum = 0;
  for (float l : r.token_loss) sum += l;
  return p.reduction == Reduction::Mean ? sum / r.valid_count : sum;
}

// d loss / d value by central differences, `value` being one input element.
double numeric_gradient(const runtime::Problem& p, ProblemData& d, float& value) {
  const float h = 1e-2f, saved = value;
  value = saved + h;
  const double up = loss_of(p, d);
  value = saved - h;
  const double down = loss_of(p, d);
  value = saved;
  return (up - down) / (2.0 * h);
}

TEST(HostReference, GradientsAreTheDerivativesOfItsLoss) {
  for (Reduction reduction : {Reduction::Mean, Reduction::Sum}) {
    SCOPED_TRACE(std::string(reduction_name(reduction)));
    const runtime::Problem p = tiny(reduction);
    ProblemData d = tiny_data(p);
    const Reference r = host_reference(p, d, true);
    EXPECT_EQ(r.valid_count, 4.0f);
    EXPECT_EQ(r.token_loss[3], 0.0f);
    ASSERT_EQ(r.grad_weight.size(), 70u * 8u);
    ASSERT_EQ(r.grad_hidden.size(), 5u * 8u);
    ASSERT_EQ(r.grad_bias.size(), 70u);
    auto near = [](double numeric, double analytic) { return std::fabs(numeric - analytic) <= 1e-4 + 1e-2 * std::fabs(analytic); };
    for (size_t i : {0u, 9u, 100u, 8u * 69u + 7u})
      EXPECT_PRED2(near, numeric_gradient(p, d, f32(d.weight, i)), r.grad_weight[i]) << "weight " << i;
    for (size_t i : {0u, 13u, 39u})
      EXPECT_PRED2(near, numeric_gradient(p, d, f32(d.hidden, i)), r.grad_hidden[i]) << "hidden " << i;
    for (size_t i : {0u, 33u, 69u})
      EXPECT_PRED2(near, numeric_gradient(p, d, f32(d.bias, i)), r.grad_bias[i]) << "bias " << i;
    for (size_t i = 3 * 8; i < 4 * 8; ++i) EXPECT_EQ(r.grad_hidden[i], 0.0f) << "ignored token, " << i;
  }
}

TEST(HostReference, VerifyProblemKeepsTheShapeAndPinsTheChunk) {
  runtime::Problem p = tiny(Reduction::Mean);
  p.tokens = 8192;
  const runtime::Problem v = verify_problem(p, 16384);
  EXPECT_EQ(v.tokens, kVerifyTokens);
  EXPECT_EQ(v.vocab, p.vocab);
  EXPECT_EQ(v.hidden, p.hidden);
  EXPECT_EQ(v.chunk_size, 16384);
  p.tokens = 7;
  EXPECT_EQ(verify_problem(p, 0).tokens, 7);
}

std::vector<uint16_t> as_bf16(const std::vector<float>& v) {
  std::vector<uint16_t> out;
  for (float x : v) out.push_back(float_to_bf16(x));
  return out;
}

std::vector<float> ramp(size_t n) {
  std::vector<float> out(n);
  for (size_t i = 0; i < n; ++i) out[i] = std::sin(0.37f * static_cast<float>(i)) * 0.01f;
  return out;
}

TEST(CompareOutput, AcceptsTheReferenceRoundedToTheDtype) {
  const std::vector<float> expected = ramp(4096);
  const std::vector<uint16_t> actual = as_bf16(expected);
  const Verdict v = compare_output("grad_weight", actual.data(), DType::BF16, expected, gradient_tolerance(DType::BF16));
  EXPECT_TRUE(v.ok()) << v.failure;
  EXPECT_LE(v.score, 1.0);
}

TEST(CompareOutput, AcceptsOneElementWithinItsBound) {
  const std::vector<float> expected = ramp(4096);
  std::vector<uint16_t> actual = as_bf16(expected);
  // atol = 2^-7 * max|e| = 7.8e-5 here: a 5e-5 error on one element is within it.
  actual[1234] = float_to_bf16(expected[1234] + 5e-5f);
  const Verdict v = compare_output("grad_weight", actual.data(), DType::BF16, expected, gradient_tolerance(DType::BF16));
  EXPECT_TRUE(v.ok()) << v.failure;
  EXPECT_LE(v.score, 1.0);
}

TEST(CompareOutput, RejectsOneElementOffByMoreThanItsBoundNamingIt) {
  const std::vector<float> expected = ramp(4096);
  std::vector<uint16_t> actual = as_bf16(expected);
  // One element of 4096 off by 3e-4 (> atol 7.8e-5 + rtol * |e|): the relative L2 over the
  // whole tensor (~1.4e-3) stays below 6e-3, so only the elementwise bound catches it.
  actual[1234] = float_to_bf16(expected[1234] + 3e-4f);
  const Verdict v = compare_output("grad_weight", actual.data(), DType::BF16, expected, gradient_tolerance(DType::BF16));
  ASSERT_FALSE(v.ok());
  EXPECT_GT(v.score, 1.0);
  EXPECT_TRUE(contains(v.failure, "grad_weight (bf16)")) << v.failure;
  EXPECT_TRUE(contains(v.failure, "1 element(s) off")) << v.failure;
  EXPECT_TRUE(contains(v.failure, "first at 1234")) << v.failure;
  EXPECT_FALSE(contains(v.failure, "rel L2")) << v.failure;
}

TEST(CompareOutput, RejectsAZeroedBlockByRelativeL2) {
  const std::vector<float> expected = ramp(4096);
  std::vector<float> actual = expected;
  for (size_t i = 0; i < 512; ++i) actual[i] = 0;
  const Verdict v = compare_output("grad_hidden", actual.data(), DType::FP32, expected, gradient_tolerance(DType::FP32));
  ASSERT_FALSE(v.ok());
  EXPECT_TRUE(contains(v.failure, "rel L2")) << v.failure;
}

TEST(CompareOutput, RejectsANaN) {
  const std::vector<float> expected = ramp(64);
  std::vector<float> actual = expected;
  actual[5] = std::numeric_limits<float>::quiet_NaN();
  const Verdict v = compare_output("lse", actual.data(), DType::FP32, expected, loss_tolerance(DType::BF16));
  ASSERT_FALSE(v.ok());
  EXPECT_TRUE(contains(v.failure, "first at 5")) << v.failure;
  EXPECT_TRUE(std::isinf(v.score));
}

}  // namespace
}  // namespace lfce::autotune
