// Every launch the C API makes, against the traces recorded in tests/golden/launch_trace_<device>.txt:
// the stand-in driver (tests/api/fake_libcuda.c, LFCE_FAKE_CUDA_TRACE) records each launch's
// kernel, grid, block, cluster, dynamic shared memory and argument values, and each memset; this
// test names every argument as its template declares it (the kernel's IR; the PTX has only
// <entry>_param_<i>) and every address as the buffer it points into. Cases: forward + backward
// and eager mode's forward_backward for each option of golden_cases.h, gradient subsets,
// gradient accumulators, several vocabulary and token chunks, eager mode's schedule options
// and lfce_scale_gradient, on an sm_90a-class, an sm_80-class and a 99 KiB sm_86-class device.
// Each device runs in a child process (lfce reads a device's properties once per process).
// LFCE_GOLDEN_UPDATE=1 re-records the traces.
#include <gtest/gtest.h>
#include <llvm/IR/Function.h>
#include <llvm/IR/LLVMContext.h>
#include <llvm/IR/Module.h>
#include <sys/wait.h>
#include <unistd.h>

#include <cinttypes>
#include <cstdio>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <map>
#include <regex>
#include <sstream>
#include <string>
#include <vector>

#include "autotune/tuning_store.h"
#include "api/problem_from_c.h"
#include "compiler/kernel_spec.h"
#include "compiler/nvptx_backend.h"
#include "lfce/lfce.h"
#include "runtime/kernel_cache.h"
#include "runtime/plan.h"
#include "runtime/sha256.h"
#include "templates/templates.h"
#include "tests/golden/golden_cases.h"
#include "tests/golden/golden_file.h"

namespace lfce::golden {
namespace {

namespace fs = std::filesystem;

const char* const kHeader =
    "Every launch (and memset) the C API makes for each case of tests/golden/launch_trace_test.cpp\n"
    "on the stand-in driver pretending to be the device named in the file name:\n"
    "  == <case>                                   then for each C API call\n"
    "  call <function> [workspace=<bytes>] -> <status> [<message>]   after the launches it made\n"
    "  launch <kernel> ptx=<sha256 prefix> grid=x,y,z block=x,y,z cluster=x,y,z smem=<bytes>\n"
    "    <parameter name as the template declares it> = <value>\n"
    "Addresses read <buffer>+<byte offset>; a tensor map reads as its cuTensorMapEncodeTiled call.\n"
    "Regenerate (then review the diff): LFCE_GOLDEN_UPDATE=1 ctest --test-dir build -R '^(PtxGolden|LaunchTrace)\\.'";

// ---- The device's buffers: fixed addresses, 2^40 bytes apart, named in the trace --------------

enum Buffer {
  kHidden, kWeight, kBias, kTargets, kClassWeight, kLse, kTokenLoss, kLoss, kValidCount, kPredicted,
  kWorkspace, kGradHidden, kGradWeight, kGradBias, kGradLoss, kGradLse, kScale, kBufferCount
};
const char* const kBufferNames[kBufferCount] = {
    "hidden", "weight", "bias", "targets", "class_weight", "lse", "token_loss", "loss", "valid_count", "predicted",
    "workspace", "grad_hidden", "grad_weight", "grad_bias", "grad_loss", "grad_lse", "scale"};
constexpr int kBufferShift = 40;

template <typename T = void>
T* at(Buffer b) {
  return reinterpret_cast<T*>((static_cast<uint64_t>(b) + 1) << kBufferShift);
}

// "hidden", "workspace+4096", or the address itself if it is no buffer's.
std::string address_text(uint64_t value) {
  const uint64_t index = (value >> kBufferShift) - 1;
  if (value >> kBufferShift == 0 || index >= kBufferCount) return "0x" + [&] {
    char hex[32];
    std::snprintf(hex, sizeof hex, "%" PRIx64, value);
    return std::string(hex);
  }();
  const uint64_t offset = value & ((uint64_t{1} << kBufferShift) - 1);
  return std::string(kBufferNames[index]) + (offset ? "+" + std::to_string(offset) : "");
}

std::string name_addresses(const std::string& line) {
  static const std::regex hex("0x[0-9a-f]{1,16}\\b");  // (longer: bytes of an array, left as they are)
  std::string out;
  size_t last = 0;
  for (auto it = std::sregex_iterator(line.begin(), line.end(), hex); it != std::sregex_iterator(); ++it) {
    out += line.substr(last, it->position() - last);
    out += address_text(std::stoull(it->str(), nullptr, 16));
    last = it->position() + it->length();
  }
  return out + line.substr(last);
}

// ---- Kernels: the fake's PTX hash -> the names of the parameters and the PTX's sha256 ----------

struct KernelNames {
  std::string ptx_sha;  // first 16 hex digits of the PTX's sha256 (as in ptx_hashes.txt)
  std::vector<std::string> params;
};

uint64_t fnv1a(const std::string& text) {  // as fake_cuda_trace.c hashes the PTX it is given
  uint64_t h = 1469598103934665603ull;
  for (unsigned char c : text) {
    if (!c) break;
    h = (h ^ c) * 1099511628211ull;
  }
  return h;
}

class KernelTable {
 public:
  // Learns the kernels loaded since the last call.
  void refresh() {
    const auto loads = runtime::kernel_load_stats();
    for (; seen_ < loads.size(); ++seen_) {
      const KernelSpec spec = KernelSpec::parse(loads[seen_].spec);
      const std::string ptx = runtime::ptx_for(spec);
      char key[32];
      std::snprintf(key, sizeof key, "%016" PRIx64, fnv1a(ptx));
      KernelNames names;
      names.ptx_sha = runtime::sha256_hex(ptx).substr(0, 16);
      llvm::LLVMContext ctx;
      auto module = new_module(ctx, spec.text(), spec.arch);
      const KernelShape shape = build_kernel(*module, spec);
      for (const llvm::Argument& arg : module->getFunction(shape.entry)->args())
        names.params.push_back(arg.getName().str());
      kernels_[key] = std::move(names);
    }
  }
  const KernelNames* find(const std::string& fnv) const {
    auto it = kernels_.find(fnv);
    return it == kernels_.end() ? nullptr : &it->second;
  }

