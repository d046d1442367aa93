#include "runtime/disk_cache.h"

#include <pwd.h>
#include <unistd.h>

#include <spdlog/spdlog.h>

#include <algorithm>
#include <cerrno>
#include <cstdlib>
#include <ctime>
#include <filesystem>
#include <limits>
#include <nlohmann/json.hpp>
#include <stdexcept>
#include <system_error>
#include <utility>

#include "compiler/errors.h"
#include "runtime/cache_files.h"
#include "runtime/options.h"
#include "runtime/sha256.h"

namespace lfce::runtime {
namespace {

namespace fs = std::filesystem;
using nlohmann::json;

constexpr int kMetadataFormat = 1;
constexpr std::size_t kMaxMetadataBytes = 1 << 20;  // a larger .json is not ours
// Temp files and payloads without metadata younger than this may belong to a write in
// progress in another process (a write takes milliseconds); older ones are leftovers.
constexpr std::int64_t kWriteGraceSeconds = 60;

bool ends_with(std::string_view text, std::string_view tail) {
  return text.size() >= tail.size() && text.substr(text.size() - tail.size()) == tail;
}

// Keys become file names: only what ptx_key and cubin_key produce may pass.
void require_key(const std::string& key) {
  const bool ok = !key.empty() && key.size() <= 128 && key.front() != '.' &&
                  std::all_of(key.begin(), key.end(), [](char c) {
                    return (c >= '0' && c <= '9') || (c >= 'a' && c <= 'z') || c == '.' || c == '-';
                  });
  if (!ok) throw std::invalid_argument("'" + key + "' is not a kernel cache key");
}

std::string payload_name(const std::string& key, EntryKind kind) {
  return key + (kind == EntryKind::Ptx ? ".ptx" : ".cubin");
}

// "+ptx85" in the arch table -> "8.5".
std::string ptx_isa_of(Arch arch) {
  const std::string features = arch_info(arch).llvm_features;
  const std::size_t at = features.find("+ptx");
  if (at == std::string::npos) return features;
  std::string digits = features.substr(at + 4);
  if (digits.size() < 2) return features;
  return digits.substr(0, digits.size() - 1) + "." + digits.back();
}

// ---- metadata ----

std::string iso_time(std::int64_t unix_seconds) {
  const std::time_t t = static_cast<std::time_t>(unix_seconds);
  std::tm utc{};
  gmtime_r(&t, &utc);
  char text[32];
  std::strftime(text, sizeof text, "%Y-%m-%dT%H:%M:%SZ", &utc);
  return text;
}

json to_json(const EntryRecord& r) {
  const auto known = [](int value) { return value < 0 ? json(nullptr) : json(value); };
  json j = {
      {"format", kMetadataFormat},
      {"key", r.key},
      {"kind", std::string(entry_kind_name(r.kind))},
      {"spec", r.spec},
      {"arch", r.arch},
      {"generator_version", r.generator_version},
      {"llvm_version", r.llvm_version},
      {"ptx_isa", r.ptx_isa},
      {"entry", r.entry},
      {"threads", r.threads},
      {"dynamic_smem_bytes", r.dynamic_smem_bytes},
      {"compile_ms", r.compile_ms},
      {"registers", known(r.registers)},
      {"local_bytes", known(r.local_bytes)},
      {"static_smem_bytes", known(r.static_smem_bytes)},
      {"created", iso_time(r.created_unix)},
      {"created_unix", r.created_unix},
      {"payload",
       {{"file", payload_name(r.key, r.kind)}, {"bytes", r.payload_bytes}, {"sha256", r.payload_sha256}}},
  };
  if (r.kind == EntryKind::Cubin) {
    j["compute_capability"] = {{"major", r.target.cc_major}, {"minor", r.target.cc_minor}};
    j["driver_version"] = r.target.driver_version;
  }
  return j;
}

// Throws json::exception for a missing field or a wrong type, std::invalid_argument otherwise.
EntryRecord record_from_json(const std::string& text) {
  const json j = json::parse(text);
  if (const int format = j.at("format").get<int>(); format != kMetadataFormat)
    throw std::invalid_argument("metadata format " + std::to_string(format) + ", expected " +
                                std::to_string(kMetadataFormat));
  const auto optional_int = [&](const char* name) {
    const json& value = j.at(name);
    return value.is_null() ? -1 : value.get<int>();
  };
  EntryRecord r;
  const std::string kind = j.at("kind").get<std::string>();
  if (kind != "ptx" && kind != "cubin") throw std::invalid_argument("unknown entry kind '" + kind + "'");
  r.kind = kind == "ptx" ? EntryKind::Ptx : EntryKind::Cubin;
  r.key = j.at("key").get<std::string>();
  r.spec = j.at("spec").get<std::string>();
  r.arch = j.at("arch").get<std::string>();
  r.generator_version = j.at("generator_version").get<std::string>();
  r.llvm_version = j.at("llvm_version").get<std::string>();
  r.ptx_isa = j.at("ptx_isa").get<std::string>();
  r.entry = j.at("entry").get<std::string>();
  r.threads = j.at("threads").get<int>();
  r.dynamic_smem_bytes = j.at("dynamic_smem_bytes").get<int>();
  r.compile_ms = j.at("compile_ms").get<double>();
  r.registers = optional_int("registers");
  r.local_bytes = optional_int("local_bytes");
  r.static_smem_bytes = optional_int("static_smem_bytes");
  r.created_unix = j.at("created_unix").get<std::int64_t>();
  r.payload_bytes = j.at("payload").at("bytes").get<std::uint64_t>();
  r.payload_sha256 = j.at("payload").at("sha256").get<std::string>();
  if (r.kind == EntryKind::Cubin) {
    r.target.cc_major = j.at("compute_capability").at("major").get<int>();
    r.target.cc_minor = j.at("compute_capability").at("minor").get<int>();
    r.target.driver_version = j.at("driver_version").get<int>();
  }
  return r;
}

// What makes `r` unusable as the entry for `key` in this build, or "" if nothing.
std::string record_problem(const EntryRecord& r, const std::string& key) {
  if (r.key != key) return "its metadata is for key " + r.key;
  if (r.generator_version != kGeneratorVersion)
    return "stale generator version '" + r.generator_version + "' (this build: " + kGeneratorVersion + ")";
  if (r.llvm_version != LFCE_LLVM_VERSION)
    return "made with LLVM " + r.llvm_version + " (this build: " LFCE_LLVM_VERSION ")";
  PtxKeyInputs inputs;
  try {
    inputs = PtxKeyInputs::current(KernelSpec::parse(r.spec));
  } catch (const SpecError& e) {
    return std::string("its spec does not parse: ") + e.what();
  }
  if (r.ptx_isa != inputs.ptx_isa) return "PTX ISA " + r.ptx_isa + " (this build: " + inputs.ptx_isa + ")";
  std::string derived = ptx_key(inputs);
  if (r.kind == EntryKind::Cubin) derived = cubin_key(derived, r.target);
  if (derived != key) return "its spec, versions and target give key " + derived + ", not its own";
  if (r.entry.empty() || r.threads <= 0 || r.dynamic_smem_bytes < 0) return "it has no valid launch shape";
  return "";
}

// One entry read from disk: the entry, or (problem, file), or neither when it is absent.
struct ReadResult {
  std::optional<Entry> entry;
  std::string file;
  std::string problem;
};

ReadResult read_entry(const std::string& kernels, const std::string& key) {
  ReadResult result;
  result.file = kernels + "/" + key + ".json";
  std::string text;
  if (const int error = read_file(result.file, text, kMaxMetadataBytes); error != 0) {
    if (error != ENOENT && error != ENOTDIR) result.problem = "cannot read it: " + error_text(error);
    return result;
  }
  Entry entry;
  try {
    entry.record = record_from_json(text);
  } catch (const std::exception& e) {  // json::exception or std::invalid_argument
    result.problem = std::string("its metadata is not valid: ") + e.what();
    return result;
  }
  if (result.problem = record_problem(entry.record, key); !result.problem.empty()) return result;

  result.file = kernels + "/" + payload_name(key, entry.record.kind);
  const std::uint64_t expected = entry.record.payload_bytes;
  if (const int error = read_file(result.file, entry.payload, expected); error != 0) {
    result.problem = error == EFBIG ? "the payload is larger than the " + std::to_string(expected) + " bytes recorded"
                                    : "cannot read the payload: " + error_text(error);
    return result;
  }
  if (entry.payload.size() != expected) {
    result.problem = "the payload has " + std::to_string(entry.payload.size()) + " bytes, the metadata records " +
                     std::to_string(expected) + " (truncated)";
    return result;
  }
  if (const std::string sha = sha256_hex(entry.payload); sha != entry.record.payload_sha256) {
    result.problem = "the payload's sha256 is " + sha + ", the metadata records " +
                     entry.record.payload_sha256 + " (corrupted)";
    return result;
  }
  result.entry = std::move(entry);
  return result;
}

// Unlinks kernels/<key>.json first (uncommits the entry), then its payloads and lock file,
// adding the bytes freed to `bytes`. False if the entry is still there (a read-only directory).
bool remove_entry_files(const std::string& kernels, const std::string& locks, const std::string& key,
                        std::uint64_t& bytes) {
  const std::string metadata = kernels + "/" + key + ".json";
  for (const std::string& path :
       {metadata, kernels + "/" + key + ".ptx", kernels + "/" + key + ".cubin", locks + "/" + key + ".lock"}) {
    const std::uint64_t size = file_size(path);
    if (unlink(path.c_str()) == 0) bytes += size;
  }
  return access(metadata.c_str(), F_OK) != 0;
}

}  // namespace

std::string default_cache_dir() {
  const Options options = Options::from_env();
  if (!options.cache_dir_env.empty()) return options.cache_dir_env;
  // The XDG spec says to ignore a relative XDG_CACHE_HOME.
  if (options.xdg_cache_home.rfind('/', 0) == 0) return options.xdg_cache_home + "/lfce";
  if (!options.home.empty()) return options.home + "/.cache/lfce";
  passwd entry{};
  passwd* found = nullptr;
  char buffer[4096];
  if (getpwuid_r(getuid(), &entry, buffer, sizeof buffer, &found) == 0 && found && found->pw_dir)
    return std::string(found->pw_dir) + "/.cache/lfce";
  return "";  // DiskCache keeps everything in memory then
}

std::string_view entry_kind_name(EntryKind kind) { return kind == EntryKind::Ptx ? "ptx" : "cubin"; }

PtxKeyInputs PtxKeyInputs::current(const KernelSpec& spec) {
  return PtxKeyInputs{kGeneratorVersion, LFCE_LLVM_VERSION, ptx_isa_of(spec.arch), spec.text()};
}

std::string ptx_key(const PtxKeyInputs& inputs) {
  // Each field length-prefixed, so that no two different input lists hash the same text.
  Sha256 hash;
  hash.update("lfce-kernel-key\n");
  for (const std::string* field : {&inputs.generator_version, &inputs.llvm_version, &inputs.ptx_isa, &inputs.spec}) {
    hash.update(std::to_string(field->size()) + ":");
    hash.update(*field);
    hash.update("\n");
  }
  return hash.hex_digest();
}

std::string ptx_key(const KernelSpec& spec) { return ptx_key(PtxKeyInputs::current(spec)); }

std::string cubin_key(const std::string& ptx_key, const CubinTarget& target) {
  return ptx_key + ".sm" + std::to_string(target.cc_major) + std::to_string(target.cc_minor) + "-drv" +
         std::to_string(target.driver_version);
}

DiskCache::DiskCache(std::string dir)
    : dir_(std::move(dir)), kernels_(dir_ + "/kernels"), locks_(dir_ + "/locks") {
  if (dir_.empty()) {
    fall_back_to_memory("no cache directory: set LFCE_CACHE_DIR or HOME");
    return;
  }
  std::error_code ec;
  fs::create_directories(kernels_, ec);
  if (!ec) fs::create_directories(locks_, ec);
  // A directory that exists but is read-only passes here; its first write falls back.
  if (ec) fall_back_to_memory("cannot create " + kernels_ + ": " + ec.message());
}

bool DiskCache::persistent() const {
  std::lock_guard<std::mutex> lock(mutex_);
  return persistent_;
}

void DiskCache::fall_back_to_memory(const std::string& reason) {
  std::lock_guard<std::mutex> lock(mutex_);
  if (!persistent_) return;
  persistent_ = false;
  spdlog::warn(
      "kernel cache directory '{}' cannot be written ({}); kernels compiled from now on are cached in "
      "memory for this process only",
      dir_, reason);
}

std::optional<Entry> DiskCache::load_from_disk(const std::string& key, bool warn) const {
  {
    std::lock_guard<std::mutex> lock(mutex_);
    if (auto it = memory_.find(key); it != memory_.end()) return it->second;
  }
  if (dir_.empty()) return std::nullopt;
  ReadResult read = read_entry(kernels_, key);
  if (!read.problem.empty()) {
    // Logged once per process per entry in practice: the regenerated entry replaces it.
    if (warn) {
      spdlog::warn("kernel cache: ignoring {}: {}; the kernel will be compiled again", read.file, read.problem);
    } else {
      spdlog::debug("kernel cache: ignoring {}: {}", read.file, read.problem);
    }
  }
  return std::move(read.entry);
}

std::optional<Entry> DiskCache::load(const std::string& key) {
  require_key(key);
  return load_from_disk(key, /*warn=*/true);
}

bool DiskCache::write_entry(const Entry& entry, std::string& error) const {
  std::error_code ec;
  fs::create_directories(kernels_, ec);  // again, in case the directory was removed meanwhile
  const std::string& key = entry.record.key;
  // Payload first, metadata last: the metadata is the commit record.
  const bool ok = write_atomically(kernels_, payload_name(key, entry.record.kind), entry.payload, error) &&
                  write_atomically(kernels_, key + ".json", to_json(entry.record).dump(2) + "\n", error);
  if (ok) sync_directory(kernels_);
  return ok;
}

void DiskCache::store(Entry entry) {
  require_key(entry.record.key);
  seal(entry.record, entry.payload);
  persist(std::move(entry));
}

void DiskCache::seal(EntryRecord& r, const std::string& payload) {
  r.created_unix = static_cast<std::int64_t>(std::time(nullptr));
  r.payload_bytes = payload.size();
  r.payload_sha256 = sha256_hex(payload);
}

void DiskCache::persist(Entry entry) {
  const EntryRecord& r = entry.record;
  if (persistent()) {
    std::string error;
    if (write_entry(entry, error)) {
      std::lock_guard<std::mutex> lock(mutex_);
      memory_.erase(r.key);
      return;
    }
    fall_back_to_memory(error);
  }
  std::lock_guard<std::mutex> lock(mutex_);
  memory_[r.key] = std::move(entry);
}

DiskCache::Lookup DiskCache::get_or_create(const std::string& key, const std::function<Entry()>& produce) {
  require_key(key);
  if (auto entry = load_from_disk(key, /*warn=*/true)) return {std::move(*entry), true};
  std::optional<FileLock> lock;
  if (persistent()) lock.emplace(locks_ + "/" + key + ".lock");
  // Another process may have produced it while we waited for the lock.
  if (auto entry = load_from_disk(key, /*warn=*/false)) return {std::move(*entry), true};
  Entry entry = produce();
  if (entry.record.key != key)
    throw InternalError("kernel cache: producer for key " + key + " made an entry for " + entry.record.key);
  seal(entry.record, entry.payload);
  persist(entry);
  return {std::move(entry), false};
}

void DiskCache::remove(const std::string& key) {
  require_key(key);
  {
    std::lock_guard<std::mutex> lock(mutex_);
    memory_.erase(key);
  }
  std::uint64_t bytes = 0;
  if (!dir_.empty()) remove_entry_files(kernels_, locks_, key, bytes);
}

std::vector<EntryRecord> DiskCache::list() const {
  std::vector<EntryRecord> records;
  for (const std::string& name : file_names(kernels_)) {
    if (name.rfind(kTempPrefix, 0) == 0 || !ends_with(name, ".json")) continue;
    std::string text;
    if (read_file(kernels_ + "/" + name, text, kMaxMetadataBytes) != 0) continue;
    try {
      records.push_back(record_from_json(text));
    } catch (const std::exception&) {  // verify() reports it
    }
  }
  std::stable_sort(records.begin(), records.end(),
                   [](const EntryRecord& a, const EntryRecord& b) { return a.created_unix < b.created_unix; });
  return records;
}

std::string DiskCache::info(const std::string& key_or_prefix) const {
  std::vector<std::string> matches;
  for (const std::string& name : file_names(kernels_)) {
    if (name.rfind(kTempPrefix, 0) == 0 || !ends_with(name, ".json")) continue;
    const std::string key = name.substr(0, name.size() - 5);
    if (key == key_or_prefix) {
      matches = {key};  // an exact key wins over longer keys it prefixes (a PTX key its cubins')
      break;
    }
    if (!key_or_prefix.empty() && key.rfind(key_or_prefix, 0) == 0) matches.push_back(key);
  }
  if (matches.empty()) throw std::invalid_argument("no kernel cache entry '" + key_or_prefix + "' in " + kernels_);
  if (matches.size() > 1) {
    std::string list;
    for (const std::string& key : matches) list += "\n  " + key;
    throw std::invalid_argument("kernel cache key prefix '" + key_or_prefix + "' matches " +
                                std::to_string(matches.size()) + " entries:" + list);
  }
  std::string text;
  const std::string path = kernels_ + "/" + matches.front() + ".json";
  if (const int error = read_file(path, text, kMaxMetadataBytes); error != 0)
    throw std::runtime_error("cannot read " + path + ": " + error_text(error));
  return text;
}

VerifyReport DiskCache::verify(bool remove_bad) {
  VerifyReport report;
  const std::int64_t settled = static_cast<std::int64_t>(std::time(nullptr)) - kWriteGraceSeconds;
  const std::vector<std::string> names = file_names(kernels_);
  const auto has = [&](const std::string& name) { return std::binary_search(names.begin(), names.end(), name); };
  for (const std::string& name : names) {
    const std::string path = kernels_ + "/" + name;
    BadEntry bad;
    if (name.rfind(kTempPrefix, 0) == 0) {
      if (file_mtime(path) >= settled) continue;  // a write in progress
      bad = {"", path, "temp file of an interrupted write", false};
      if (remove_bad) bad.removed = unlink(path.c_str()) == 0;
    } else if (ends_with(name, ".json")) {
      const std::string key = name.substr(0, name.size() - 5);
      ++report.checked;
      ReadResult read = read_entry(kernels_, key);
      if (read.problem.empty()) continue;
      bad = {key, read.file, read.problem, false};
      std::uint64_t bytes = 0;
      if (remove_bad) bad.removed = remove_entry_files(kernels_, locks_, key, bytes);
    } else {
      const std::size_t dot = name.rfind('.');
      const std::string key = name.substr(0, dot);
      if (dot == std::string::npos || has(key + ".json") || file_mtime(path) >= settled) continue;
      bad = {key, path, "payload without metadata (an interrupted write)", false};
      if (remove_bad) bad.removed = unlink(path.c_str()) == 0;
    }
    report.bad.push_back(std::move(bad));
  }
  return report;
}

ClearReport DiskCache::clear(std::optional<double> older_than_days) {
  ClearReport report;
  const std::int64_t now = static_cast<std::int64_t>(std::time(nullptr));
  const std::int64_t settled = now - kWriteGraceSeconds;
  const double cutoff = older_than_days ? static_cast<double>(now) - *older_than_days * 86400.0
                                        : std::numeric_limits<double>::infinity();
  const std::vector<std::string> names = file_names(kernels_);
  const auto has = [&](const std::string& name) { return std::binary_search(names.begin(), names.end(), name); };
  for (const std::string& name : names) {
    const std::string path = kernels_ + "/" + name;
    if (ends_with(name, ".json") && name.rfind(kTempPrefix, 0) != 0) {
      const std::string key = name.substr(0, name.size() - 5);
      std::string text;
      std::int64_t created = file_mtime(path);
      try {
        if (read_file(path, text, kMaxMetadataBytes) == 0) created = record_from_json(text).created_unix;
      } catch (const std::exception&) {  // unreadable metadata: judged by the file's age
      }
      if (static_cast<double>(created) >= cutoff) continue;
      if (remove_entry_files(kernels_, locks_, key, report.bytes)) ++report.removed;
      continue;
    }
    // Temp files and payloads without metadata: leftovers once past the grace period.
    const std::size_t dot = name.rfind('.');
    const bool orphan =
        name.rfind(kTempPrefix, 0) == 0 || dot == std::string::npos || !has(name.substr(0, dot) + ".json");
    const std::int64_t mtime = file_mtime(path);
    if (!orphan || mtime >= settled || static_cast<double>(mtime) >= cutoff) continue;
    const std::uint64_t size = file_size(path);
    if (unlink(path.c_str()) == 0) report.bytes += size, ++report.removed;
  }
  if (!older_than_days) {
    std::lock_guard<std::mutex> lock(mutex_);
    memory_.clear();
  }
  return report;
}

}  // namespace lfce::runtime
