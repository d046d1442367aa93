// Host-side data for measuring a problem: reproducible random inputs in the problem's dtypes,
// conversions of 16-bit results back to float, and the error measure of verification.
#pragma once

#include <cstddef>
#include <cstdint>
#include <vector>

#include "runtime/plan.h"

namespace lfce::autotune {

// Raw bytes as the kernels read them.
struct ProblemData {
  std::vector<uint8_t> hidden;   // [N, H], ~N(0, 1)
  std::vector<uint8_t> weight;   // [V, H], ~N(0, 2.5/sqrt(H)): logits of std 2.5
  std::vector<uint8_t> bias;     // [V], ~N(0, 0.1); empty without bias
  std::vector<uint8_t> targets;  // [N], uniform over [0, V), 1 in 17 ignore_index
};

// Every value depends only on (seed, tensor, index): the same data whatever the threading.
ProblemData make_problem_data(const runtime::Problem& problem, uint64_t seed);

uint16_t float_to_bf16(float value);  // round to nearest even
uint16_t float_to_half(float value);  // round to nearest even, subnormals kept
float bf16_to_float(uint16_t bits);
float half_to_float(uint16_t bits);

// `count` elements of `dtype` at `data`, as floats.
std::vector<float> to_float(const void* data, size_t count, DType dtype);

// ||actual - expected|| / ||expected||: 0 when both are all zeros, +inf when only expected
// is, when sizes differ, or when anything is not finite.
double relative_l2(const std::vector<float>& actual, const std::vector<float>& expected);
// The same over `count` raw elements of `dtype` each (no float copy of a [V, H] gradient).
double relative_l2(const void* actual, const void* expected, size_t count, DType dtype);

}  // namespace lfce::autotune
