// The C API of liblfce.so: every entry point converts exceptions into a status and a
// per-thread message, so no C++ exception ever crosses into the caller.
#include <exception>
#include <string>

#include "compiler/errors.h"
#include "compiler/nvptx_backend.h"
#include "lfce/lfce.h"
#include "runtime/driver.h"
#include "runtime/launch.h"
#include "runtime/logging.h"
#include "runtime/module.h"
#include "runtime/plan.h"
#include "runtime/presets.h"
#include "templates/templates.h"

namespace {

thread_local std::string g_last_error;

template <typename F>
int guarded(const char* function, F&& body) {
  lfce::runtime::init_logging();
  g_last_error.clear();
  try {
    body();
    return LFCE_OK;
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

// Workspace sizes do not depend on the arch; any arch gives the same plan geometry.
lfce::runtime::Plan host_plan(const lfce_problem* problem) {
  return lfce::runtime::Plan(lfce::runtime::problem_from_c(problem), lfce::Arch::SM90A);
}

}  // namespace

extern "C" {

const char* lfce_version(void) { return LFCE_VERSION; }

const char* lfce_last_error(void) { return g_last_error.c_str(); }

int lfce_set_log_level(const char* level) {
  return guarded("lfce_set_log_level", [&] {
    require_out(level, "level");
    if (!lfce::runtime::set_log_level(level))
      throw lfce::SpecError(std::string("log level '") + level +
                            "' is not one of trace, debug, info, warn, error, off");
  });
}

int lfce_check_problem(const lfce_problem* problem) {
  return guarded("lfce_check_problem", [&] { lfce::runtime::problem_from_c(problem); });
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
    lfce::runtime::forward(lfce::runtime::problem_from_c(problem), *args);
  });
}

int lfce_backward(const lfce_problem* problem, const lfce_backward_args* args) {
  return guarded("lfce_backward", [&] {
    require_out(args, "args");
    lfce::runtime::backward(lfce::runtime::problem_from_c(problem), *args);
  });
}

int lfce_generate(const lfce_problem* problem, const char* arch, lfce_kernel_callback callback, void* user) {
  return guarded("lfce_generate", [&] {
    require_out(arch, "arch");
    require_out(reinterpret_cast<const void*>(callback), "callback");
    lfce::runtime::Plan plan(lfce::runtime::problem_from_c(problem), lfce::parse_arch(arch));
    std::vector<lfce::KernelKind> kinds = {lfce::KernelKind::LseForward, lfce::KernelKind::LseCombine,
                                           lfce::KernelKind::LossReduce, lfce::KernelKind::DlogitsBackward,
                                           lfce::KernelKind::GradWeight, lfce::KernelKind::GradInput};
    if (plan.problem().bias) kinds.push_back(lfce::KernelKind::GradBias);
    for (lfce::KernelKind kind : kinds) {
      lfce::KernelSpec spec = plan.spec(kind);
      lfce::GeneratedKernel kernel = lfce::generate_kernel(spec);
      std::string name(lfce::kind_name(kind)), text = spec.text();
      lfce_kernel_info info{name.c_str(), text.c_str(), kernel.ptx.c_str(), kernel.ptx.size(), kernel.compile_ms,
                            static_cast<uint32_t>(kernel.shape.smem_bytes), static_cast<uint32_t>(kernel.shape.threads)};
      callback(&info, user);
    }
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
