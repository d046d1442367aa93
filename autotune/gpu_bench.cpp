// Measuring on the GPU: the problem's buffers filled with reproducible random data, each
// candidate run through runtime::forward / backward with its tuning, timed with CUDA events
// (warm-up, repetitions, median; L2 flushed before each timed run), optionally checked
// against an fp64 reference computed on the host (autotune/host_reference.h: on the first
// kVerifyTokens tokens of the same data).
#include <spdlog/spdlog.h>

#include <algorithm>
#include <optional>
#include <vector>

#include "autotune/device_buffers.h"
#include "autotune/host_reference.h"
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

runtime::Measurement failure(std::string reason) {
  runtime::Measurement m;
  m.error = std::move(reason);
  return m;
}

class GpuBench final : public Bench {
 public:
  GpuBench(const Problem& problem, int device, const TuneOptions& options)
      : p_(problem), device_(device), options_(options), arch_(runtime::device_info(device).arch()),
        limits_(options.limits) {}

  std::string device_name() const override { return runtime::device_info(device_).name; }

  runtime::Measurement measure(KernelKind kind, const Tuning& tuning) override {
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
      runtime::Measurement m;
      if (options_.verify) {
        const Verdict v = verify(fwd, tuning);
        m.verify_error = v.score;
        if (!v.ok()) {
          runtime::Measurement rejected = failure("verify against the fp64 host reference (first " +
                                         std::to_string(verify_problem(p_, 0).tokens) + " tokens): " + v.failure);
          rejected.verify_error = v.score;
          return rejected;
        }
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
    const runtime::Plan plan(p_, arch_, Tuning{}, limits_);
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
    if (options_.verify) prepare_verification(data);
  }

 private:
  // Output buffers of the forward, and the LSE and count the backward reads.
  struct ForwardOut {
    DeviceBuffer *lse, *token_loss, *loss, *count, *workspace;
  };
  struct BackwardIn {
    const DeviceBuffer *lse, *count, *workspace;
  };

  void run(bool fwd, const Tuning& tuning) {
    if (fwd)
      forward(p_, tuning, {&lse_, &token_loss_, &loss_, &count_, &forward_ws_});
    else
      backward(p_, tuning, {&lse_, &count_, &backward_ws_});
  }

  runtime::Plan plan_of(const Problem& p, const Tuning& tuning) const { return runtime::Plan(p, arch_, tuning, limits_); }

  void forward(const Problem& p, const Tuning& tuning, const ForwardOut& out) {
    runtime::ForwardArgs a;
    a.hidden = hidden_.get();
    a.weight = weight_.get();
    a.bias = p.bias ? bias_.get() : nullptr;
    a.targets = targets_.get();
    a.lse = static_cast<float*>(out.lse->get());
    a.token_loss = static_cast<float*>(out.token_loss->get());
    a.loss = static_cast<float*>(out.loss->get());
    a.valid_count = static_cast<float*>(out.count->get());
    a.workspace = out.workspace->get();
    a.workspace_bytes = out.workspace->bytes();
    a.device = device_;
    runtime::forward(p, a, [&](const Problem& q, int) { return plan_of(q, tuning); });
  }

  void backward(const Problem& p, const Tuning& tuning, const BackwardIn& in) {
    runtime::BackwardArgs a;
    a.hidden = hidden_.get();
    a.weight = weight_.get();
    a.bias = p.bias ? bias_.get() : nullptr;
    a.targets = targets_.get();
    a.lse = static_cast<const float*>(in.lse->get());
    a.valid_count = static_cast<const float*>(in.count->get());
    a.grad_loss = static_cast<const float*>(grad_loss_.get());
    a.grad_hidden = grad_hidden_.get();
    a.grad_weight = grad_weight_.get();
    a.grad_bias = p.bias ? grad_bias_.get() : nullptr;
    a.workspace = in.workspace->get();
    a.workspace_bytes = in.workspace->bytes();
    a.device = device_;
    runtime::backward(p, a, [&](const Problem& q, int) { return plan_of(q, tuning); });
  }

  // Compiles and loads the direction's GEMM kernels; a kernel that spills registers to local
  // memory is slow by construction and is not measured.
  std::string spills(bool fwd, const Tuning& tuning) {
    const runtime::Plan plan = plan_of(p_, tuning);
    for (const KernelKindInfo& info : kKernelKinds) {
      if (!info.gemm || info.eager || info.backward == fwd) continue;
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

  // The host reference of the verification problem (both directions, once per sweep), its LSE
  // and count for the backward to read, and the forward's own outputs.
  void prepare_verification(const ProblemData& data) {
    const Problem v = verify_problem(p_, 0);
    spdlog::info("computing the fp64 host reference of the first {} tokens for --verify", v.tokens);
    reference_ = host_reference(v, data, true);
    const size_t n = static_cast<size_t>(v.tokens);
    verify_lse_in_ = DeviceBuffer(4 * n);
    verify_lse_in_.upload(reference_.lse.data(), 4 * n);
    verify_count_in_ = DeviceBuffer(16);
    verify_count_in_.upload(&reference_.valid_count, 4);
    for (DeviceBuffer* b : {&verify_lse_, &verify_token_loss_}) *b = DeviceBuffer(4 * n);
    for (DeviceBuffer* b : {&verify_loss_, &verify_count_}) *b = DeviceBuffer(16);
  }

  static void reserve(DeviceBuffer& buffer, size_t bytes) {
    if (buffer.bytes() < bytes) buffer = DeviceBuffer(std::max<size_t>(bytes, 256));
  }

  // The candidate's outputs on the verification problem (the vocabulary chunk the candidate is
  // timed with) against the host reference: the worst score, and the first failure.
  Verdict verify(bool fwd, const Tuning& tuning) {
    const Problem v = verify_problem(p_, plan_of(p_, tuning).chunk());
    const runtime::Plan plan = plan_of(v, tuning);
    std::vector<Verdict> verdicts;
    auto check = [&](const char* name, const DeviceBuffer& b, DType dtype, const std::vector<float>& expected,
                     const Tolerance& tolerance) {
      std::vector<uint8_t> host(expected.size() * dtype_bytes(dtype));
      b.download(host.data(), host.size());
      verdicts.push_back(compare_output(name, host.data(), dtype, expected, tolerance));
    };
    if (fwd) {
      reserve(verify_forward_ws_, plan.forward_layout().bytes);
      forward(v, tuning, {&verify_lse_, &verify_token_loss_, &verify_loss_, &verify_count_, &verify_forward_ws_});
      synchronize();
      check("lse", verify_lse_, DType::FP32, reference_.lse, loss_tolerance(v.dtype));
      check("token_loss", verify_token_loss_, DType::FP32, reference_.token_loss, loss_tolerance(v.dtype));
    } else {
      reserve(verify_backward_ws_, plan.backward_layout().bytes);
      backward(v, tuning, {&verify_lse_in_, &verify_count_in_, &verify_backward_ws_});
      synchronize();
      check("grad_hidden", grad_hidden_, v.dtype, reference_.grad_hidden, gradient_tolerance(v.dtype));
      check("grad_weight", grad_weight_, v.dtype, reference_.grad_weight, gradient_tolerance(v.dtype));
      if (v.bias) check("grad_bias", grad_bias_, v.dtype, reference_.grad_bias, gradient_tolerance(v.dtype));
    }
    Verdict worst;
    for (const Verdict& verdict : verdicts) {
      worst.score = std::max(worst.score, verdict.score);
      if (worst.failure.empty()) worst.failure = verdict.failure;
    }
    return worst;
  }

  Problem p_;
  int device_;
  TuneOptions options_;
  Arch arch_;
  runtime::DeviceLimits limits_;
  bool lse_from_default_ = false;
  DeviceBuffer hidden_, weight_, bias_, targets_, lse_, token_loss_, loss_, count_, grad_loss_;
  DeviceBuffer grad_hidden_, grad_weight_, grad_bias_, forward_ws_, backward_ws_, flush_;
  // --verify: the reference, and the verification problem's own buffers.
  Reference reference_;
  DeviceBuffer verify_lse_in_, verify_count_in_, verify_lse_, verify_token_loss_, verify_loss_, verify_count_;
  DeviceBuffer verify_forward_ws_, verify_backward_ws_;
};

}  // namespace

TuneResult tune(const Problem& problem, int device, const TuneOptions& options) {
  runtime::make_context_current(device);
  const runtime::DeviceInfo& info = runtime::device_info(device);
  const Arch arch = info.arch();
  TuneOptions on_device = options;
  // Candidates are pruned against this device's limits, run with them, and their winners keyed by them.
  on_device.limits = runtime::DeviceLimits{info.max_smem_optin, info.sm_count};
  // Tiles are tuned without class weights (which need an array of them), storing the gradients
  // (not adding into fp32 buffers) and without a causal shift (the host reference scores each
  // token against its own target); the tuning key leaves those options out, so the winners serve
  // those problems too.
  Problem plain = problem;
  plain.class_weight = false;
  plain.accumulate_grad_weight = plain.accumulate_grad_bias = false;
  plain.sequence_length = 0;
  GpuBench bench(plain, device, on_device);
  spdlog::info("tuning on {} ({}): N={} H={} V={} {}", bench.device_name(), arch_name(arch), problem.tokens,
               problem.hidden, problem.vocab, dtype_name(problem.dtype));
  return tune_with(bench, problem, arch, on_device);
}

}  // namespace lfce::autotune
