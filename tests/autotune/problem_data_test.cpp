// The tuner's host data: 16-bit conversions round to nearest even, random data is reproducible
// and shaped as documented, and its sizes are checked.
#include "autotune/problem_data.h"

#include <gtest/gtest.h>

#include <cmath>
#include <cstring>
#include <limits>
#include <string>

#include "compiler/errors.h"

namespace lfce::autotune {
namespace {

TEST(Conversions, Bf16RoundsToNearestEven) {
  EXPECT_EQ(float_to_bf16(1.0f), 0x3f80);
  EXPECT_EQ(float_to_bf16(-2.0f), 0xc000);
  EXPECT_EQ(float_to_bf16(1.0f + 0x1.0p-8f), 0x3f80);  // halfway: to even
  EXPECT_EQ(float_to_bf16(1.0f + 0x1.8p-8f), 0x3f81);  // above halfway: up
  EXPECT_EQ(bf16_to_float(0x3f81), 1.0f + 0x1.0p-7f);
}

TEST(Conversions, HalfRoundsToNearestEvenAndKeepsSubnormals) {
  EXPECT_EQ(float_to_half(1.0f), 0x3c00);
  EXPECT_EQ(float_to_half(65504.0f), 0x7bff);
  EXPECT_EQ(float_to_half(1e6f), 0x7c00);                // overflow: inf
  EXPECT_EQ(float_to_half(1.0f + 0x1.0p-11f), 0x3c00);   // halfway: to even
  EXPECT_EQ(float_to_half(0x1.0p-24f), 0x0001);          // smallest subnormal
  EXPECT_EQ(half_to_float(0x0001), 0x1.0p-24f);
  for (float v : {0.5f, -3.25f, 1000.0f, 0x1.0p-20f}) EXPECT_EQ(half_to_float(float_to_half(v)), v);
}

TEST(ProblemData, IsReproducibleAndShapedAsDocumented) {
  runtime::Problem p;
  p.tokens = 17 * 400;
  p.hidden = 64;
  p.vocab = 1000;
  p.bias = true;
  ProblemData a = make_problem_data(p, 7), b = make_problem_data(p, 7), c = make_problem_data(p, 8);
  EXPECT_EQ(a.weight, b.weight);
  EXPECT_EQ(a.targets, b.targets);
  EXPECT_NE(a.weight, c.weight);
  EXPECT_EQ(a.hidden.size(), static_cast<size_t>(p.tokens * p.hidden * 2));
  EXPECT_EQ(a.bias.size(), 2000u);

  std::vector<float> w = to_float(a.weight.data(), p.vocab * p.hidden, DType::BF16);
  double sq = 0;
  for (float v : w) sq += v * v;
  EXPECT_NEAR(std::sqrt(sq / w.size()), 2.5 / 8, 0.01);  // std 2.5/sqrt(H)

  int ignored = 0;
  for (int64_t i = 0; i < p.tokens; ++i) {
    int64_t t;
    std::memcpy(&t, a.targets.data() + 8 * i, 8);
    if (t == p.ignore_index) {
      ++ignored;
    } else {
      EXPECT_GE(t, 0);
      EXPECT_LT(t, p.vocab);
    }
  }
  EXPECT_NEAR(ignored, 400, 80);  // 1 in 17
}

// N * H was once multiplied unchecked (a wrapped product allocated a tiny tensor, or
// threw bad_alloc): a product beyond int64 is a SpecError naming it.
TEST(ProblemData, NamesASizeProductThatDoesNotFit) {
  runtime::Problem p;
  p.tokens = int64_t{1} << 40;
  p.hidden = int64_t{1} << 30;
  p.vocab = 1000;
  try {
    make_problem_data(p, 7);
    FAIL() << "no exception";
  } catch (const SpecError& e) {
    EXPECT_NE(std::string(e.what()).find("hidden elements (N * H) = 1099511627776 * 1073741824"), std::string::npos)
        << e.what();
  }
}

}  // namespace
}  // namespace lfce::autotune
