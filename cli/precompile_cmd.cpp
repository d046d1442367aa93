// lfce precompile --model M [--model ...] [--arch sm_90a,sm_80] [--sm-count S --smem-per-block B]:
// fills the kernel cache with the PTX of every kernel the presets need, with no GPU (e.g. in a
// container build). The driver turns the PTX into a cubin on first use on the GPU and caches that
// too. Default tiles depend on the GPU's SM count and shared memory: for a GPU other than the
// arch's reference (an H200-class one for sm_90a), give its values.
#include <cstdio>

#include "cli/commands.h"
#include "cli/problem_options.h"

namespace lfce::cli {
namespace {

struct PrecompileOptions {
  std::vector<std::string> models;
  std::string archs = "sm_90a,sm_80";
  std::string cache_dir;
  lfce_device_limits limits{};  // 0: the reference device's
  ProblemOptions problem;
};

struct Row {
  std::string model, arch;
  int kernels = 0, hits = 0;
};

void print_kernel(const lfce_precompiled* k, void* user) {
  auto* row = static_cast<Row*>(user);
  row->kernels += 1;
  row->hits += k->cache_hit;
  std::printf("%-12s %-7s %-17s %-5s %8.1f %8.1f  %.12s\n", row->model.c_str(), row->arch.c_str(), k->name,
              k->cache_hit ? "hit" : "miss", k->compile_ms, k->ptx_size / 1024.0, k->key);
}

}  // namespace

void add_precompile_command(CLI::App& app) {
  auto opts = std::make_shared<PrecompileOptions>();
  CLI::App* cmd = app.add_subcommand("precompile", "fill the kernel cache for model presets (no GPU needed)");
  cmd->add_option("--model,-m", opts->models, std::string("model preset(s): ") + lfce_preset_names())
      ->required();
  cmd->add_option("--arch", opts->archs, "comma-separated targets")->check(comma_list())->capture_default_str();
  cmd->add_option("--cache-dir", opts->cache_dir, "cache directory (default: $LFCE_CACHE_DIR or ~/.cache/lfce)")
      ->check(non_empty());
  cmd->add_option("--sm-count", opts->limits.sm_count, "SMs of the GPU the kernels are for (default: the arch's reference)")
      ->check(CLI::Range(1, 1 << 20));
  cmd->add_option("--smem-per-block", opts->limits.smem_per_block,
                  "opt-in shared memory per block of that GPU, in bytes (default: the arch's reference)")
      ->check(CLI::Range(1, 1 << 30));
  opts->problem.add_to(*cmd);
  cmd->callback([opts] {
    if (!opts->cache_dir.empty()) check(lfce_set_cache_dir(opts->cache_dir.c_str()), "--cache-dir");
    std::printf("cache: %s\n", lfce_cache_dir());
    std::printf("%-12s %-7s %-17s %-5s %8s %8s  %s\n", "model", "arch", "kernel", "cache", "LLVM ms", "PTX KB", "key");
    int kernels = 0, hits = 0;
    for (const std::string& model : opts->models) {
      int64_t hidden = 0, vocab = 0;
      check(lfce_preset(model.c_str(), &hidden, &vocab), "--model");
      for (const std::string& arch : split_list(opts->archs)) {
        Row row{model, arch};
        lfce_problem p = opts->problem.problem(vocab, hidden);
        check(lfce_precompile_for(&p, arch.c_str(), &opts->limits, print_kernel, &row), "--arch");
        kernels += row.kernels;
        hits += row.hits;
      }
    }
    std::printf("%d kernels: %d already cached, %d compiled\n", kernels, hits, kernels - hits);
  });
}

}  // namespace lfce::cli
