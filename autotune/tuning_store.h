// Persisted tuning results: one JSON file per (kernel kind, V, H, dtype, mode, bias,
// reduction, target dtype, arch, N bucket) under <cache dir>/tuning/ (the kernel disk cache's
// directory), holding the key, every candidate measured with its median time (or its failure),
// and so the winner. The tuner writes them; the api layer's Session reads the winners through
// stored_tuning(), once per problem and cache directory.
#pragma once

#include <cstdint>
#include <limits>
#include <map>
#include <optional>
#include <string>
#include <vector>

#include "autotune/config_space.h"
#include "runtime/plan.h"
#include "runtime/tuning.h"

namespace lfce::autotune {

// N is a run-time argument of every kernel, so nearby token counts share one tuning: the
// bucket is the next power of two of N (SpecError beyond 2^62; problems stop at kMaxTokens).
int64_t token_bucket(int64_t tokens);

struct TuningKey {
  KernelKind kind = KernelKind::LseForward;
  int64_t vocab = 0, hidden = 0;
  DType dtype = DType::BF16;
  Mode mode = Mode::Recompute;
  bool bias = false;
  Reduction reduction = Reduction::Mean;
  IndexType targets = IndexType::I64;
  Arch arch = Arch::SM90A;
  int64_t n_bucket = 1;

  static TuningKey of(KernelKind kind, const runtime::Problem& problem, Arch arch);
  // Readable file stem, e.g. "lse_forward-sm_90a-bf16-V128256-H4096-N8192-recompute-mean-i64-nobias".
  std::string text() const;

  auto tie() const { return std::tie(kind, vocab, hidden, dtype, mode, bias, reduction, targets, arch, n_bucket); }
  bool operator==(const TuningKey& o) const { return tie() == o.tie(); }
};

// One candidate's outcome. A failure is data: ms = +inf and the reason.
struct Measurement {
  double ms = std::numeric_limits<double>::infinity();  // median over the timed runs
  std::string error;                                    // why it failed ("" when it ran)
  double verify_error = -1;  // relative L2 against the default config; < 0: not verified
  bool ok() const { return ms < std::numeric_limits<double>::infinity(); }
};

struct Record {
  Candidate candidate;
  Measurement result;
};

struct TuningEntry {
  TuningKey key;
  int64_t tokens = 0;        // N the candidates were measured with
  std::string device;        // GPU name, for the reader
  Candidate default_config;  // what the runtime runs untuned
  std::map<std::string, std::string> measured_with;  // the other kinds' choices (kind -> candidate)
  std::vector<Record> records;                       // in measurement order

  const Record* find(const Candidate& candidate) const;
  const Record* winner() const;  // the fastest that ran, or nullptr
  // default time / winner time, or nullopt while either is unknown.
  std::optional<double> speedup() const;
};

class TuningStore {
 public:
  // An empty cache_dir (default_cache_dir() found none) stores nothing and finds nothing.
  explicit TuningStore(std::string cache_dir);
  const std::string& dir() const { return dir_; }  // <cache dir>/tuning
  std::string path(const TuningKey& key) const;

  // The stored entry, or nullopt if there is none. An unreadable, corrupt or foreign file
  // is logged and reads as none (the next save replaces it).
  std::optional<TuningEntry> load(const TuningKey& key) const;
  // Writes atomically (temp file in the same directory, fsync, rename): readers see the old
  // entry or the new one, never a part. Throws std::runtime_error naming the path.
  void save(const TuningEntry& entry) const;

 private:
  std::string dir_;
};

// A Tuning from the stored winners of every tuned kind for `problem` on `arch`; kinds without
// a usable winner keep the defaults. Logs each winner used, with its file.
runtime::Tuning stored_tuning(const TuningStore& store, const runtime::Problem& problem, Arch arch);

}  // namespace lfce::autotune
