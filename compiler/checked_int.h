// Integer arithmetic on sizes that must not wrap. Products and sums of a problem's dimensions
// (workspace bytes, CTA counts, N buckets) go through these: a result beyond int64 is a request
// too large to run, reported as a SpecError naming the operands and what they measure.
#pragma once

#include <cstdint>
#include <string>
#include <string_view>

#include "compiler/errors.h"

namespace lfce {

inline SpecError overflow(int64_t a, const char* op, int64_t b, std::string_view what) {
  return SpecError(std::string(what) + " = " + std::to_string(a) + op + std::to_string(b) + " does not fit in 64 bits");
}

inline int64_t checked_mul(int64_t a, int64_t b, std::string_view what) {
  int64_t out = 0;
  if (__builtin_mul_overflow(a, b, &out)) throw overflow(a, " * ", b, what);
  return out;
}

inline int64_t checked_add(int64_t a, int64_t b, std::string_view what) {
  int64_t out = 0;
  if (__builtin_add_overflow(a, b, &out)) throw overflow(a, " + ", b, what);
  return out;
}

// ceil(a / b) for a >= 0; a divisor below 1 is lfce's bug (every tile and granule is validated
// before it divides), never a SIGFPE.
inline int64_t ceil_div(int64_t a, int64_t b) {
  if (b < 1 || a < 0)
    throw InternalError("ceil_div(" + std::to_string(a) + ", " + std::to_string(b) + "): operands out of range");
  return a / b + (a % b != 0);
}

// a rounded up to a multiple of b (a >= 0, b >= 1).
inline int64_t round_up(int64_t a, int64_t b, std::string_view what) { return checked_mul(ceil_div(a, b), b, what); }

// The smallest power of two >= v (1 for v <= 1); SpecError beyond 2^62, the largest in int64.
inline int64_t next_pow2(int64_t v, std::string_view what) {
  constexpr int64_t kLargest = int64_t{1} << 62;
  if (v > kLargest)
    throw SpecError(std::string(what) + ": the power of two above " + std::to_string(v) + " does not fit in 64 bits");
  int64_t p = 1;
  while (p < v) p *= 2;  // at most 62 doublings
  return p;
}

}  // namespace lfce
