// The C API of liblfce.so: every entry point converts exceptions into a status and a
// per-thread message, so no C++ exception ever crosses into the caller.
#include <exception>
#include <optional>
#include <sstream>
#include <string>
#include <utility>

#include "api/args_from_c.h"
#include "api/problem_from_c.h"
#include "api/session.h"
#include "api/struct_layout.h"
#include "autotune/tuner.h"
#include "compiler/errors.h"
#include "compiler/nvptx_backend.h"
#include "lfce/lfce.h"
#include "runtime/disk_cache.h"
#include "runtime/driver.h"
#include "runtime/kernel_cache.h"
#include "runtime/launch.h"
#include "runtime/logging.h"
#include "runtime/module.h"
#include "runtime/plan.h"
#include "runtime/presets.h"
#include "templates/templates.h"

namespace {

thread_local std::string g_last_error;
// The numbers of the last LFCE_ERR_OUT_OF_RESOURCES on this thread (resource "" after any other outcome).
thread_local std::string g_resource;
thread_local int64_t g_resource_required = 0, g_resource_limit = 0;

template <typename F>
int guarded(const char* function, F&& body) {
  lfce::runtime::init_logging();
  g_last_error.clear();
  g_resource.clear();
  try {
    body();
    return LFCE_OK;
  } catch (const lfce::OutOfResources& e) {
    g_last_error = std::string(function) + ": " + e.what();
    g_resource = e.resource();
    g_resource_required = e.required();
    g_resource_limit = e.limit();
    return LFCE_ERR_OUT_OF_RESOURCES;
  } catch (const lfce::SpecError& e) {
    g_last_error = std::string(function) + ": " + e.what();
    return LFCE_ERR_INVALID_ARGUMENT;
  } catch (const std::invalid_argument& e) {
    g_last_error = std::string(function) + ": " + e.what();
    return LFCE_ERR_INVALID_ARGUMENT;
  } catch (const lfce::CompileError& e) {
    g_last_error = std::string(function) + ": " + e.what();
    return LFCE_ERR_COMPILE;
  } catch (const lfce::runtime::CudaError& e) {
    g_last_error = std::string(function) + ": " + e.what();
    return LFCE_ERR_CUDA;
  } catch (const lfce::runtime::CacheError& e) {
    g_last_error = std::string(function) + ": " + e.what();
    return LFCE_ERR_IO;
  } catch (const std::exception& e) {
    g_last_error = std::string(function) + ": internal error: " + e.what();
    return LFCE_ERR_INTERNAL;
  } catch (...) {
    g_last_error = std::string(function) + ": internal error of unknown type";
    return LFCE_ERR_INTERNAL;
  }
}

void require_out(const void* ptr, const char* name) {
  if (!ptr) throw lfce::SpecError(std::string(name) + " is NULL");
}

// The disk cache of the session's cache directory.
std::shared_ptr<lfce::runtime::DiskCache> session_cache() {
  lfce::api::Session::get();  // the first use reads the environment and opens its directory
  return lfce::runtime::disk_cache();
}

// The plan the session keeps for a problem on a device (stored tuning, device limits).
lfce::runtime::Plan session_plan(const lfce::runtime::Problem& problem, int device) {
  return lfce::api::Session::get().plan(problem, device);
}

// Workspace sizes do not depend on the arch; any arch gives the same plan geometry.
lfce::runtime::Plan host_plan(const lfce_problem* problem) {
  return lfce::runtime::Plan(lfce::api::problem_from_c(problem), lfce::Arch::SM90A);
}

// The layout of lfce.h's struct `name`, else SpecError.
const lfce::api::StructLayout& known_struct(const char* name) {
  if (const lfce::api::StructLayout* s = lfce::api::struct_layout(name)) return *s;
  throw lfce::SpecError(std::string("no struct named '") + name + "' in lfce.h");
}

}  // namespace

