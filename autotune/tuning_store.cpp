#include "autotune/tuning_store.h"

#include <spdlog/spdlog.h>

#include <cerrno>
#include <cmath>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <nlohmann/json.hpp>
#include <sstream>
#include <stdexcept>

#include "autotune/tuner.h"
#include "compiler/checked_int.h"
#include "compiler/errors.h"
#include "runtime/cache_files.h"
#include "runtime/disk_cache.h"

namespace lfce::autotune {
namespace {

namespace fs = std::filesystem;
// Ordered: the file reads key, winner, then the candidates, as written.
using json = nlohmann::ordered_json;
using runtime::Problem;
using runtime::Tuning;

// Bumped when the file layout changes; files of another format read as missing.
constexpr int kFormat = 1;
constexpr std::size_t kMaxFileBytes = 16 << 20;

std::string index_name(IndexType t) { return t == IndexType::I64 ? "i64" : "i32"; }

json key_json(const TuningKey& k) {
  return {{"kind", kind_name(k.kind)},       {"vocab", k.vocab},
          {"hidden", k.hidden},              {"dtype", dtype_name(k.dtype)},
          {"mode", mode_name(k.mode)},       {"bias", k.bias},
          {"reduction", reduction_name(k.reduction)}, {"targets", index_name(k.targets)},
          {"arch", arch_name(k.arch)},       {"n_bucket", k.n_bucket}};
}

json record_json(const Record& r) {
  json j = {{"config", r.candidate.text()}};
  j["ms"] = r.result.ok() ? json(r.result.ms) : json(nullptr);  // JSON has no infinity
  if (!r.result.error.empty()) j["error"] = r.result.error;
  if (r.result.verify_error >= 0) j["verify_error"] = r.result.verify_error;
  return j;
}

json entry_json(const TuningEntry& e) {
  json j = {{"format", kFormat},
            {"key", key_json(e.key)},
            {"tokens", e.tokens},
            {"device", e.device},
            {"default", e.default_config.text()},
            {"measured_with", e.measured_with}};
  if (const Record* w = e.winner()) {
    j["winner"] = {{"config", w->candidate.text()}, {"ms", w->result.ms}};
    if (auto s = e.speedup()) j["winner"]["speedup_vs_default"] = *s;
  } else {
    j["winner"] = nullptr;
  }
  j["candidates"] = json::array();
  for (const Record& r : e.records) j["candidates"].push_back(record_json(r));
  return j;
}

// Throws (json or SpecError) on anything unexpected: the caller treats the file as missing.
TuningEntry entry_from_json(const json& j, const TuningKey& key) {
  if (j.at("format").get<int>() != kFormat) throw std::runtime_error("format " + j.at("format").dump());
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

void write_entry(const fs::path& path, const std::string& text) {
  std::error_code ec;
  fs::create_directories(path.parent_path(), ec);
  if (ec) throw std::runtime_error("tuning store: cannot create " + path.parent_path().string() + ": " + ec.message());
  std::string error;
  if (!runtime::write_atomically(path.parent_path().string(), path.filename().string(), text, error))
    throw std::runtime_error("tuning store: " + error);
  runtime::sync_directory(path.parent_path().string());
}

}  // namespace

int64_t token_bucket(int64_t tokens) { return next_pow2(tokens, "tuning N bucket"); }

TuningKey TuningKey::of(KernelKind kind, const Problem& p, Arch arch) {
  // Problems whose kernel of this kind is the same code share one tuning: the features the
  // kind's code does not read (KernelSpec::fields_read: mode for the forward, for instance)
  // take the normalised spec's values. V, H and the N bucket stay: they change the timing.
  const KernelSpec n = runtime::problem_spec(kind, p, arch).normalised();
  return TuningKey{kind, p.vocab, p.hidden, n.dtype, n.mode, n.bias, n.reduction, n.targets, arch,
                   token_bucket(p.tokens)};
}

std::string TuningKey::text() const {
  std::ostringstream out;
  out << kind_name(kind) << '-' << arch_name(arch) << '-' << dtype_name(dtype) << "-V" << vocab << "-H" << hidden
      << "-N" << n_bucket << '-' << mode_name(mode) << '-' << reduction_name(reduction) << '-'
      << index_name(targets) << '-' << (bias ? "bias" : "nobias");
  return out.str();
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

TuningStore::TuningStore(std::string cache_dir)
    : dir_(cache_dir.empty() ? "" : (fs::path(cache_dir) / "tuning").string()) {}

std::string TuningStore::path(const TuningKey& key) const { return (fs::path(dir_) / (key.text() + ".json")).string(); }

std::optional<TuningEntry> TuningStore::load(const TuningKey& key) const {
  if (dir_.empty()) return std::nullopt;
  const std::string file = path(key);
  // Never blocks on a FIFO or device in the file's place, never reads through a link, and
  // bounds the size (a tuning file is a few KB).
  std::string text;
  if (int error = runtime::read_file(file, text, kMaxFileBytes); error != 0) {
    if (error != ENOENT) spdlog::warn("ignoring tuning file {}: {}", file, runtime::error_text(error));
    return std::nullopt;
  }
  try {
    return entry_from_json(json::parse(text), key);
  } catch (const std::exception& e) {
    spdlog::warn("ignoring tuning file {}: {}", file, e.what());
    return std::nullopt;
  }
}

void TuningStore::save(const TuningEntry& entry) const {
  if (dir_.empty()) throw std::runtime_error("tuning store: no cache directory (set LFCE_CACHE_DIR)");
  write_entry(path(entry.key), entry_json(entry).dump(2) + "\n");
}

Tuning stored_tuning(const TuningStore& store, const Problem& problem, Arch arch) {
  Tuning tuning;
  for (KernelKind kind : tuned_kinds()) {
    const TuningKey key = TuningKey::of(kind, problem, arch);
    std::optional<TuningEntry> entry = store.load(key);
    const Record* winner = entry ? entry->winner() : nullptr;
    if (!winner) continue;
    // A file written by another generator version may hold a config this one cannot run.
    if (auto reason = rejection(winner->candidate, problem, arch)) {
      spdlog::warn("ignoring tuned config {} of {}: {}", winner->candidate.text(), store.path(key), *reason);
      continue;
    }
    spdlog::info("using tuned config {} for {} from {}", winner->candidate.text(), kind_name(kind), store.path(key));
    tuning = winner->candidate.apply(tuning);
  }
  return tuning;
}

}  // namespace lfce::autotune
