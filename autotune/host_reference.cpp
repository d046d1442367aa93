#include "autotune/host_reference.h"

#include <algorithm>
#include <cmath>
#include <cstring>
#include <limits>
#include <mutex>
#include <sstream>

#include "compiler/checked_int.h"
#include "compiler/errors.h"

namespace lfce::autotune {
namespace {

using runtime::Problem;

constexpr size_t kBlock = 64;  // vocabulary rows per unit of work: 64 x H doubles stay in cache

// out[2 * a + b] = x_a . w_b for two rows of x and two of w: four dot products share each
// load, in eight independent chains.
void dot2x2(const double* x0, const double* x1, const double* w0, const double* w1, size_t n, double out[4]) {
  double a[8] = {};
  size_t i = 0;
  for (; i + 2 <= n; i += 2)
    for (size_t k = 0; k < 2; ++k) {
      a[0 + k] += x0[i + k] * w0[i + k];
      a[2 + k] += x0[i + k] * w1[i + k];
      a[4 + k] += x1[i + k] * w0[i + k];
      a[6 + k] += x1[i + k] * w1[i + k];
    }
  for (; i < n; ++i) {
    a[0] += x0[i] * w0[i];
    a[2] += x0[i] * w1[i];
    a[4] += x1[i] * w0[i];
    a[6] += x1[i] * w1[i];
  }
  for (int k = 0; k < 4; ++k) out[k] = a[2 * k] + a[2 * k + 1];
}

void axpy(double alpha, const double* x, double* y, size_t n) {
  for (size_t i = 0; i < n; ++i) y[i] += alpha * x[i];
}

std::vector<double> as_double(const uint8_t* data, size_t count, DType dtype) {
  const std::vector<float> f = to_float(data, count, dtype);
  return std::vector<double>(f.begin(), f.end());
}

// The problem's inputs as the reference reads them.
class Inputs {
 public:
  Inputs(const Problem& p, const ProblemData& data)
      : p_(p), data_(data), n_(static_cast<size_t>(p.tokens)), h_(static_cast<size_t>(p.hidden)) {
    const size_t e = dtype_bytes(p.dtype);
    const size_t hidden_elements = static_cast<size_t>(checked_mul(p.tokens, p.hidden, "hidden elements (N * H)"));
    const size_t weight_elements = static_cast<size_t>(checked_mul(p.vocab, p.hidden, "weight elements (V * H)"));
    const size_t target_bytes = p.targets == IndexType::I64 ? 8 : 4;
    if (data.hidden.size() < hidden_elements * e || data.weight.size() < weight_elements * e ||
        data.targets.size() < n_ * target_bytes || (p.bias && data.bias.size() < static_cast<size_t>(p.vocab) * e))
      throw InternalError("host reference: the problem data is smaller than the problem");
    x_ = as_double(data.hidden.data(), hidden_elements, p.dtype);
    if (p.bias) bias_ = as_double(data.bias.data(), static_cast<size_t>(p.vocab), p.dtype);
    target_.resize(n_);
    for (size_t t = 0; t < n_; ++t) {
      int64_t value = 0;
      if (target_bytes == 8) {
        std::memcpy(&value, data.targets.data() + 8 * t, 8);
      } else {
        int32_t v32 = 0;
        std::memcpy(&v32, data.targets.data() + 4 * t, 4);
        value = v32;
      }
      // Ignored (or outside [0, V): no class of it) contributes no loss and no gradient.
      target_[t] = value == p.ignore_index || value < 0 || value >= p.vocab ? -1 : value;
      if (target_[t] >= 0) ++valid_;
    }
  }

  size_t tokens() const { return n_; }
  size_t hidden() const { return h_; }
  size_t blocks() const { return (static_cast<size_t>(p_.vocab) + kBlock - 1) / kBlock; }
  const double* x(size_t t) const { return x_.data() + t * h_; }
  int64_t target(size_t t) const { return target_[t]; }
  int64_t valid() const { return valid_; }

  // Rows [v0, v1) of block b into w ([v1 - v0, H]) and every token's logits against them into
  // logits ([N, v1 - v0]).
  void block(size_t b, size_t& v0, size_t& v1, std::vector<double>& w, std::vector<double>& logits) const {
    v0 = b * kBlock;
    v1 = std::min(v0 + kBlock, static_cast<size_t>(p_.vocab));
    const size_t rows = v1 - v0;
    w = as_double(data_.weight.data() + v0 * h_ * dtype_bytes(p_.dtype), rows * h_, p_.dtype);
    logits.resize(n_ * rows);
    for (size_t t = 0; t < n_; t += 2)
      for (size_t j = 0; j < rows; j += 2) {
        // Odd counts: the last token or row is paired with itself (its result written once).
        const size_t t1 = std::min(t + 1, n_ - 1), j1 = std::min(j + 1, rows - 1);
        double d[4];
        dot2x2(x(t), x(t1), w.data() + j * h_, w.data() + j1 * h_, h_, d);
        const size_t ts[2] = {t, t1}, js[2] = {j, j1};
        for (int a = 0; a < 2; ++a)
          for (int c = 0; c < 2; ++c)
            logits[ts[a] * rows + js[c]] = d[2 * a + c] + (p_.bias ? bias_[v0 + js[c]] : 0.0);
      }
  }

