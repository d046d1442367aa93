#include "runtime/tuning_files.h"

#include <spdlog/spdlog.h>

#include <algorithm>
#include <cerrno>
#include <cstdio>
#include <filesystem>
#include <nlohmann/json.hpp>
#include <sstream>
#include <stdexcept>

#include "compiler/checked_int.h"
#include "compiler/errors.h"
#include "compiler/kernel_kind.h"
#include "runtime/cache_files.h"
#include "templates/templates.h"

namespace lfce::runtime {
namespace {

namespace fs = std::filesystem;
// Ordered: the file reads key, winner, then the candidates, as written.
using json = nlohmann::ordered_json;

constexpr std::size_t kMaxFileBytes = 16 << 20;

std::string index_name(IndexType t) { return t == IndexType::I64 ? "i64" : "i32"; }

// An older format is expected after an upgrade (the next `lfce tune` replaces it); anything
// else wrong with a file is worth a warning.
struct OlderFormat : std::runtime_error {
  using std::runtime_error::runtime_error;
};

// Throws (json, SpecError or OlderFormat) on anything unexpected: the caller treats the file as missing.
TuningEntry entry_from_json(const json& j, const TuningKey& key) {
  const json& format = j.at("format");
  if (!format.is_number_integer() || format.get<int64_t>() != kTuningFormat) {
    if (format.is_number_integer() && format.get<int64_t>() < kTuningFormat)
      throw OlderFormat("format " + format.dump() + ", older than " + std::to_string(kTuningFormat));
    throw std::runtime_error("format " + format.dump() + ", expected " + std::to_string(kTuningFormat));
  }
  // Compared unordered: a file whose key fields were reordered by hand still matches.
  if (nlohmann::json::parse(j.at("key").dump()) != nlohmann::json::parse(key_json(key).dump()))
    throw std::runtime_error("its key is " + j.at("key").dump());
  TuningEntry e;
  e.key = key;
  e.tokens = j.at("tokens").get<int64_t>();
  e.device = j.at("device").get<std::string>();
  e.default_config = Candidate::parse(key.kind, j.at("default").get<std::string>());
  e.measured_with = j.at("measured_with").get<std::map<std::string, std::string>>();
  for (const json& r : j.at("candidates")) {
    Record rec;
    rec.candidate = Candidate::parse(key.kind, r.at("config").get<std::string>());
    if (!r.at("ms").is_null()) rec.result.ms = r.at("ms").get<double>();
    rec.result.error = r.value("error", "");
    rec.result.verify_error = r.value("verify_error", -1.0);
    e.records.push_back(std::move(rec));
  }
  return e;
}

}  // namespace

int64_t token_bucket(int64_t tokens) { return next_pow2(tokens, "tuning N bucket"); }

DeviceLimits effective_limits(Arch arch, const DeviceLimits& limits) {
  const int64_t table = arch_info(arch).smem_per_block_optin;
  return DeviceLimits{limits.smem_per_block > 0 ? std::min(limits.smem_per_block, table) : table,
                      limits.sm_count > 0 ? limits.sm_count : kDefaultForwardCtas};
}

std::string Candidate::text() const {
  std::string out = tile.text();
  if (kind == KernelKind::LseForward) out += ";ctas=" + std::to_string(forward_ctas);
  if (kind == KernelKind::DlogitsBackward) out += ";chunk=" + std::to_string(chunk);
  return out;
}

Candidate Candidate::parse(KernelKind kind, std::string_view text) {
  const std::string s(text);
  Candidate c;
  c.kind = kind;
  // "<tile>" then ";ctas=N" (lse_forward) or ";chunk=N" (dlogits_backward).
  const size_t semicolon = s.find(';');
  bool ok = true;
  try {
    c.tile = TileConfig::parse(s.substr(0, semicolon));
  } catch (const SpecError&) {
    ok = false;
  }
  const char* extra_name = kind == KernelKind::LseForward ? "ctas=" : kind == KernelKind::DlogitsBackward ? "chunk=" : nullptr;
  if (ok && extra_name) {
    const std::string prefix = std::string(";") + extra_name;
    long long extra = 0;
    int used = 0;
    ok = semicolon != std::string::npos && s.compare(semicolon, prefix.size(), prefix) == 0 &&
         std::sscanf(s.c_str() + semicolon + prefix.size(), "%lld%n", &extra, &used) == 1;
    (kind == KernelKind::LseForward ? c.forward_ctas : c.chunk) = extra;
  } else if (ok) {
    ok = semicolon == std::string::npos;
  }
  // Round trip: rejects trailing text and non-canonical spellings (" 128", "+128").
  if (!ok || c.text() != s)
    throw SpecError("'" + s + "' is not a " + std::string(kind_name(kind)) + " candidate; expected e.g. '" +
                    Candidate{kind, default_tile(kind, DType::BF16),
                              kind == KernelKind::LseForward ? kDefaultForwardCtas : 0,
                              kind == KernelKind::DlogitsBackward ? 16384 : 0}
                        .text() +
                    "'");
  return c;
}

Tuning Candidate::apply(Tuning base) const {
  base.tiles[kind] = tile;
  if (kind == KernelKind::LseForward) base.forward_ctas = forward_ctas;
  if (kind == KernelKind::DlogitsBackward) base.chunk = chunk;
  return base;
}

std::optional<std::string> unrunnable(const Candidate& c, const Problem& problem, Arch arch,
                                      const DeviceLimits& limits) {
  const ArchInfo& info = arch_info(arch);
  const std::string on = std::string(" on ") + info.name;
  try {
    c.tile.check_range();  // first: a tile read from a file may hold anything
  } catch (const SpecError& e) {
    return e.what();
  }
  if (c.tile.threads() > info.threads_per_block_max)
    return "threads per block " + std::to_string(c.tile.threads()) + " > limit " +
           std::to_string(info.threads_per_block_max) + on;
  if (c.kind == KernelKind::LseForward && (c.forward_ctas < 1 || c.forward_ctas > kMaxForwardCtas))
    return "forward CTAs " + std::to_string(c.forward_ctas) + " outside 1.." + std::to_string(kMaxForwardCtas) +
           " (the forward workspace's bound)";
  if (c.kind == KernelKind::DlogitsBackward && (c.chunk < 1 || (c.chunk % 128 != 0 && c.chunk != problem.vocab)))
    return "chunk " + std::to_string(c.chunk) + " is not a positive multiple of 128";
  // Before the Plan, which would run the default instead of such a tile (and say so).
  if (c.tile.wgmma() && hidden_row_align(problem.hidden, problem.dtype) < 16)
    return "tile " + c.tile.text() + " loads with TMA, which needs rows of a multiple of 16 bytes; hidden = " +
           std::to_string(problem.hidden) + " " + std::string(dtype_name(problem.dtype)) + " rows are " +
           std::to_string(problem.hidden * dtype_bytes(problem.dtype)) + " bytes";
  KernelSpec spec;
  try {
    spec = Plan(problem, arch, c.apply(Tuning{})).spec(c.kind);
  } catch (const SpecError& e) {
    return std::string("invalid plan: ") + e.what();
  }
  const int64_t smem_max = effective_limits(arch, limits).smem_per_block;
  const int smem = kernel_smem_bytes(spec);
  if (smem > smem_max)
    return "shared memory " + std::to_string(smem) + " bytes > limit " + std::to_string(smem_max) + " bytes" +
           (limits.smem_per_block > 0 ? std::string(" of this device") : on);
  try {
    spec.validate();
  } catch (const SpecError& e) {
    return std::string("invalid spec: ") + e.what();
  }
  return std::nullopt;
}

TuningKey TuningKey::of(KernelKind kind, const Problem& p, Arch arch, const DeviceLimits& limits) {
  // Problems whose kernel of this kind is the same code share one tuning: the features the
  // kind's code does not read (KernelSpec::fields_read: mode for the forward, for instance)
  // take the normalised spec's values. V, H and the N bucket stay: they change the timing.
  const KernelSpec n = problem_spec(kind, p, arch).normalised();
  const DeviceLimits device = effective_limits(arch, limits);
  return TuningKey{kind,        p.vocab, p.hidden, n.dtype, n.mode, n.bias, n.reduction, n.targets, arch,
                   device.smem_per_block, device.sm_count, token_bucket(p.tokens)};
}

std::string TuningKey::text() const {
  std::ostringstream out;
  out << kind_name(kind) << '-' << arch_name(arch) << "-smem" << smem_per_block << "-sms" << sm_count << '-'
      << dtype_name(dtype) << "-V" << vocab << "-H" << hidden << "-N" << n_bucket << '-' << mode_name(mode) << '-'
      << reduction_name(reduction) << '-' << index_name(targets) << '-' << (bias ? "bias" : "nobias");
  return out.str();
}

nlohmann::ordered_json key_json(const TuningKey& k) {
  return {{"kind", kind_name(k.kind)},
          {"vocab", k.vocab},
          {"hidden", k.hidden},
          {"dtype", dtype_name(k.dtype)},
          {"mode", mode_name(k.mode)},
          {"bias", k.bias},
          {"reduction", reduction_name(k.reduction)},
          {"targets", index_name(k.targets)},
          {"arch", arch_name(k.arch)},
          {"smem_per_block", k.smem_per_block},
          {"sm_count", k.sm_count},
          {"n_bucket", k.n_bucket}};
}

const Record* TuningEntry::find(const Candidate& candidate) const {
  for (const Record& r : records)
    if (r.candidate == candidate) return &r;
  return nullptr;
}

const Record* TuningEntry::winner() const {
  const Record* best = nullptr;
  for (const Record& r : records)
    if (r.result.ok() && (!best || r.result.ms < best->result.ms)) best = &r;
  return best;
}

std::optional<double> TuningEntry::speedup() const {
  const Record* w = winner();
  const Record* d = find(default_config);
  if (!w || !d || !d->result.ok()) return std::nullopt;
  return d->result.ms / w->result.ms;
}

TuningFiles::TuningFiles(const std::string& cache_dir)
    : dir_(cache_dir.empty() ? "" : (fs::path(cache_dir) / "tuning").string()) {}

std::string TuningFiles::path(const TuningKey& key) const {
  return (fs::path(dir_) / (key.text() + ".json")).string();
}

std::optional<TuningEntry> TuningFiles::load(const TuningKey& key) const {
  if (dir_.empty()) return std::nullopt;
  const std::string file = path(key);
  // Never blocks on a FIFO or device in the file's place, never reads through a link, and
  // bounds the size (a tuning file is a few KB).
  std::string text;
  if (int error = read_file(file, text, kMaxFileBytes); error != 0) {
    if (error != ENOENT) spdlog::warn("ignoring tuning file {}: {}", file, error_text(error));
    return std::nullopt;
  }
  try {
    return entry_from_json(json::parse(text), key);
  } catch (const OlderFormat& e) {
    spdlog::info("ignoring tuning file {}: {} (run `lfce tune` again)", file, e.what());
  } catch (const std::exception& e) {
    spdlog::warn("ignoring tuning file {}: {}", file, e.what());
  }
  return std::nullopt;
}

Tuning stored_tuning(const TuningFiles& files, const Problem& problem, Arch arch, const DeviceLimits& limits) {
  Tuning tuning;
  for (const KernelKindInfo& info : kKernelKinds) {
    if (!info.gemm || info.eager) continue;  // (eager_logits takes dlogits_backward's tuning)
    const TuningKey key = TuningKey::of(info.kind, problem, arch, limits);
    std::optional<TuningEntry> entry = files.load(key);
    const Record* winner = entry ? entry->winner() : nullptr;
    if (!winner) continue;
    // A file written by another generator version may hold a config this one cannot run.
    if (auto reason = unrunnable(winner->candidate, problem, arch, limits)) {
      spdlog::warn("ignoring tuned config {} of {}: {}", winner->candidate.text(), files.path(key), *reason);
      continue;
    }
    spdlog::info("using tuned config {} for {} from {}", winner->candidate.text(), kind_name(info.kind),
                 files.path(key));
    tuning = winner->candidate.apply(tuning);
  }
  return tuning;
}

}  // namespace lfce::runtime