extern "C" {

const char* lfce_version(void) { return LFCE_VERSION; }

int lfce_abi_version(void) { return LFCE_ABI_VERSION; }

int lfce_struct_size(const char* name, size_t* bytes) {
  return guarded("lfce_struct_size", [&] {
    require_out(name, "name");
    require_out(bytes, "bytes");
    *bytes = known_struct(name).size;
  });
}

int lfce_struct_layout(const char* name, lfce_field_callback callback, void* user) {
  return guarded("lfce_struct_layout", [&] {
    require_out(name, "name");
    if (!callback) throw lfce::SpecError("callback is NULL");
    for (const lfce::api::FieldLayout& f : known_struct(name).fields) callback(f.name, f.offset, f.size, user);
  });
}

const char* lfce_last_error(void) { return g_last_error.c_str(); }

int lfce_last_resource_error(const char** resource, int64_t* required, int64_t* limit) {
  // Not guarded(): that would clear what it reports.
  if (!resource || !required || !limit || g_resource.empty()) return LFCE_ERR_INVALID_ARGUMENT;
  *resource = g_resource.c_str();
  *required = g_resource_required;
  *limit = g_resource_limit;
  return LFCE_OK;
}

int lfce_reload_options(void) {
  return guarded("lfce_reload_options", [] { lfce::api::Session::get().reload(); });
}

int lfce_set_log_level(const char* level) {
  return guarded("lfce_set_log_level", [&] {
    require_out(level, "level");
    if (!lfce::runtime::set_log_level(level))
      throw lfce::SpecError(std::string("log level '") + level +
                            "' is not one of trace, debug, info, warn, error, off");
  });
}

int lfce_check_problem(const lfce_problem* problem) {
  return guarded("lfce_check_problem", [&] { lfce::api::problem_from_c(problem); });
}

int lfce_forward_workspace_size(const lfce_problem* problem, size_t* bytes) {
  return guarded("lfce_forward_workspace_size", [&] {
    require_out(bytes, "bytes");
    *bytes = host_plan(problem).forward_layout().bytes;
  });
}

int lfce_backward_workspace_size(const lfce_problem* problem, size_t* bytes) {
  return guarded("lfce_backward_workspace_size", [&] {
    require_out(bytes, "bytes");
    *bytes = host_plan(problem).backward_layout().bytes;
  });
}

int lfce_backward_chunk_size(const lfce_problem* problem, int64_t* chunk) {
  return guarded("lfce_backward_chunk_size", [&] {
    require_out(chunk, "chunk");
    *chunk = host_plan(problem).chunk();
  });
}

int lfce_forward(const lfce_problem* problem, const lfce_forward_args* args) {
  return guarded("lfce_forward", [&] {
    require_out(args, "args");
    lfce::runtime::forward(lfce::api::problem_from_c(problem), lfce::api::forward_args_from_c(*args), session_plan);
  });
}

int lfce_backward(const lfce_problem* problem, const lfce_backward_args* args) {
  return guarded("lfce_backward", [&] {
    require_out(args, "args");
    lfce::runtime::Problem p = lfce::api::problem_from_c(problem);
    // The lse rows' gradients are a different dlogits_backward: part of the problem its plan is for.
    p.lse_grad = args->grad_lse != nullptr;
    lfce::runtime::backward(p, lfce::api::backward_args_from_c(*args), session_plan);
  });
}

int lfce_forward_backward_workspace_size(const lfce_problem* problem, size_t* bytes) {
  return guarded("lfce_forward_backward_workspace_size", [&] {
    require_out(bytes, "bytes");
    *bytes = host_plan(problem).eager_layout().bytes;
  });
}

int lfce_forward_backward(const lfce_problem* problem, const lfce_forward_args* args, void* grad_hidden,
                          void* grad_weight, void* grad_bias) {
  return guarded("lfce_forward_backward", [&] {
    require_out(args, "args");
    const lfce::runtime::ForwardBackwardArgs a{lfce::api::forward_args_from_c(*args), grad_hidden, grad_weight,
                                               grad_bias};
    const lfce::runtime::Problem p = lfce::api::problem_from_c(problem);
    // (The runtime refuses it too, in its own names.)
    if (p.mode != lfce::Mode::Eager)
      throw lfce::SpecError(
          "lfce_forward_backward needs lfce_problem.mode = LFCE_MODE_EAGER (it computes the gradients for an "
          "upstream gradient of 1), got LFCE_MODE_RECOMPUTE");
    lfce::runtime::forward_backward(p, a, session_plan);
  });
}

int lfce_scale_gradient(int32_t dtype, const void* src, void* dst, int64_t count, const float* scale, int32_t device,
                        void* stream) {
  return guarded("lfce_scale_gradient", [&] {
    if (dtype < 0 || dtype > 2)
      throw lfce::SpecError("dtype = " + std::to_string(dtype) + " is not valid; expected LFCE_DTYPE_BF16, _FP16 or _FP32");
    lfce::runtime::scale_gradient(static_cast<lfce::DType>(dtype), src, dst, count, scale, device, stream);
  });
}

int lfce_eager_schedule(const lfce_problem* problem, int32_t* three_gemm, int64_t* token_chunk) {
  return guarded("lfce_eager_schedule", [&] {
    require_out(three_gemm, "three_gemm");
    require_out(token_chunk, "token_chunk");
    const lfce::runtime::Plan plan = host_plan(problem);
    if (plan.problem().mode != lfce::Mode::Eager)
      throw lfce::SpecError("lfce_eager_schedule needs lfce_problem.mode = LFCE_MODE_EAGER, got LFCE_MODE_RECOMPUTE");
    *three_gemm = plan.three_gemm() ? 1 : 0;
    *token_chunk = plan.three_gemm() ? plan.token_chunk() : plan.problem().tokens;
  });
}

int lfce_generate(const lfce_problem* problem, const char* arch, lfce_kernel_callback callback, void* user) {
  return guarded("lfce_generate", [&] {
    require_out(arch, "arch");
    if (!callback) throw lfce::SpecError("callback is NULL");
    lfce::runtime::Plan plan(lfce::api::problem_from_c(problem), lfce::parse_arch(arch));
    for (const lfce::KernelSpec& spec : plan.launched_specs()) {
      lfce::GeneratedKernel kernel = lfce::generate_kernel(spec);
      std::string name(lfce::kind_name(spec.kind)), text = spec.text();
      lfce_kernel_info info{name.c_str(), text.c_str(), kernel.ptx.c_str(), kernel.ptx.size(), kernel.compile_ms,
                            static_cast<uint32_t>(kernel.shape.smem_bytes), static_cast<uint32_t>(kernel.shape.threads)};
      callback(&info, user);
    }
  });
}

const char* lfce_cache_dir(void) {
  thread_local std::string dir;
  try {
    dir = lfce::api::Session::get().cache_dir();
  } catch (const std::exception&) {
    dir.clear();  // a malformed environment: the next guarded call reports it
  }
  return dir.c_str();
}

int lfce_set_cache_dir(const char* dir) {
  return guarded("lfce_set_cache_dir", [&] {
    require_out(dir, "dir");
    if (!*dir) throw lfce::SpecError("dir is empty");
    lfce::api::Session::get().set_cache_dir(dir);
  });
}

int lfce_precompile(const lfce_problem* problem, const char* arch, lfce_precompile_callback callback, void* user) {
  return lfce_precompile_for(problem, arch, nullptr, callback, user);
}

int lfce_precompile_for(const lfce_problem* problem, const char* arch, const lfce_device_limits* device,
                        lfce_precompile_callback callback, void* user) {
  return guarded("lfce_precompile", [&] {
    require_out(arch, "arch");
    const lfce::runtime::Problem p = lfce::api::problem_from_c(problem);
    const lfce::Arch target = lfce::parse_arch(arch);
    lfce::runtime::DeviceLimits limits{};
    if (device) {
      auto bounded = [](int64_t value, int64_t max, const char* name) {
        if (value < 0 || value > max)
          throw lfce::SpecError(std::string(name) + " = " + std::to_string(value) + " is outside [0, " +
                                std::to_string(max) + "] (0: the reference device's)");
        return value;
      };
      limits.sm_count = bounded(device->sm_count, int64_t{1} << 20, "sm_count");
      limits.smem_per_block = bounded(device->smem_per_block, int64_t{1} << 30, "smem_per_block");
    }
    // The winners stored in this session's cache directory (the one --cache-dir names) for these limits.
    auto plan_for = [&](const lfce::runtime::Problem& q) {
      return lfce::runtime::Plan(q, target, lfce::api::Session::get().tuning(q, target, limits), limits);
    };
    const lfce::runtime::Plan plan = plan_for(p);
    std::vector<lfce::KernelSpec> specs = plan.launched_specs();
    // An entropy or logprob output is there to be differentiated (an RL objective): the backward
    // then runs the dlogits_backward that takes the lse rows' gradients (lfce_backward_args.grad_lse).
    if (p.entropy || p.logprob) {
      lfce::runtime::Problem with_gradients = p;
      with_gradients.lse_grad = true;
      specs.push_back(plan_for(with_gradients).spec(lfce::KernelKind::DlogitsBackward));
    }
    for (const lfce::KernelSpec& spec : specs) {
      const lfce::runtime::PrecompileResult r = lfce::runtime::precompile(spec);
      if (!callback) continue;
      std::string name(lfce::kind_name(spec.kind)), text = spec.text();
      lfce_precompiled info{name.c_str(), text.c_str(), r.key.c_str(), r.hit ? 1 : 0, r.compile_ms, r.elapsed_ms,
                            r.ptx_bytes};
      callback(&info, user);
    }
  });
}

int lfce_cache_list(lfce_cache_entry_callback callback, void* user) {
  return guarded("lfce_cache_list", [&] {
    if (!callback) throw lfce::SpecError("callback is NULL");
    for (const lfce::runtime::EntryRecord& r : session_cache()->list()) {
      std::string kind(lfce::runtime::entry_kind_name(r.kind));
      lfce_cache_entry e{r.key.c_str(), kind.c_str(), r.spec.c_str(), r.arch.c_str(),
                         static_cast<int64_t>(r.payload_bytes), r.created_unix, r.registers, r.local_bytes};
      callback(&e, user);
    }
  });
}

int lfce_cache_info(const char* key, lfce_text_callback callback, void* user) {
  return guarded("lfce_cache_info", [&] {
    require_out(key, "key");
    if (!callback) throw lfce::SpecError("callback is NULL");
    callback(session_cache()->info(key).c_str(), user);
  });
}

int lfce_cache_verify(int32_t remove_bad, lfce_text_callback callback, void* user, int64_t* checked, int64_t* bad) {
  return guarded("lfce_cache_verify", [&] {
    const lfce::runtime::VerifyReport report = session_cache()->verify(remove_bad != 0);
    std::vector<std::string> left;
    for (const auto& b : report.bad) {
      if (!b.not_removed.empty()) left.push_back(b.not_removed);
      if (callback)
        callback((b.key + ": " + b.file + ": " + b.problem +
                  (b.removed ? " (removed)" : !b.not_removed.empty() ? " (not removed)" : ""))
                     .c_str(),
                 user);
    }
    if (checked) *checked = static_cast<int64_t>(report.checked);
    if (bad) *bad = static_cast<int64_t>(report.bad.size());
    if (!left.empty()) throw lfce::runtime::CacheError(lfce::runtime::not_removed_message(left));
  });
}

int lfce_cache_clear(double older_than_days, int64_t* removed, int64_t* bytes) {
  return guarded("lfce_cache_clear", [&] {
    std::optional<double> age;  // 0: every entry
    if (older_than_days != 0) age = older_than_days;
    const lfce::runtime::ClearReport report = session_cache()->clear(age);
    if (removed) *removed = static_cast<int64_t>(report.removed);
    if (bytes) *bytes = static_cast<int64_t>(report.bytes);
    if (!report.failures.empty()) throw lfce::runtime::CacheError(lfce::runtime::not_removed_message(report.failures));
  });
}

int lfce_kernel_load_stats(lfce_kernel_load_callback callback, void* user) {
  return guarded("lfce_kernel_load_stats", [&] {
    if (!callback) throw lfce::SpecError("callback is NULL");
    for (const auto& s : lfce::runtime::kernel_load_stats()) {
      lfce_kernel_load l{s.spec.c_str(), s.device, s.source.c_str(), s.llvm_ms, s.jit_ms, s.disk_ms, s.load_ms,
                         s.total_ms, s.registers, s.local_bytes};
      callback(&l, user);
    }
  });
}

int lfce_tune(const lfce_problem* problem, const lfce_tune_options* options, lfce_tune_callback callback, void* user,
              int32_t* stopped_by_budget) {
  return guarded("lfce_tune", [&] {
    require_out(options, "options");
    const lfce::runtime::Problem p = lfce::api::problem_from_c(problem);
    lfce::autotune::TuneOptions o;
    if (options->space) o.space = options->space;
    if (!(options->budget_minutes >= 0 && options->budget_minutes <= 1e9)) {  // also NaN
      std::ostringstream given;  // 1e+308, not its 309 digits
      given << options->budget_minutes;
      throw lfce::SpecError("budget_minutes must be a number of minutes in [0, 1e9] (0: no limit), got " + given.str());
    }
    o.budget_minutes = options->budget_minutes;
    o.verify = options->verify != 0;
    if (options->repetitions < 0)
      throw lfce::SpecError("repetitions must be >= 0, got " + std::to_string(options->repetitions));
    if (options->repetitions > 0) o.repetitions = options->repetitions;
    o.cache_dir = lfce::api::Session::get().cache_dir();
    if (options->progress) {
      o.progress = [options](const lfce::autotune::Progress& g) {
        std::string kind(lfce::kind_name(g.kind));
        options->progress(g.done, g.total, g.eta_seconds, kind.c_str(), g.candidate.c_str(), options->user);
      };
    }
    const lfce::autotune::TuneResult result = lfce::autotune::tune(p, options->device, o);
    lfce::api::Session::get().forget_tunings();  // the next forward reads the new winners
    if (stopped_by_budget) *stopped_by_budget = result.stopped_by_budget ? 1 : 0;
    if (!callback) return;
    for (const auto& k : result.kinds) {
      std::string kind(lfce::kind_name(k.kind)), def = k.default_config.text();
      std::string winner = k.winner ? k.winner->text() : "";
      lfce_tune_result r{kind.c_str(), def.c_str(), k.winner ? winner.c_str() : nullptr, k.default_ms, k.winner_ms,
                         k.speedup.value_or(0.0), k.measured, k.reused, k.failed, k.rejected, k.path.c_str()};
      callback(&r, user);
    }
  });
}

const char* lfce_generator_version(void) { return lfce::runtime::kGeneratorVersion; }

int lfce_plan_is_tuned(const lfce_problem* problem, int32_t device, int32_t* tuned) {
  return guarded("lfce_plan_is_tuned", [&] {
    require_out(tuned, "tuned");
    const lfce::runtime::Problem p = lfce::api::problem_from_c(problem);
    const lfce::runtime::DeviceInfo& info = lfce::runtime::device_info(device);
    const lfce::runtime::DeviceLimits limits{info.max_smem_optin, info.sm_count};
    // The session's tuning, as the next forward and backward run with (the environment's
    // LFCE_EXPERIMENTAL switches are not a tuning).
    lfce::runtime::Tuning tuning = lfce::api::Session::get().tuning(p, info.arch(), limits);
    tuning.eager_operand = lfce::runtime::Tuning{}.eager_operand;
    tuning.eager_fixup = lfce::runtime::Tuning{}.eager_fixup;
    *tuned = tuning == lfce::runtime::Tuning{} ? 0 : 1;
  });
}

const char* lfce_preset_names(void) {
  static const std::string names = [] {
    std::string out;
    for (const auto& p : lfce::runtime::model_presets()) out += (out.empty() ? "" : ",") + std::string(p.name);
    return out;
  }();
  return names.c_str();
}

int lfce_preset(const char* name, int64_t* hidden, int64_t* vocab) {
  return guarded("lfce_preset", [&] {
    require_out(name, "name");
    require_out(hidden, "hidden");
    require_out(vocab, "vocab");
    const auto& preset = lfce::runtime::model_preset(name);
    *hidden = preset.hidden;
    *vocab = preset.vocab;
  });
}

int64_t lfce_compile_count(void) { return lfce::emitted_module_count(); }

}  // extern "C"