 private:
  const Problem& p_;
  const ProblemData& data_;
  size_t n_, h_;
  std::vector<double> x_, bias_;
  std::vector<int64_t> target_;  // -1: contributes nothing
  int64_t valid_ = 0;
};

// Per token: the log-sum-exp of its logits and its target's logit, over all of V.
void log_sum_exp(const Inputs& in, std::vector<double>& lse, std::vector<double>& target_logit) {
  const size_t n = in.tokens();
  const double inf = std::numeric_limits<double>::infinity();
  std::vector<double> max(n, -inf), sum(n, 0.0);
  target_logit.assign(n, 0.0);
  std::mutex mutex;
  parallel_for(
      in.blocks(),
      [&](size_t b0, size_t b1) {
        std::vector<double> m(n, -inf), s(n, 0.0), w, logits;
        for (size_t b = b0; b < b1; ++b) {
          size_t v0, v1;
          in.block(b, v0, v1, w, logits);
          const size_t rows = v1 - v0;
          for (size_t t = 0; t < n; ++t)
            for (size_t j = 0; j < rows; ++j) {
              const double l = logits[t * rows + j];
              if (l > m[t]) {
                s[t] = s[t] * std::exp(m[t] - l) + 1.0;
                m[t] = l;
              } else {
                s[t] += std::exp(l - m[t]);
              }
              if (in.target(t) == static_cast<int64_t>(v0 + j)) target_logit[t] = l;  // one writer per token
            }
        }
        std::lock_guard<std::mutex> lock(mutex);
        for (size_t t = 0; t < n; ++t) {
          if (m[t] == -inf) continue;
          const double top = std::max(max[t], m[t]);
          sum[t] = sum[t] * std::exp(max[t] - top) + s[t] * std::exp(m[t] - top);
          max[t] = top;
        }
      },
      2);
  lse.resize(n);
  for (size_t t = 0; t < n; ++t) lse[t] = max[t] + std::log(sum[t]);
}

std::vector<float> rounded(const std::vector<double>& v) { return std::vector<float>(v.begin(), v.end()); }

double element(const void* data, size_t i, DType dtype) {
  if (dtype == DType::FP32) return static_cast<const float*>(data)[i];
  const uint16_t bits = static_cast<const uint16_t*>(data)[i];
  return dtype == DType::BF16 ? bf16_to_float(bits) : half_to_float(bits);
}

// `value` rounded to `dtype`, as a kernel storing it would.
double round_to(double value, DType dtype) {
  const float f = static_cast<float>(value);
  if (dtype == DType::FP32) return f;
  return dtype == DType::BF16 ? bf16_to_float(float_to_bf16(f)) : half_to_float(float_to_half(f));
}

// The spacing of the dtype's subnormals: no rounding to it can be finer.
double smallest_step(DType dtype) {
  switch (dtype) {
    case DType::BF16: return std::ldexp(1.0, -133);
    case DType::FP16: return std::ldexp(1.0, -24);
    default: return std::ldexp(1.0, -149);
  }
}

double unit_roundoff(DType dtype) {
  switch (dtype) {
    case DType::BF16: return std::ldexp(1.0, -8);
    case DType::FP16: return std::ldexp(1.0, -11);
    default: return std::ldexp(1.0, -24);
  }
}

}  // namespace

Problem verify_problem(const Problem& problem, int64_t chunk) {
  Problem p = problem;
  p.tokens = std::min(problem.tokens, kVerifyTokens);
  p.chunk_size = chunk;
  return p;
}

Reference host_reference(const Problem& p, const ProblemData& data, bool backward) {
  const Inputs in(p, data);
  const size_t n = in.tokens(), h = in.hidden();
  std::vector<double> lse, target_logit;
  log_sum_exp(in, lse, target_logit);
  Reference ref;
  ref.valid_count = static_cast<float>(in.valid());
  std::vector<double> loss(n, 0.0);
  for (size_t t = 0; t < n; ++t)
    if (in.target(t) >= 0) loss[t] = lse[t] - target_logit[t];
  ref.lse = rounded(lse);
  ref.token_loss = rounded(loss);
  if (!backward) return ref;

  // dz[t, v] = (softmax - one-hot) * g / count (mean) or * g (sum, none), g = 1; 0 if ignored.
  std::vector<double> scale(n, 0.0);
  for (size_t t = 0; t < n; ++t)
    if (in.target(t) >= 0) scale[t] = p.reduction == Reduction::Mean ? 1.0 / static_cast<double>(in.valid()) : 1.0;
  const size_t v_total = static_cast<size_t>(p.vocab);
  ref.grad_weight.resize(v_total * h);
  if (p.bias) ref.grad_bias.resize(v_total);
  std::vector<double> grad_hidden(n * h, 0.0);
  std::mutex mutex;
  parallel_for(
      in.blocks(),
      [&](size_t b0, size_t b1) {
        std::vector<double> gh(n * h, 0.0), w, dz, gw;
        for (size_t b = b0; b < b1; ++b) {
          size_t v0, v1;
          in.block(b, v0, v1, w, dz);  // the logits, turned into dz in place
          const size_t rows = v1 - v0;
          for (size_t t = 0; t < n; ++t)
            for (size_t j = 0; j < rows; ++j) {
              const double one_hot = in.target(t) == static_cast<int64_t>(v0 + j) ? 1.0 : 0.0;
              double& z = dz[t * rows + j];
              z = scale[t] == 0 ? 0.0 : (std::exp(z - lse[t]) - one_hot) * scale[t];
            }
          // Token-major, so that one token's rows (x, grad_hidden) stay in L1 while the
          // block's weight and grad_weight rows (64 x H) stay in L2.
          gw.assign(rows * h, 0.0);
          for (size_t t = 0; t < n; ++t)
            for (size_t j = 0; j < rows; ++j) {
              const double z = dz[t * rows + j];
              if (z == 0) continue;
              axpy(z, in.x(t), gw.data() + j * h, h);
              axpy(z, w.data() + j * h, gh.data() + t * h, h);
            }
          std::copy(gw.begin(), gw.end(), ref.grad_weight.begin() + v0 * h);
          if (p.bias)
            for (size_t j = 0; j < rows; ++j) {
              double sum = 0;
              for (size_t t = 0; t < n; ++t) sum += dz[t * rows + j];
              ref.grad_bias[v0 + j] = static_cast<float>(sum);
            }
        }
        std::lock_guard<std::mutex> lock(mutex);
        for (size_t i = 0; i < n * h; ++i) grad_hidden[i] += gh[i];
      },
      2);
  ref.grad_hidden = rounded(grad_hidden);
  return ref;
}

Tolerance loss_tolerance(DType dtype) {
  const double u = unit_roundoff(dtype);
  return Tolerance{(dtype == DType::FP32 ? 1e-5 : 2e-3) + u, 2 * u + 1e-5, 1e-5};
}

Tolerance gradient_tolerance(DType dtype) {
  switch (dtype) {
    case DType::BF16: return Tolerance{6e-3, std::ldexp(1.0, -7), std::ldexp(1.0, -7)};
    case DType::FP16: return Tolerance{5e-3, std::ldexp(1.0, -10), std::ldexp(1.0, -10)};
    default: return Tolerance{1e-4, 1e-4, 3e-5};
  }
}

Verdict compare_output(std::string_view name, const void* actual, DType dtype, const std::vector<float>& expected,
                       const Tolerance& tol) {
  const size_t n = expected.size();
  double e_max = 0, e_sq = 0;
  for (float e : expected) {
    e_max = std::max(e_max, std::fabs(static_cast<double>(e)));
    e_sq += static_cast<double>(e) * e;
  }
  const double atol = std::max(tol.atol * e_max, smallest_step(dtype));
  const double inf = std::numeric_limits<double>::infinity();
  double d_sq = 0, r_sq = 0, worst = 0;
  size_t bad = 0, first = n;
  for (size_t i = 0; i < n; ++i) {
    const double a = element(actual, i, dtype), e = expected[i];
    const double d = std::fabs(a - e);  // NaN for a NaN output: fails every comparison below
    d_sq = std::isfinite(d) ? d_sq + d * d : inf;
    const double r = round_to(e, dtype) - e;
    r_sq += r * r;
    const double bound = atol + tol.rtol * std::fabs(e);
    if (d <= bound) {
      worst = std::max(worst, d / bound);
    } else {
      worst = std::max(worst, std::isfinite(d) ? d / bound : inf);
      if (bad++ == 0) first = i;
    }
  }
  const double rel = e_sq > 0 ? std::sqrt(d_sq / e_sq) : (d_sq == 0 ? 0.0 : inf);
  const double rounding = e_sq > 0 ? std::sqrt(r_sq / e_sq) : 0.0;
  const double limit = std::max(tol.rel_l2, 1.5 * rounding);
  Verdict v;
  v.score = std::max(worst, rel / limit);
  std::ostringstream why;
  why.precision(6);
  if (!(rel <= limit)) why << "rel L2 " << rel << " > tolerance " << limit;
  if (bad > 0) {
    if (!why.str().empty()) why << "; ";
    why << bad << " element(s) off by more than atol " << atol << " + rtol " << tol.rtol << " * |expected|; first at "
        << first << ": expected " << expected[first] << ", got " << element(actual, first, dtype);
  }
  if (!why.str().empty()) v.failure = std::string(name) + " (" + std::string(dtype_name(dtype)) + "): " + why.str();
  return v;
}

}  // namespace lfce::autotune
