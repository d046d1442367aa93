// The sweep itself, independent of what measures: pruning, resuming from the store, saving
// each outcome as it comes, the time budget, progress and the winners.
#include "autotune/tuner.h"

#include <spdlog/spdlog.h>

#include <algorithm>
#include <chrono>
#include <random>

#include "compiler/errors.h"
#include "runtime/disk_cache.h"

namespace lfce::autotune {
namespace {

using Clock = std::chrono::steady_clock;
using runtime::Problem;
using runtime::Tuning;

// The kinds asked for, in tuning order (each is measured with the winners before it fixed).
std::vector<KernelKind> kinds_in_order(const TuneOptions& options) {
  if (options.kinds.empty()) return tuned_kinds();
  for (KernelKind kind : options.kinds)
    if (!is_tuned_kind(kind)) throw SpecError(std::string(kind_name(kind)) + " is not a tuned GEMM kind");
  std::vector<KernelKind> out;
  for (KernelKind kind : tuned_kinds())
    if (std::find(options.kinds.begin(), options.kinds.end(), kind) != options.kinds.end()) out.push_back(kind);
  return out;
}

struct KindSweep {
  KernelKind kind;
  ConfigSpace space;
  std::optional<runtime::TuningEntry> stored;
  std::vector<runtime::Candidate> todo;
};

// Counts candidates over all kinds and estimates the time left from the mean so far.
class ProgressMeter {
 public:
  ProgressMeter(int total, const std::function<void(const Progress&)>& report)
      : total_(total), report_(report), start_(Clock::now()) {}
  void about_to_measure(KernelKind kind, const runtime::Candidate& c) const { emit(kind, c.text()); }
  void measured() { ++done_; }
  void finish(KernelKind kind) const { emit(kind, ""); }
  int done() const { return done_; }

 private:
  void emit(KernelKind kind, const std::string& candidate) const {
    if (!report_) return;
    double elapsed = std::chrono::duration<double>(Clock::now() - start_).count();
    double eta = done_ > 0 ? elapsed / done_ * (total_ - done_) : 0;
    report_(Progress{done_, total_, eta, kind, candidate});
  }

