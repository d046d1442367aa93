// Measuring on the GPU: the problem's buffers filled with reproducible random data, each
// candidate run through runtime::forward / backward with its tuning, timed with CUDA events
// (warm-up, repetitions, median; L2 flushed before each timed run), optionally checked
// against the default config's outputs.
#include <spdlog/spdlog.h>

#include <algorithm>
#include <optional>
#include <vector>

#include "autotune/device_buffers.h"
#include "autotune/problem_data.h"
#include "autotune/tuner.h"
#include "runtime/driver.h"
#include "runtime/kernel_cache.h"
#include "runtime/launch.h"

namespace lfce::autotune {
namespace {

using runtime::CudaError;
using runtime::Problem;
using runtime::Tuning;

// Larger than any GPU's L2 (H200: 60 MB): rewriting it evicts the operands of the last run.
constexpr size_t kFlushBytes = 256u << 20;

// Errors after which the context is unusable: the sweep cannot go on in this process.
bool sticky(CUresult code) {
  switch (code) {
    case CUDA_ERROR_ILLEGAL_ADDRESS: case CUDA_ERROR_LAUNCH_FAILED: case CUDA_ERROR_ILLEGAL_INSTRUCTION:
    case CUDA_ERROR_MISALIGNED_ADDRESS: case CUDA_ERROR_INVALID_ADDRESS_SPACE: case CUDA_ERROR_INVALID_PC:
    case CUDA_ERROR_HARDWARE_STACK_ERROR: case CUDA_ERROR_ASSERT: case CUDA_ERROR_LAUNCH_TIMEOUT:
    case CUDA_ERROR_ECC_UNCORRECTABLE: case CUDA_ERROR_CONTEXT_IS_DESTROYED:
      return true;
    default:
      return false;
  }
}

bool is_forward(KernelKind kind) { return !kind_info(kind).backward; }

Measurement failure(std::string reason) {
  Measurement m;
  m.error = std::move(reason);
  return m;
}

// A host copy of the outputs one direction produces, raw, with the dtype of each.
struct Outputs {
  struct Tensor {
    const char* name;
    std::vector<uint8_t> bytes;
    DType dtype;
  };
  std::vector<Tensor> tensors;
};

class GpuBench final : public Bench {
 public:
  GpuBench(const Problem& problem, int device, const TuneOptions& options)
      : p_(problem), device_(device), options_(options), arch_(runtime::device_info(device).arch()) {}

  std::string device_name() const override { return runtime::device_info(device_).name; }

  Measurement measure(KernelKind kind, const Tuning& tuning) override {
    try {
      const bool fwd = is_forward(kind);
      if (!fwd && !lse_from_default_) {  // the backward reads the forward's LSE and count
        run(true, Tuning{});
        lse_from_default_ = true;
      }
      if (std::string spill = spills(fwd, tuning); !spill.empty()) return failure(spill);
      run(fwd, tuning);  // the first run: a launch failure shows here, before any timing
      if (fwd) lse_from_default_ = false;
      synchronize();
      Measurement m;
      if (options_.verify) {
        m.verify_error = verify_error(fwd);
        const double tolerance = verify_tolerance(p_.dtype);
        if (!(m.verify_error <= tolerance))
          return failure("verify: relative L2 error " + std::to_string(m.verify_error) + " against the default config > " +
                         std::to_string(tolerance));
      }
      for (int i = 0; i < options_.warmup; ++i) run(fwd, tuning);
      std::vector<double> times;
      EventTimer timer;
      for (int i = 0; i < std::max(options_.repetitions, 1); ++i) {
        flush_l2(i);
        timer.start(nullptr);
        run(fwd, tuning);
        times.push_back(timer.stop(nullptr));
      }
      std::nth_element(times.begin(), times.begin() + times.size() / 2, times.end());
      m.ms = times[times.size() / 2];
      return m;
    } catch (const CudaError& e) {
      if (sticky(e.code()) || dynamic_cast<const runtime::DriverUnavailable*>(&e)) throw;
      return failure(e.what());
    } catch (const std::exception& e) {  // CompileError, SpecError (e.g. grid too large)
      return failure(e.what());
    }
  }

  // Allocates and fills the buffers before the first measurement: a sweep with nothing left
  // to measure touches no memory.
  void prepare() override {
    runtime::make_context_current(device_);
    const ProblemData data = make_problem_data(p_, options_.seed);
    const size_t e = dtype_bytes(p_.dtype), n = p_.tokens, h = p_.hidden, v = p_.vocab;
    const runtime::Plan plan(p_, arch_);
    auto upload = [](const std::vector<uint8_t>& host) {
      DeviceBuffer b(std::max<size_t>(host.size(), 16));
      b.upload(host.data(), host.size());
      return b;
    };
    hidden_ = upload(data.hidden);
    weight_ = upload(data.weight);
    bias_ = upload(data.bias);
    targets_ = upload(data.targets);
    lse_ = DeviceBuffer(4 * n);
    token_loss_ = DeviceBuffer(4 * n);
    loss_ = DeviceBuffer(16);
    count_ = DeviceBuffer(16);
    const std::vector<float> ones(n, 1.0f);  // grad_loss: [1] for mean/sum, [N] for none
    grad_loss_ = DeviceBuffer(4 * n);
    grad_loss_.upload(ones.data(), 4 * n);
    grad_hidden_ = DeviceBuffer(e * n * h);
    grad_weight_ = DeviceBuffer(e * v * h);
    grad_bias_ = DeviceBuffer(std::max<size_t>(e * v, 16));
    forward_ws_ = DeviceBuffer(std::max<size_t>(plan.forward_layout().bytes, 256));
    backward_ws_ = DeviceBuffer(std::max<size_t>(plan.backward_layout().bytes, 256));
    flush_ = DeviceBuffer(kFlushBytes);
  }

