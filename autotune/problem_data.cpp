#include "autotune/problem_data.h"

#include <algorithm>
#include <cmath>
#include <cstring>
#include <functional>
#include <limits>
#include <thread>

#include "compiler/checked_int.h"

namespace lfce::autotune {
namespace {

uint64_t splitmix64(uint64_t x) {
  x += 0x9e3779b97f4a7c15ull;
  x = (x ^ (x >> 30)) * 0xbf58476d1ce4e5b9ull;
  x = (x ^ (x >> 27)) * 0x94d049bb133111ebull;
  return x ^ (x >> 31);
}

// Uniform in (0, 1]: never 0, so the logarithm of Box-Muller is finite.
double unit(uint64_t bits) { return (static_cast<double>(bits >> 11) + 1.0) * 0x1.0p-53; }

float normal(uint64_t stream, uint64_t index) {
  uint64_t a = splitmix64(stream ^ splitmix64(2 * index));
  uint64_t b = splitmix64(stream ^ splitmix64(2 * index + 1));
  return static_cast<float>(std::sqrt(-2.0 * std::log(unit(a))) * std::cos(2.0 * M_PI * unit(b)));
}

std::vector<uint8_t> normal_tensor(size_t count, DType dtype, float stddev, uint64_t stream) {
  std::vector<uint8_t> out(static_cast<size_t>(
      checked_mul(static_cast<int64_t>(count), dtype_bytes(dtype), "random tensor bytes")));
  parallel_for(count, [&](size_t begin, size_t end) {
    for (size_t i = begin; i < end; ++i) {
      float v = stddev * normal(stream, i);
      if (dtype == DType::FP32) {
        std::memcpy(out.data() + 4 * i, &v, 4);
      } else {
        uint16_t h = dtype == DType::BF16 ? float_to_bf16(v) : float_to_half(v);
        std::memcpy(out.data() + 2 * i, &h, 2);
      }
    }
  });
  return out;
}

}  // namespace

void parallel_for(size_t count, const std::function<void(size_t, size_t)>& body, size_t serial_below) {
  const size_t threads = std::clamp<size_t>(std::thread::hardware_concurrency(), 1, 64);
  if (count < serial_below || threads == 1) return body(0, count);
  std::vector<std::thread> pool;
  const size_t step = (count + threads - 1) / threads;
  for (size_t begin = 0; begin < count; begin += step)
    pool.emplace_back(body, begin, std::min(count, begin + step));
  for (auto& t : pool) t.join();
}

ProblemData make_problem_data(const runtime::Problem& p, uint64_t seed) {
  const uint64_t s = splitmix64(seed);
  ProblemData d;
  d.hidden = normal_tensor(static_cast<size_t>(checked_mul(p.tokens, p.hidden, "hidden elements (N * H)")), p.dtype,
                           1.0f, s ^ 1);
  d.weight = normal_tensor(static_cast<size_t>(checked_mul(p.vocab, p.hidden, "weight elements (V * H)")), p.dtype,
                           2.5f / std::sqrt(static_cast<float>(p.hidden)), s ^ 2);
  if (p.bias) d.bias = normal_tensor(static_cast<size_t>(p.vocab), p.dtype, 0.1f, s ^ 3);
  const int bytes = p.targets == IndexType::I64 ? 8 : 4;
  d.targets.resize(static_cast<size_t>(checked_mul(p.tokens, bytes, "target bytes")));
  for (int64_t i = 0; i < p.tokens; ++i) {
    uint64_t h = splitmix64((s ^ 4) + splitmix64(i));
    int64_t t = h % 17 == 0 ? p.ignore_index : static_cast<int64_t>((h >> 8) % static_cast<uint64_t>(p.vocab));
    if (bytes == 8) {
      std::memcpy(d.targets.data() + 8 * i, &t, 8);
    } else {
      int32_t t32 = static_cast<int32_t>(t);
      std::memcpy(d.targets.data() + 4 * i, &t32, 4);
    }
  }
  return d;
}

uint16_t float_to_bf16(float value) {
  uint32_t x;
  std::memcpy(&x, &value, 4);
  if ((x & 0x7fffffffu) > 0x7f800000u) return static_cast<uint16_t>((x >> 16) | 0x40);  // quiet NaN
  x += 0x7fffu + ((x >> 16) & 1u);
  return static_cast<uint16_t>(x >> 16);
}

uint16_t float_to_half(float value) {
  uint32_t x;
  std::memcpy(&x, &value, 4);
  const uint32_t sign = (x >> 16) & 0x8000u;
  const uint32_t exp8 = (x >> 23) & 0xffu;
  uint32_t mant = x & 0x7fffffu;
  if (exp8 == 0xff) return static_cast<uint16_t>(sign | 0x7c00u | (mant ? 0x200u : 0u));
  const int exp = static_cast<int>(exp8) - 127 + 15;
  if (exp >= 31) return static_cast<uint16_t>(sign | 0x7c00u);
  if (exp <= 0) {  // subnormal half (or zero)
    if (exp < -10) return static_cast<uint16_t>(sign);
    mant |= 0x800000u;
    const int shift = 14 - exp;
    uint32_t h = mant >> shift;
    const uint32_t rem = mant & ((1u << shift) - 1), half = 1u << (shift - 1);
    if (rem > half || (rem == half && (h & 1u))) ++h;
    return static_cast<uint16_t>(sign | h);
  }
  uint32_t h = sign | (static_cast<uint32_t>(exp) << 10) | (mant >> 13);
  const uint32_t rem = mant & 0x1fffu;
  if (rem > 0x1000u || (rem == 0x1000u && (h & 1u))) ++h;  // a carry into the exponent is right
  return static_cast<uint16_t>(h);
}

float bf16_to_float(uint16_t bits) {
  uint32_t x = static_cast<uint32_t>(bits) << 16;
  float f;
  std::memcpy(&f, &x, 4);
  return f;
}

float half_to_float(uint16_t bits) {
  const uint32_t sign = (bits & 0x8000u) << 16;
  const uint32_t exp = (bits >> 10) & 0x1fu;
  const uint32_t mant = bits & 0x3ffu;
  uint32_t x;
  if (exp == 0x1f) {
    x = sign | 0x7f800000u | (mant << 13);
  } else if (exp == 0) {
    if (mant == 0) {
      x = sign;
    } else {  // subnormal: value = mant * 2^-24
      float f = std::ldexp(static_cast<float>(mant), -24);
      return sign ? -f : f;
    }
  } else {
    x = sign | ((exp + 127 - 15) << 23) | (mant << 13);
  }
  float f;
  std::memcpy(&f, &x, 4);
  return f;
}

std::vector<float> to_float(const void* data, size_t count, DType dtype) {
  std::vector<float> out(count);
  if (dtype == DType::FP32) {
    std::memcpy(out.data(), data, 4 * count);
    return out;
  }
  const auto* bits = static_cast<const uint16_t*>(data);
  for (size_t i = 0; i < count; ++i) out[i] = dtype == DType::BF16 ? bf16_to_float(bits[i]) : half_to_float(bits[i]);
  return out;
}

}  // namespace lfce::autotune