 private:
  size_t seen_ = 0;
  std::map<std::string, KernelNames> kernels_;
};

// The fake's raw trace lines, with the kernels' parameter names and the buffers' names.
std::vector<std::string> translate(const std::vector<std::string>& raw, const KernelTable& kernels) {
  static const std::regex launch(R"(launch (\S+) ptx=(\S+) (.*))");
  static const std::regex param(R"(  (\d+) (\S+) (.*))");
  std::vector<std::string> out;
  const KernelNames* current = nullptr;
  std::smatch m;
  for (const std::string& line : raw) {
    if (std::regex_match(line, m, launch)) {
      current = kernels.find(m[2]);
      out.push_back("launch " + m[1].str() + " ptx=" + (current ? current->ptx_sha : "unknown:" + m[2].str()) + " " +
                    m[3].str());
    } else if (std::regex_match(line, m, param)) {
      const size_t i = std::stoul(m[1]);
      const std::string name = current && i < current->params.size() ? current->params[i] : "param_" + m[1].str();
      out.push_back("  " + name + " = " + name_addresses(m[3]));
    } else {
      out.push_back(name_addresses(line));
    }
  }
  return out;
}

// ---- Cases -------------------------------------------------------------------------------------

enum Grad { kGradHiddenOnly = 1, kGradWeightOnly = 2, kGradBiasOnly = 4, kAllGrads = 7 };
enum class Call { ForwardThenBackward, ForwardBackward, ScaleGradient };

struct TraceCase {
  std::string name;
  lfce_problem problem;
  Call call = Call::ForwardThenBackward;
  bool lse_grad = false;
  int grads = kAllGrads;
  std::vector<std::pair<std::string, std::string>> env;  // set around the case (lfce_reload_options)
  // Tiles stored as tuning winners for this problem before the case runs (a problem of its own:
  // the Session reads a problem's tuning once).
  std::vector<std::pair<KernelKind, const char*>> tuned = {};
};

// N = 1000 tokens (a multiple of kSequenceLength), H = 2048, V = 5000: one vocabulary chunk of the
// backward and one token chunk of eager mode unless chunk_size says otherwise.
lfce_problem shape(lfce_dtype dtype, lfce_mode mode, int64_t hidden = 2048) {
  return problem(1000, hidden, 5000, dtype, mode);
}

std::vector<TraceCase> cases(bool all, bool sm90a) {
  std::vector<TraceCase> out;
  auto add = [&](std::string name, lfce_problem p, Call call, const Option* option = nullptr) -> TraceCase& {
    bool lse_grad = false;
    if (option) {
      option->apply(p);
      lse_grad = option->lse_grad;
    }
    out.push_back({std::move(name), p, call, lse_grad, kAllGrads, {}});
    return out.back();
  };
  const Call recompute = Call::ForwardThenBackward, eager = Call::ForwardBackward;
  const lfce_mode R = LFCE_MODE_RECOMPUTE, E = LFCE_MODE_EAGER;
  const lfce_dtype bf16 = LFCE_DTYPE_BF16;
  for (lfce_dtype dtype : {LFCE_DTYPE_BF16, LFCE_DTYPE_FP16, LFCE_DTYPE_FP32}) {
    add(std::string("recompute/") + dtype_label(dtype), shape(dtype, R), recompute);
    add(std::string("eager/") + dtype_label(dtype), shape(dtype, E), eager);
  }
  lfce_problem vocab_chunks = shape(bf16, R);
  vocab_chunks.chunk_size = 1024;  // 5 chunks
  lfce_problem token_chunks = shape(bf16, E);
  token_chunks.chunk_size = 256;  // 4 token chunks
  add("recompute/vocab_chunks_bias", vocab_chunks, recompute, &kOptions[1]);
  add("eager/token_chunks_bias", token_chunks, eager, &kOptions[1]);
  add("recompute/entropy_logprob_grad", shape(bf16, R), recompute, &kOptions[12]);
  if (!all) return out;

  for (const Option& o : kOptions) {
    add(std::string("recompute/bf16/") + o.name, shape(bf16, R), recompute, &o);
    add(std::string("eager/bf16/") + o.name, shape(bf16, E), eager, &o);
  }
  for (const Option& o : kCombinations) {
    add(std::string("recompute/bf16/") + o.name, shape(bf16, R), recompute, &o);
    add(std::string("eager/bf16/") + o.name, shape(bf16, E), eager, &o);
  }
  lfce_problem fp32_vocab_chunks = vocab_chunks;
  fp32_vocab_chunks.dtype = LFCE_DTYPE_FP32;
  add("recompute/vocab_chunks_fp32", fp32_vocab_chunks, recompute);
  add("recompute/vocab_chunks_accumulate_grads", vocab_chunks, recompute, &kOptions[13]);
  add("recompute/vocab_chunks_grad_weight_only", vocab_chunks, recompute).grads = kGradWeightOnly;
  add("recompute/vocab_chunks_grad_hidden_only", vocab_chunks, recompute).grads = kGradHiddenOnly;
  add("recompute/vocab_chunks_grad_bias_only", vocab_chunks, recompute, &kOptions[1]).grads = kGradBiasOnly;
  add("recompute/no_gradients", shape(bf16, R), recompute).grads = 0;
  add("recompute/hidden_1004", shape(bf16, R, 1004), recompute);  // rows of 2008 bytes: no TMA

  lfce_problem fp32_token_chunks = token_chunks;
  fp32_token_chunks.dtype = LFCE_DTYPE_FP32;
  add("eager/token_chunks_fp32", fp32_token_chunks, eager, &kOptions[1]);
  add("eager/token_chunks_shift", token_chunks, eager, &kOptions[8]);
  add("eager/token_chunks_grad_weight_only", token_chunks, eager).grads = kGradWeightOnly;
  add("eager/grad_hidden_only", shape(bf16, E), eager).grads = kGradHiddenOnly;
  add("eager/no_gradients", shape(bf16, E), eager).grads = 0;
  add("eager/hidden_1024", shape(bf16, E, 1024), eager);
  add("eager/hidden_1004", shape(bf16, E, 1004), eager);
  add("eager/eager_operand", shape(bf16, E), eager).env = {{"LFCE_EXPERIMENTAL", "eager_operand"}};
  add("eager/eager_operand_token_chunks", token_chunks, eager).env = {{"LFCE_EXPERIMENTAL", "eager_operand"}};
  add("eager/eager_fixup_off", shape(bf16, E), eager).env = {{"LFCE_EXPERIMENTAL", "eager_dz_kernel"}};
  add("eager/eager_fixup_off_grad_hidden_only", shape(bf16, E), eager).env = {{"LFCE_EXPERIMENTAL", "eager_dz_kernel"}};
  add("eager/fp16_token_chunks", [&] {
    lfce_problem p = token_chunks;
    p.dtype = LFCE_DTYPE_FP16;
    return p;
  }(), eager);
  for (lfce_dtype dtype : {LFCE_DTYPE_BF16, LFCE_DTYPE_FP32})
    add(std::string("scale_gradient/") + dtype_label(dtype), shape(dtype, E), Call::ScaleGradient);

  // Tuned tiles (V = 6000: problems no other case runs), from the tuner's spaces, stored as the
  // tuner stores its winners.
  lfce_problem tuned = problem(1000, 2048, 6000, bf16, R);
  lfce_problem tuned_eager = problem(1000, 2048, 6000, bf16, E);
  if (sm90a) {
    add("recompute/tuned_clusters_split", tuned, recompute).tuned = {{KernelKind::LseForward, "128x128x64/wg2/s3"},
                                                                     {KernelKind::DlogitsBackward, "128x128x64/wg2/s4/c2"},
                                                                     {KernelKind::GradWeight, "128x192x64/wg2/s4/c2n"},
                                                                     {KernelKind::GradInput, "128x256x64/wg2/s3/sn"}};
    add("eager/tuned_one_consumer", tuned_eager, eager).tuned = {{KernelKind::DlogitsBackward, "64x128x64/wg1/s4"},
                                                                  {KernelKind::GradWeight, "128x128x64/wg2/s4"},
                                                                  {KernelKind::GradInput, "128x256x64/wg2/s3"}};
  } else {
    add("recompute/tuned_tiles", tuned, recompute).tuned = {{KernelKind::LseForward, "64x128x64/2x2/s3"},
                                                           {KernelKind::DlogitsBackward, "64x64x64/2x2/s3"},
                                                           {KernelKind::GradWeight, "128x128x64/2x4/s3"},
                                                           {KernelKind::GradInput, "64x128x64/2x2/s3"}};
    add("eager/tuned_tiles", tuned_eager, eager).tuned = {{KernelKind::DlogitsBackward, "64x64x64/2x2/s3"},
                                                         {KernelKind::GradWeight, "128x128x64/2x4/s3"}};
  }
  return out;
}

std::string status_text(int status) {
  return status == LFCE_OK ? "0" : std::to_string(status) + " " + lfce_last_error();
}

// The fake device's limits, as the tuning files key them.
struct DeviceLimitsText {
  bool sm90a;
  int64_t smem, sm_count;
};

// Runs `c` through the C API, its calls' lines appended to `calls` after each call's launches.
class Runner {
 public:
  explicit Runner(std::string raw_path) : raw_path_(std::move(raw_path)) {}

