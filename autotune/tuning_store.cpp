#include "autotune/tuning_store.h"

#include <filesystem>
#include <nlohmann/json.hpp>
#include <stdexcept>

#include "runtime/cache_files.h"

namespace lfce::autotune {
namespace {

namespace fs = std::filesystem;
// Ordered: the file reads key, winner, then the candidates, as written.
using json = nlohmann::ordered_json;

json record_json(const runtime::Record& r) {
  json j = {{"config", r.candidate.text()}};
  j["ms"] = r.result.ok() ? json(r.result.ms) : json(nullptr);  // JSON has no infinity
  if (!r.result.error.empty()) j["error"] = r.result.error;
  if (r.result.verify_error >= 0) j["verify_error"] = r.result.verify_error;
  return j;
}

json entry_json(const runtime::TuningEntry& e) {
  json j = {{"format", runtime::kTuningFormat},
            {"key", runtime::key_json(e.key)},
            {"tokens", e.tokens},
            {"device", e.device},
            {"default", e.default_config.text()},
            {"measured_with", e.measured_with}};
  if (const runtime::Record* w = e.winner()) {
    j["winner"] = {{"config", w->candidate.text()}, {"ms", w->result.ms}};
    if (auto s = e.speedup()) j["winner"]["speedup_vs_default"] = *s;
  } else {
    j["winner"] = nullptr;
  }
  j["candidates"] = json::array();
  for (const runtime::Record& r : e.records) j["candidates"].push_back(record_json(r));
  return j;
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

void TuningStore::save(const runtime::TuningEntry& entry) const {
  if (dir().empty()) throw std::runtime_error("tuning store: no cache directory (set LFCE_CACHE_DIR)");
  write_entry(path(entry.key), entry_json(entry).dump(2) + "\n");
}

}  // namespace lfce::autotune
