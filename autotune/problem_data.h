// Host-side data for measuring a problem: reproducible random inputs in the problem's dtypes,
// and conversions of 16-bit results back to float.
#pragma once

#include <cstddef>
#include <cstdint>
#include <functional>
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
// Throws SpecError naming a size product that does not fit in 64 bits.
ProblemData make_problem_data(const runtime::Problem& problem, uint64_t seed);

// body(begin, end) over [0, count) split in one contiguous range per core, one call per range
// (a weight of V x H is ~5e8 values); a count below serial_below runs in the calling thread.
void parallel_for(size_t count, const std::function<void(size_t, size_t)>& body, size_t serial_below = 1 << 16);

uint16_t float_to_bf16(float value);  // round to nearest even
uint16_t float_to_half(float value);  // round to nearest even, subnormals kept
float bf16_to_float(uint16_t bits);
float half_to_float(uint16_t bits);

// `count` elements of `dtype` at `data`, as floats.
std::vector<float> to_float(const void* data, size_t count, DType dtype);

}  // namespace lfce::autotune