  std::vector<std::string> run(const TraceCase& c, const DeviceLimitsText& device) {
    fs::remove(raw_path_);
    lines_.clear();
    if (!c.tuned.empty()) store_tuning(c, device);
    for (const auto& [name, value] : c.env) setenv(name.c_str(), value.c_str(), 1);
    if (!c.env.empty()) note("call lfce_reload_options", lfce_reload_options());
    const lfce_problem& p = c.problem;
    void* gh = c.grads & kGradHiddenOnly ? at(kGradHidden) : nullptr;
    void* gw = c.grads & kGradWeightOnly ? at(kGradWeight) : nullptr;
    void* gb = c.grads & kGradBiasOnly ? at(kGradBias) : nullptr;
    if (c.call == Call::ScaleGradient) {
      note("call lfce_scale_gradient",
           lfce_scale_gradient(p.dtype, at(kGradWeight), at(kGradWeight), p.vocab * p.hidden, at<float>(kScale), 0,
                               nullptr));
    } else if (c.call == Call::ForwardBackward) {
      size_t bytes = 0;
      const int s = lfce_forward_backward_workspace_size(&p, &bytes);
      lfce_forward_args f = forward_args(p, bytes);
      note("call lfce_forward_backward workspace=" + std::to_string(bytes),
           s ? s : lfce_forward_backward(&p, &f, gh, gw, gb));
    } else {
      size_t bytes = 0;
      int s = lfce_forward_workspace_size(&p, &bytes);
      lfce_forward_args f = forward_args(p, bytes);
      note("call lfce_forward workspace=" + std::to_string(bytes), s ? s : lfce_forward(&p, &f));
      s = lfce_backward_workspace_size(&p, &bytes);
      lfce_backward_args b{};
      b.hidden = f.hidden;
      b.weight = f.weight;
      b.bias = f.bias;
      b.targets = f.targets;
      b.class_weight = f.class_weight;
      b.lse = f.lse;
      b.valid_count = f.valid_count;
      b.grad_loss = at<const float>(kGradLoss);
      b.grad_lse = c.lse_grad ? at<const float>(kGradLse) : nullptr;
      b.grad_hidden = gh;
      b.grad_weight = gw;
      b.grad_bias = gb;
      b.workspace = at(kWorkspace);
      b.workspace_bytes = bytes;
      note("call lfce_backward workspace=" + std::to_string(bytes), s ? s : lfce_backward(&p, &b));
    }
    for (const auto& [name, value] : c.env) unsetenv(name.c_str());
    if (!c.env.empty()) note("call lfce_reload_options", lfce_reload_options());
    take_raw();
    return std::move(lines_);
  }

