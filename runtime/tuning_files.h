// Reading persisted tunings: one JSON file per (kernel kind, V, H, dtype, mode, bias,
// reduction, target dtype, arch, device limits, N bucket) under <cache dir>/tuning/ (the kernel
// disk cache's directory), holding the key, every candidate measured with its median time (or
// its failure), and so the winner. The runtime owns reading them, as it owns reading the disk
// cache: the api layer's Session asks stored_tuning() once per problem, device and cache
// directory. The autotuner (autotune/tuning_store.h) is the only writer.
#pragma once

#include <cstdint>
#include <limits>
#include <map>
#include <nlohmann/json_fwd.hpp>
#include <optional>
#include <string>
#include <string_view>
#include <tuple>
#include <vector>

#include "compiler/kernel_spec.h"
#include "runtime/plan.h"
#include "runtime/tuning.h"

namespace lfce::runtime {

// Bumped when the file layout or the key changes; files of another format read as "no winner".
// 2: the key holds the device's limits class (shared memory per block, SM count).
constexpr int kTuningFormat = 2;

// N is a run-time argument of every kernel, so nearby token counts share one tuning: the
// bucket is the next power of two of N (SpecError beyond 2^62; problems stop at kMaxTokens).
int64_t token_bucket(int64_t tokens);

// `limits` with the unknowns (0) filled as a Plan fills them: the arch table's opt-in shared
// memory (and never more than it), kDefaultForwardCtas SMs.
DeviceLimits effective_limits(Arch arch, const DeviceLimits& limits);

// One kind's tuning choice: its CTA tile, plus the forward's CTA target (lse_forward) or the
// backward's vocabulary chunk (dlogits_backward: the chunk is shared by the three backward
// GEMMs, so it is swept once, with the first of them, and fixed for the others).
struct Candidate {
  KernelKind kind = KernelKind::LseForward;
  TileConfig tile;
  int64_t forward_ctas = 0;  // lse_forward only, else 0
  int64_t chunk = 0;         // dlogits_backward only, else 0

  // Canonical text: "128x128x64/2x4/s3", then ";ctas=264" (lse_forward) or ";chunk=16384"
  // (dlogits_backward). The kind is not part of it: it is the key of the list it sits in.
  std::string text() const;
  // Throws SpecError naming the text when it does not read as a candidate of `kind`.
  static Candidate parse(KernelKind kind, std::string_view text);

  // `base` with this kind's choice set, the other kinds' choices left as they are.
  Tuning apply(Tuning base) const;

  auto tie() const { return std::tie(kind, tile, forward_ctas, chunk); }
  bool operator==(const Candidate& o) const { return tie() == o.tie(); }
  bool operator!=(const Candidate& o) const { return !(*this == o); }
  bool operator<(const Candidate& o) const { return tie() < o.tie(); }
};

// Why `candidate` cannot run for `problem` on `arch` within `limits` (which limit, the value,
// the limit), or nothing if it can: tile ranges, threads, CTA target, chunk, shared memory,
// KernelSpec::validate(). A winner read from a file is checked with it before any arithmetic.
std::optional<std::string> unrunnable(const Candidate& candidate, const Problem& problem, Arch arch,
                                      const DeviceLimits& limits = {});

struct TuningKey {
  KernelKind kind = KernelKind::LseForward;
  int64_t vocab = 0, hidden = 0;
  DType dtype = DType::BF16;
  Mode mode = Mode::Recompute;
  bool bias = false;
  Reduction reduction = Reduction::Mean;
  IndexType targets = IndexType::I64;
  Arch arch = Arch::SM90A;
  // The device's limits class, as the Plan uses it (effective_limits): a winner tuned on a
  // 227 KiB GPU is never looked up for a 99 KiB one, nor one tuned on 132 SMs for 108.
  int64_t smem_per_block = 0, sm_count = 0;
  int64_t n_bucket = 1;

  // Normalised per kind: problems whose kernel of this kind is the same code share one key.
  // `limits` unknown (0, offline): the arch table's shared memory and kDefaultForwardCtas.
  static TuningKey of(KernelKind kind, const Problem& problem, Arch arch, const DeviceLimits& limits = {});
  // Readable file stem, e.g.
  // "lse_forward-sm_90a-smem232448-sms132-bf16-V128256-H4096-N8192-recompute-mean-i64-nobias".
  std::string text() const;

  auto tie() const {
    return std::tie(kind, vocab, hidden, dtype, mode, bias, reduction, targets, arch, smem_per_block, sm_count,
                    n_bucket);
  }
  bool operator==(const TuningKey& o) const { return tie() == o.tie(); }
};

// The key as the file holds it (the writer, autotune/, uses the same).
nlohmann::ordered_json key_json(const TuningKey& key);

// One candidate's outcome. A failure is data: ms = +inf and the reason.
struct Measurement {
  double ms = std::numeric_limits<double>::infinity();  // median over the timed runs
  std::string error;                                    // why it failed ("" when it ran)
  // `lfce tune --verify`: the worst error over the outputs against the fp64 host reference,
  // in units of the allowed bound (<= 1 passes; autotune/host_reference.h); < 0: not verified.
  double verify_error = -1;
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

// The tuning files of one cache directory, read-only.
class TuningFiles {
 public:
  // An empty cache_dir (default_cache_dir() found none) finds nothing.
  explicit TuningFiles(const std::string& cache_dir);
  const std::string& dir() const { return dir_; }  // <cache dir>/tuning
  std::string path(const TuningKey& key) const;

  // The stored entry, or nullopt if there is none. An unreadable, corrupt or foreign file is
  // logged and reads as none (the next save replaces it); a file of an older format quietly so.
  std::optional<TuningEntry> load(const TuningKey& key) const;

 private:
  std::string dir_;
};

// A Tuning from the stored winners of every tuned (GEMM) kind for `problem` on `arch` within
// `limits`; kinds without a usable winner keep the defaults. Logs each winner used, with its file.
Tuning stored_tuning(const TuningFiles& files, const Problem& problem, Arch arch, const DeviceLimits& limits = {});

}  // namespace lfce::runtime