  int total_, done_ = 0;
  const std::function<void(const Progress&)>& report_;
  Clock::time_point start_;
};

// The other kinds' choices in `fixed`, as the record of what a kind was measured with.
std::map<std::string, std::string> context_of(KernelKind kind, const Problem& problem, const Tuning& fixed, Arch arch,
                                              const runtime::DeviceLimits& limits) {
  std::map<std::string, std::string> out;
  for (KernelKind other : tuned_kinds())
    if (other != kind) out[std::string(kind_name(other))] = candidate_of(other, problem, fixed, arch, limits).text();
  return out;
}

void save_or_warn(const TuningStore& store, const runtime::TuningEntry& entry, bool& warned) {
  try {
    store.save(entry);
  } catch (const std::exception& e) {
    // A read-only cache loses the persistence, not the sweep: results still come back.
    if (!warned) spdlog::warn("{}; tuning results are not persisted", e.what());
    warned = true;
  }
}

KindResult result_of(const KindSweep& s, const runtime::TuningEntry& entry, const TuningStore& store, int measured) {
  KindResult r;
  r.kind = s.kind;
  r.path = store.path(entry.key);
  r.default_config = entry.default_config;
  if (const runtime::Record* d = entry.find(entry.default_config)) r.default_ms = d->result.ms;
  if (const runtime::Record* w = entry.winner()) {
    r.winner = w->candidate;
    r.winner_ms = w->result.ms;
  }
  r.speedup = entry.speedup();
  r.measured = measured;
  r.reused = static_cast<int>(s.space.kept.size() - s.todo.size());
  r.failed = static_cast<int>(std::count_if(entry.records.begin(), entry.records.end(),
                                            [](const runtime::Record& rec) { return !rec.result.ok(); }));
  r.rejected = static_cast<int>(s.space.rejected.size());
  return r;
}

}  // namespace

std::vector<runtime::Candidate> remaining(const std::optional<runtime::TuningEntry>& entry, const std::vector<runtime::Candidate>& candidates) {
  std::vector<runtime::Candidate> out;
  for (const runtime::Candidate& c : candidates)
    if (!entry || !entry->find(c)) out.push_back(c);
  return out;
}

TuneResult tune_with(Bench& bench, const Problem& problem, Arch arch, const TuneOptions& options) {
  const TuningStore store(options.cache_dir.empty() ? runtime::default_cache_dir() : options.cache_dir);
  std::vector<KindSweep> sweeps;
  int total = 0;
  for (KernelKind kind : kinds_in_order(options)) {
    KindSweep s{kind, config_space(kind, problem, arch, options.space, options.limits),
                store.load(runtime::TuningKey::of(kind, problem, arch, options.limits)), {}};
    s.todo = remaining(s.stored, s.space.kept);
    // The default first (every speed-up is relative to it), the rest in a fixed shuffled
    // order: a sweep cut short by its budget has then sampled the whole space, not a corner.
    auto rest = s.todo.begin();
    if (rest != s.todo.end() && *rest == s.space.kept.front()) ++rest;
    std::shuffle(rest, s.todo.end(), std::mt19937_64(static_cast<uint64_t>(kind) + 1));
    total += static_cast<int>(s.todo.size());
    spdlog::info("{}: {} configs to measure, {} already measured, {} pruned", kind_name(kind), s.todo.size(),
                 s.space.kept.size() - s.todo.size(), s.space.rejected.size());
    sweeps.push_back(std::move(s));
  }

  const auto deadline = options.budget_minutes > 0
                            ? Clock::now() + std::chrono::duration_cast<Clock::duration>(
                                                 std::chrono::duration<double, std::ratio<60>>(options.budget_minutes))
                            : Clock::time_point::max();
  ProgressMeter meter(total, options.progress);
  TuneResult result;
  // Kinds not tuned now run with their stored winners while the others are measured.
  Tuning fixed = runtime::stored_tuning(store, problem, arch, options.limits);
  bool warned = false, prepared = false;
  for (KindSweep& s : sweeps) {
    runtime::TuningEntry entry = s.stored ? *s.stored : runtime::TuningEntry{};
    entry.key = runtime::TuningKey::of(s.kind, problem, arch, options.limits);
    entry.tokens = problem.tokens;
    entry.device = bench.device_name();
    entry.default_config = s.space.kept.front();
    entry.measured_with = context_of(s.kind, problem, fixed, arch, options.limits);
    int measured = 0;
    for (const runtime::Candidate& c : s.todo) {
      if (Clock::now() >= deadline) {
        result.stopped_by_budget = true;
        break;
      }
      if (!prepared) bench.prepare();
      prepared = true;
      meter.about_to_measure(s.kind, c);
      runtime::Measurement m;
      try {
        m = bench.measure(s.kind, c.apply(fixed));
      } catch (const std::exception& e) {
        // The device is unusable: keep the culprit as a failure, so that a resumed sweep
        // (in a fresh process) skips it, and stop.
        runtime::Measurement fatal;
        fatal.error = std::string("fatal: ") + e.what();
        entry.records.push_back({c, fatal});
        save_or_warn(store, entry, warned);
        throw;
      }
      if (!m.ok()) spdlog::info("{} {}: {}", kind_name(s.kind), c.text(), m.error);
      entry.records.push_back({c, m});
      save_or_warn(store, entry, warned);
      meter.measured();
      ++measured;
    }
    if (const runtime::Record* w = entry.winner()) fixed = w->candidate.apply(fixed);
    result.kinds.push_back(result_of(s, entry, store, measured));
    if (!s.todo.empty()) meter.finish(s.kind);
  }
  result.tuning = fixed;
  return result;
}

}  // namespace lfce::autotune