  // The raw lines of the whole case (launches, then the call lines in place), translated.
  std::vector<std::string> translate_case(const std::vector<std::string>& raw, KernelTable& kernels) {
    kernels.refresh();
    return translate(raw, kernels);
  }

 private:
  static lfce_forward_args forward_args(const lfce_problem& p, size_t workspace_bytes) {
    lfce_forward_args f{};
    f.hidden = at(kHidden);
    f.weight = at(kWeight);
    f.bias = p.has_bias ? at(kBias) : nullptr;
    f.targets = at(kTargets);
    f.class_weight = p.has_class_weight ? at<const float>(kClassWeight) : nullptr;
    f.lse = at<float>(kLse);
    f.token_loss = at<float>(kTokenLoss);
    f.loss = at<float>(kLoss);
    f.valid_count = at<float>(kValidCount);
    f.predicted = p.outputs & LFCE_OUTPUT_PREDICTED ? at<int64_t>(kPredicted) : nullptr;
    f.workspace = at(kWorkspace);
    f.workspace_bytes = workspace_bytes;
    return f;
  }
  // The launches the call made (the fake's lines so far), then the call's own line.
  void note(const std::string& call, int status) {
    take_raw();
    lines_.push_back(call + " -> " + status_text(status));
  }
  void take_raw() {
    std::ifstream in(raw_path_);
    for (std::string line; std::getline(in, line);) lines_.push_back(line);
    in.close();
    fs::remove(raw_path_);
  }

