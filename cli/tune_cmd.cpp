// lfce tune --model M --tokens N [--budget-minutes X] [--space small] [--verify]: autotuning
// sweep on the GPU with a progress bar and an ETA. Resumable: configs already measured (kept
// in the cache directory) are not measured again. Ends with a table of winners.
#include <cmath>
#include <cstdio>
#include <unistd.h>

#include "cli/commands.h"
#include "cli/problem_options.h"

namespace lfce::cli {
namespace {

struct TuneOptions {
  std::string model;
  int64_t vocab = 0, hidden = 0;
  int device = 0;
  std::string space = "default";
  double budget_minutes = 0;
  bool verify = false;
  int repetitions = 0;
  std::string cache_dir;
  ProblemOptions problem;
};

std::string clock_text(double seconds) {
  if (!std::isfinite(seconds) || seconds < 0) return "--:--";
  int s = static_cast<int>(seconds + 0.5);
  char buf[32];
  std::snprintf(buf, sizeof buf, "%d:%02d", s / 60, s % 60);
  return buf;
}

void draw_progress(int64_t done, int64_t total, double eta, const char* kernel, const char* candidate, void*) {
  constexpr int kWidth = 30;
  int filled = total > 0 ? static_cast<int>(kWidth * done / total) : 0;
  std::string bar(filled, '#');
  bar.resize(kWidth, '.');
  // A live bar on a terminal; one line per config in a log.
  bool tty = isatty(fileno(stderr));
  std::fprintf(stderr, "%s[%s] %lld/%lld  ETA %s  %-16s %-28s%s", tty ? "\r" : "", bar.c_str(),
               static_cast<long long>(done), static_cast<long long>(total), clock_text(eta).c_str(), kernel, candidate,
               tty ? "" : "\n");
  std::fflush(stderr);
}

void print_result(const lfce_tune_result* r, void*) {
  std::string speed = r->speedup > 0 ? std::to_string(r->speedup).substr(0, 5) + "x" : "-";
  std::printf("%-17s %-30s %9.3f %-30s %9.3f %7s %5d %5d %5d %5d\n", r->kernel, r->default_config, r->default_ms,
              r->winner ? r->winner : "(none)", r->winner_ms, speed.c_str(), r->measured, r->reused, r->failed,
              r->rejected);
}

}  // namespace

void add_tune_command(CLI::App& app) {
  auto opts = std::make_shared<TuneOptions>();
  CLI::App* cmd = app.add_subcommand("tune", "autotune the kernels of one problem on the GPU");
  auto* model = cmd->add_option("--model,-m", opts->model, std::string("model preset: ") + lfce_preset_names());
  auto* vocab = cmd->add_option("--vocab,-V", opts->vocab, "vocabulary size (instead of --model)")->check(at_least(1));
  auto* hidden = cmd->add_option("--hidden,-H", opts->hidden, "hidden size (instead of --model)")->check(at_least(1));
  model->excludes(vocab)->excludes(hidden);
  vocab->needs(hidden);
  hidden->needs(vocab);
  cmd->add_option("--device", opts->device, "CUDA device ordinal")->check(at_least(0))->capture_default_str();
  cmd->add_option("--space", opts->space, "config space")->check(CLI::IsMember({"default", "small", "wgmma"}))
      ->capture_default_str();
  cmd->add_option("--budget-minutes", opts->budget_minutes, "stop after this long (0: no limit); resumable")
      ->check(finite_in(0, kMaxBudgetMinutes));
  cmd->add_flag("--verify", opts->verify, "check every config's outputs against an fp64 reference computed on the host (first 300 tokens)");
  cmd->add_option("--repetitions", opts->repetitions, "timed runs per config (0: 10)")->check(at_least(0));
  cmd->add_option("--cache-dir", opts->cache_dir, "cache directory (default: $LFCE_CACHE_DIR or ~/.cache/lfce)")
      ->check(non_empty());
  opts->problem.add_to(*cmd);
  cmd->callback([opts] {
    if (opts->model.empty() && opts->vocab == 0)
      throw CLI::ValidationError("--model", "give a model preset or --vocab and --hidden");
    if (!opts->model.empty()) check(lfce_preset(opts->model.c_str(), &opts->hidden, &opts->vocab), "--model");
    if (!opts->cache_dir.empty()) check(lfce_set_cache_dir(opts->cache_dir.c_str()), "--cache-dir");
    lfce_problem p = opts->problem.problem(opts->vocab, opts->hidden);
    check(lfce_check_problem(&p), "--vocab/--hidden/--tokens/...");
    std::printf("tuning V=%lld H=%lld N=%lld %s (%s space) on device %d; cache %s\n",
                static_cast<long long>(p.vocab), static_cast<long long>(p.hidden), static_cast<long long>(p.tokens),
                opts->problem.dtype.c_str(), opts->space.c_str(), opts->device, lfce_cache_dir());
    std::fflush(stdout);
    lfce_tune_options o{};
    o.device = opts->device;
    o.space = opts->space.c_str();
    o.budget_minutes = opts->budget_minutes;
    o.verify = opts->verify ? 1 : 0;
    o.repetitions = opts->repetitions;
    o.progress = draw_progress;
    int32_t stopped = 0;
    std::printf("\n%-17s %-30s %9s %-30s %9s %7s %5s %5s %5s %5s\n", "kernel", "default", "ms", "winner", "ms",
                "speedup", "new", "kept", "inf", "pruned");
    int status = lfce_tune(&p, &o, print_result, nullptr, &stopped);
    std::fprintf(stderr, "\n");
    check(status, "tune");
    if (stopped) std::printf("stopped by --budget-minutes; run again to continue where it stopped\n");
  });
}

}  // namespace lfce::cli