 private:
  void run(bool fwd, const Tuning& tuning) {
    const auto plan = [&](const runtime::Problem& p, int) { return runtime::Plan(p, arch_, tuning); };
    if (fwd) {
      lfce_forward_args a{hidden_.get(), weight_.get(), p_.bias ? bias_.get() : nullptr, targets_.get(),
                          static_cast<float*>(lse_.get()), static_cast<float*>(token_loss_.get()),
                          static_cast<float*>(loss_.get()), static_cast<float*>(count_.get()), forward_ws_.get(),
                          forward_ws_.bytes(), device_, nullptr};
      runtime::forward(p_, a, plan);
    } else {
      lfce_backward_args a{hidden_.get(), weight_.get(), p_.bias ? bias_.get() : nullptr, targets_.get(),
                           static_cast<const float*>(lse_.get()), static_cast<const float*>(count_.get()),
                           static_cast<const float*>(grad_loss_.get()), grad_hidden_.get(), grad_weight_.get(),
                           p_.bias ? grad_bias_.get() : nullptr, backward_ws_.get(), backward_ws_.bytes(), device_,
                           nullptr};
      runtime::backward(p_, a, plan);
    }
  }

  // Compiles and loads the direction's GEMM kernels; a kernel that spills registers to local
  // memory is slow by construction and is not measured.
  std::string spills(bool fwd, const Tuning& tuning) {
    const runtime::Plan plan(p_, arch_, tuning);
    for (const KernelKindInfo& info : kKernelKinds) {
      if (!info.gemm || info.backward == fwd) continue;
      const KernelSpec spec = plan.spec(info.kind);
      const runtime::KernelResources& r = runtime::kernel_for(device_, spec).loaded.resources();
      if (r.local_bytes > 0)
        return "spills: " + std::to_string(r.local_bytes) + " bytes of local memory per thread, " +
               std::to_string(r.registers) + " registers (" + spec.text() + ")";
    }
    return "";
  }

  void flush_l2(int round) {
    runtime::check(runtime::Driver::get().cuMemsetD32Async(flush_.ptr(), static_cast<unsigned>(round),
                                                           kFlushBytes / 4, nullptr),
                   "cuMemsetD32Async");
  }

  Outputs read_outputs(bool fwd) const {
    auto copy = [](const char* name, const DeviceBuffer& b, size_t bytes, DType dtype) {
      Outputs::Tensor t{name, std::vector<uint8_t>(bytes), dtype};
      b.download(t.bytes.data(), bytes);
      return t;
    };
    const size_t e = dtype_bytes(p_.dtype), n = p_.tokens, h = p_.hidden, v = p_.vocab;
    Outputs out;
    if (fwd) {
      out.tensors.push_back(copy("lse", lse_, 4 * n, DType::FP32));
      out.tensors.push_back(copy("token_loss", token_loss_, 4 * n, DType::FP32));
    } else {
      out.tensors.push_back(copy("grad_hidden", grad_hidden_, e * n * h, p_.dtype));
      out.tensors.push_back(copy("grad_weight", grad_weight_, e * v * h, p_.dtype));
      if (p_.bias) out.tensors.push_back(copy("grad_bias", grad_bias_, e * v, p_.dtype));
    }
    return out;
  }

  // Largest relative L2 error over the direction's outputs against the default config's,
  // whose outputs are computed once (the current outputs are the candidate's: read first).
  double verify_error(bool fwd) {
    Outputs actual = read_outputs(fwd);
    std::optional<Outputs>& reference = fwd ? reference_forward_ : reference_backward_;
    if (!reference) {
      run(fwd, Tuning{});
      synchronize();
      reference = read_outputs(fwd);
    }
    double worst = 0;
    for (size_t i = 0; i < actual.tensors.size(); ++i) {
      const auto& a = actual.tensors[i];
      const auto& r = reference->tensors[i];
      const size_t count = a.bytes.size() / dtype_bytes(a.dtype);
      worst = std::max(worst, relative_l2(a.bytes.data(), r.bytes.data(), count, a.dtype));
    }
    return worst;
  }

  Problem p_;
  int device_;
  TuneOptions options_;
  Arch arch_;
  bool lse_from_default_ = false;
  DeviceBuffer hidden_, weight_, bias_, targets_, lse_, token_loss_, loss_, count_, grad_loss_;
  DeviceBuffer grad_hidden_, grad_weight_, grad_bias_, forward_ws_, backward_ws_, flush_;
  std::optional<Outputs> reference_forward_, reference_backward_;
};

}  // namespace

TuneResult tune(const Problem& problem, int device, const TuneOptions& options) {
  runtime::make_context_current(device);
  GpuBench bench(problem, device, options);
  const runtime::DeviceInfo& info = runtime::device_info(device);
  const Arch arch = info.arch();
  TuneOptions on_device = options;
  // Candidates are pruned against this device's limits, and its winners keyed by them.
  on_device.limits = runtime::DeviceLimits{info.max_smem_optin, info.sm_count};
  spdlog::info("tuning on {} ({}): N={} H={} V={} {}", bench.device_name(), arch_name(arch), problem.tokens,
               problem.hidden, problem.vocab, dtype_name(problem.dtype));
  return tune_with(bench, problem, arch, on_device);
}

}  // namespace lfce::autotune