  // The tiles of c.tuned as the tuner would have stored them, for this device's limits.
  static void store_tuning(const TraceCase& c, const DeviceLimitsText& device) {
    const runtime::Problem problem = api::problem_from_c(&c.problem);
    const Arch arch = device.sm90a ? Arch::SM90A : Arch::SM80;
    const runtime::DeviceLimits limits{device.smem, device.sm_count};
    const autotune::TuningStore store(lfce_cache_dir());
    for (const auto& [kind, tile] : c.tuned) {
      runtime::TuningEntry entry;
      entry.key = runtime::TuningKey::of(kind, problem, arch, limits);
      entry.tokens = problem.tokens;
      entry.device = "lfce fake GPU";
      entry.default_config.kind = kind;
      entry.default_config.tile = runtime::Plan(problem, arch, {}, limits).tile(kind);
      runtime::Record winner;
      winner.candidate.kind = kind;
      winner.candidate.tile = TileConfig::parse(tile);
      // lse_forward's winner carries a CTA target, dlogits_backward's a vocabulary chunk (3 of them).
      if (kind == KernelKind::LseForward) winner.candidate.forward_ctas = entry.default_config.forward_ctas = 264;
      if (kind == KernelKind::DlogitsBackward) winner.candidate.chunk = entry.default_config.chunk = 2048;
      winner.result.ms = 1.0;
      entry.records.push_back(winner);
      store.save(entry);
    }
  }

