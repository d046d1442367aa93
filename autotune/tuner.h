// The autotuning sweep: for each GEMM kind of a problem, measure every candidate of a config
// space (runtime::forward / backward with that candidate's tuning), keep every outcome in the
// tuning store and report the winner against the default config.
//
// Kinds are tuned in order (lse_forward, dlogits_backward, grad_weight, grad_input), each with
// the winners of the kinds before it fixed: a coordinate descent, since the backward's time
// is the sum of its kernels and its chunk (swept with dlogits_backward) is shared by all three.
// A sweep is resumable: candidates already in the store for that key are not measured again,
// and each outcome is saved as soon as it is known.
#pragma once

#include <cstdint>
#include <functional>
#include <limits>
#include <optional>
#include <string>
#include <vector>

#include "autotune/config_space.h"
#include "autotune/tuning_store.h"
#include "runtime/plan.h"
#include "runtime/tuning.h"

namespace lfce::autotune {

struct Progress {
  int done = 0, total = 0;  // candidates measured in this sweep / to measure in all
  double eta_seconds = 0;   // from the mean time per candidate so far
  KernelKind kind = KernelKind::LseForward;
  std::string candidate;    // the one about to be measured
};

struct TuneOptions {
  std::string space = "default";  // config_space() name: "default" or "small"
  std::vector<KernelKind> kinds;  // empty: tuned_kinds()
  int warmup = 2;                 // untimed runs after the first (which compiles and loads)
  int repetitions = 10;           // timed runs; the median counts
  double budget_minutes = 0;      // stop cleanly, keeping what was measured, after this; 0: no limit
  bool verify = false;            // check outputs against the fp64 host reference (host_reference.h)
  std::string cache_dir;          // "": runtime::default_cache_dir()
  runtime::DeviceLimits limits;   // the device's shared memory per block and SM count; 0s: the arch table's
  uint64_t seed = 20261130;       // of the random problem data
  std::function<void(const Progress&)> progress;
};

struct KindResult {
  KernelKind kind = KernelKind::LseForward;
  std::string path;  // the tuning file
  runtime::Candidate default_config;
  std::optional<runtime::Candidate> winner;
  double default_ms = std::numeric_limits<double>::infinity();
  double winner_ms = std::numeric_limits<double>::infinity();
  std::optional<double> speedup;  // default_ms / winner_ms
  int measured = 0;  // in this sweep
  int reused = 0;    // already in the store
  int failed = 0;    // scored +inf (in the store, this sweep's and earlier ones')
  int rejected = 0;  // pruned before compiling
};

struct TuneResult {
  std::vector<KindResult> kinds;
  bool stopped_by_budget = false;
  runtime::Tuning tuning;  // the winners together, as the Session will now read them
};

// What a sweep measures with: the GPU in tune(), a fake in tests.
class Bench {
 public:
  virtual ~Bench() = default;
  virtual std::string device_name() const = 0;
  // Called once before the first measurement (never when nothing is left to measure); a
  // throw ends the sweep without blaming any candidate (no memory, no device).
  virtual void prepare() {}
  // Time of the forward (lse_forward) or the backward (the other kinds) run with `tuning`.
  // Failures are returned as data (+inf and the reason), not thrown, unless the device is
  // unusable afterwards (a sticky CUDA error): then it throws and the sweep ends.
  virtual runtime::Measurement measure(KernelKind kind, const runtime::Tuning& tuning) = 0;
};

// The candidates of `candidates` that `entry` has no record of, in order.
std::vector<runtime::Candidate> remaining(const std::optional<runtime::TuningEntry>& entry, const std::vector<runtime::Candidate>& candidates);

// The sweep with any bench: pruning, resuming, saving, winners, progress and budget.
TuneResult tune_with(Bench& bench, const runtime::Problem& problem, Arch arch, const TuneOptions& options);

// The sweep on GPU `device` (its arch, random data of the problem's shape). Throws
// DriverUnavailable without a GPU.
TuneResult tune(const runtime::Problem& problem, int device, const TuneOptions& options = {});

}  // namespace lfce::autotune