  std::string raw_path_;
  std::vector<std::string> lines_;
};

// ---- Devices -----------------------------------------------------------------------------------

struct Device {
  const char* name;
  const char* cc;        // LFCE_FAKE_CUDA_CC
  const char* smem;      // LFCE_FAKE_CUDA_SMEM
  const char* sm_count;  // LFCE_FAKE_CUDA_SM_COUNT
  bool all_cases;
};
constexpr Device kH100{"sm_90a", "90", "232448", "132", true};     // H100 / H200: 227 KiB
constexpr Device kA100{"sm_80", "80", "166912", "108", true};      // A100: 163 KiB
constexpr Device kSmall{"sm_86_99k", "86", "101376", "84", false};  // RTX 30 / A10 class: 99 KiB

std::string golden_path(const Device& d) { return std::string(LFCE_GOLDEN_DIR) + "/launch_trace_" + d.name + ".txt"; }

// In a child process: every case on the fake device `d`, the trace written to `out_path`.
[[noreturn]] void trace_device(const Device& d, const fs::path& dir, const fs::path& out_path) {
  setenv("LFCE_LIBCUDA", LFCE_FAKE_LIBCUDA, 1);
  setenv("LFCE_FAKE_CUDA_CC", d.cc, 1);
  setenv("LFCE_FAKE_CUDA_SMEM", d.smem, 1);
  setenv("LFCE_FAKE_CUDA_SM_COUNT", d.sm_count, 1);
  setenv("LFCE_CACHE_DIR", (dir / "cache").c_str(), 1);
  const std::string raw = (dir / "raw.txt").string();
  setenv("LFCE_FAKE_CUDA_TRACE", raw.c_str(), 1);
  for (const char* name : {"LFCE_EXPERIMENTAL", "LFCE_EAGER_OPERAND", "LFCE_EAGER_FIXUP", "LFCE_DEVICE_SMEM_LIMIT",
                           "LFCE_DEVICE_SM_COUNT",
                           "LFCE_DEVICE_ARCH"})
    unsetenv(name);
  Runner runner(raw);
  KernelTable kernels;
  std::ofstream out(out_path);
  const DeviceLimitsText limits{std::string(d.cc) == "90", std::stoll(d.smem), std::stoll(d.sm_count)};
  for (const TraceCase& c : cases(d.all_cases, limits.sm90a)) {
    out << "== " << c.name << '\n';
    try {
      for (const std::string& line : runner.translate_case(runner.run(c, limits), kernels)) out << line << '\n';
    } catch (const std::exception& e) {
      out << "tracing failed: " << e.what() << '\n';
    }
    out.flush();  // (what was traced survives a crash in a later case)
  }
  out.close();
  std::_Exit(out ? 0 : 1);
}

// The trace of device `d`, from a child process; "" and a failure if the child failed.
std::vector<std::string> device_trace(const Device& d) {
  const fs::path dir = fs::temp_directory_path() / ("lfce_launch_trace_" + std::to_string(getpid()) + "_" + d.name);
  fs::remove_all(dir);
  fs::create_directories(dir);
  const fs::path out = dir / "trace.txt";
  std::fflush(nullptr);
  const pid_t child = fork();
  if (child == 0) trace_device(d, dir, out);
  int status = 0;
  waitpid(child, &status, 0);
  EXPECT_TRUE(WIFEXITED(status) && WEXITSTATUS(status) == 0) << "tracing " << d.name << " failed: wait status "
                                                             << status;
  std::vector<std::string> lines = read_records(out.string());
  fs::remove_all(dir);
  return lines;
}

using Sections = std::vector<std::pair<std::string, std::vector<std::string>>>;

Sections sections(const std::vector<std::string>& lines) {
  Sections out;
  for (const std::string& line : lines) {
    if (line.rfind("== ", 0) == 0)
      out.push_back({line.substr(3), {}});
    else if (!out.empty())
      out.back().second.push_back(line);
  }
  return out;
}

// Each case whose trace differs, with its first differing line; empty if none.
std::vector<std::string> differences(const std::vector<std::string>& golden, const std::vector<std::string>& now) {
  std::vector<std::string> out;
  std::map<std::string, std::vector<std::string>> recorded;
  for (auto& [name, lines] : sections(golden)) recorded[name] = lines;
  std::map<std::string, bool> seen;
  for (const auto& [name, lines] : sections(now)) {
    seen[name] = true;
    auto it = recorded.find(name);
    if (it == recorded.end()) {
      out.push_back("case " + name + ": not in the record");
      continue;
    }
    const std::vector<std::string>& g = it->second;
    for (size_t i = 0; i < std::max(g.size(), lines.size()); ++i) {
      const std::string expected = i < g.size() ? g[i] : "(end of the case)";
      const std::string actual = i < lines.size() ? lines[i] : "(end of the case)";
      if (expected == actual) continue;
      // The launch the line belongs to, for context.
      std::string launch;
      for (size_t j = std::min(i, lines.size()); j-- > 0;)
        if (lines[j].rfind("launch ", 0) == 0 || lines[j].rfind("call ", 0) == 0) {
          launch = lines[j];
          break;
        }
      out.push_back("case " + name + ", line " + std::to_string(i + 1) + (launch.empty() ? "" : " (after: " + launch + ")") +
                    "\n  recorded: " + expected + "\n  now:      " + actual);
      break;
    }
  }
  for (const auto& [name, lines] : recorded)
    if (!seen.count(name)) out.push_back("case " + name + ": recorded but no longer run");
  return out;
}

void check_device(const Device& d) {
  const std::vector<std::string> now = device_trace(d);
  ASSERT_FALSE(now.empty()) << "no trace for " << d.name;
  const std::string path = golden_path(d);
  if (update_requested()) {
    ASSERT_TRUE(write_records(path, std::string(kHeader) + "\nDevice: " + d.name + " (compute capability " + d.cc +
                                        ", " + d.smem + " bytes of shared memory per block, " + d.sm_count + " SMs)",
                              now))
        << "cannot write " << path;
    std::printf("re-recorded %s\n", path.c_str());
    return;
  }
  const std::vector<std::string> golden = read_records(path);
  ASSERT_FALSE(golden.empty()) << path << " holds no records: record it with LFCE_GOLDEN_UPDATE=1";
  const std::vector<std::string> diff = differences(golden, now);
  for (size_t i = 0; i < diff.size() && i < 10; ++i) ADD_FAILURE() << diff[i];
  EXPECT_TRUE(diff.empty()) << diff.size() << " cases launch differently on " << d.name << " than " << path
                            << " records (re-record an intended change with LFCE_GOLDEN_UPDATE=1)";
}

TEST(LaunchTrace, Sm90aLaunchesMatchTheRecordedTrace) { check_device(kH100); }
TEST(LaunchTrace, Sm80LaunchesMatchTheRecordedTrace) { check_device(kA100); }
TEST(LaunchTrace, Sm86With99KibLaunchesMatchTheRecordedTrace) { check_device(kSmall); }

}  // namespace
}  // namespace lfce::golden
