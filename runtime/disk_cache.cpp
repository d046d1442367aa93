#include "runtime/disk_cache.h"

#include <pwd.h>
#include <sys/stat.h>
#include <unistd.h>

#include <spdlog/spdlog.h>

#include <algorithm>
#include <cerrno>
#include <cmath>
#include <cstdlib>
#include <ctime>
#include <limits>
#include <nlohmann/json.hpp>
#include <set>
#include <stdexcept>
#include <utility>

#include "compiler/errors.h"
#include "runtime/cache_files.h"
#include "runtime/options.h"
#include "runtime/sha256.h"

namespace lfce::runtime {
namespace {

using nlohmann::json;

// 2: metadata_sha256, and every number range-checked.
constexpr int kMetadataFormat = 2;
constexpr std::size_t kMaxMetadataBytes = 1 << 20;  // a larger .json is not ours
// Far above any kernel's PTX or cubin (hundreds of KB); a larger payload is not read.
constexpr std::uint64_t kMaxPayloadBytes = std::uint64_t{256} << 20;
// 9999-12-31T23:59:59Z: later times do not fit the calendar functions.
constexpr std::int64_t kLatestTime = 253402300799;
// Temp files and payloads without metadata younger than this may belong to a write in
// progress in another process (a write takes milliseconds); older ones are leftovers.
constexpr std::int64_t kWriteGraceSeconds = 60;

bool ends_with(std::string_view text, std::string_view tail) {
  return text.size() >= tail.size() && text.substr(text.size() - tail.size()) == tail;
}

bool all_of(std::string_view text, bool (*pred)(char)) {
  return !text.empty() && std::all_of(text.begin(), text.end(), pred);
}
bool is_digit(char c) { return c >= '0' && c <= '9'; }
bool is_hex(char c) { return is_digit(c) || (c >= 'a' && c <= 'f'); }
bool is_alnum(char c) { return is_digit(c) || (c >= 'a' && c <= 'z') || (c >= 'A' && c <= 'Z'); }

bool is_ptx_key(std::string_view text) { return text.size() == 64 && all_of(text, is_hex); }

// "<ptx key>.sm<digits>-drv<digits>", as cubin_key writes it.
bool is_cubin_key(std::string_view text) {
  if (text.size() <= 64 || !is_ptx_key(text.substr(0, 64))) return false;
  std::string_view target = text.substr(64);
  if (target.substr(0, 3) != ".sm") return false;
  target.remove_prefix(3);
  const std::size_t drv = target.find("-drv");
  return drv != std::string_view::npos && all_of(target.substr(0, drv), is_digit) &&
         all_of(target.substr(drv + 4), is_digit);
}

// Keys become file names: only what ptx_key and cubin_key produce may pass.
void require_key(const std::string& key) {
  if (!is_cache_key(key)) throw std::invalid_argument("'" + key + "' is not a kernel cache key");
}

std::string payload_name(const std::string& key, EntryKind kind) {
  return key + (kind == EntryKind::Ptx ? ".ptx" : ".cubin");
}
std::string payload_name(const std::string& key) {
  return payload_name(key, is_ptx_key(key) ? EntryKind::Ptx : EntryKind::Cubin);
}

// The files of the cache, by name: anything else in its folders is the user's.
enum class FileRole { Metadata, Payload, Temp };
struct CacheFile {
  FileRole role;
  std::string key;
};

std::optional<CacheFile> parse_entry_file(std::string_view name) {
  if (ends_with(name, ".json") && is_cache_key(name.substr(0, name.size() - 5)))
    return CacheFile{FileRole::Metadata, std::string(name.substr(0, name.size() - 5))};
  if (ends_with(name, ".ptx") && is_ptx_key(name.substr(0, name.size() - 4)))
    return CacheFile{FileRole::Payload, std::string(name.substr(0, name.size() - 4))};
  if (ends_with(name, ".cubin") && is_cubin_key(name.substr(0, name.size() - 6)))
    return CacheFile{FileRole::Payload, std::string(name.substr(0, name.size() - 6))};
  return std::nullopt;
}

// "<temp prefix><metadata or payload name>-XXXXXX", as write_atomically_at names its files.
std::optional<CacheFile> parse_cache_file(std::string_view name) {
  const std::string_view prefix = kTempPrefix;
  if (name.substr(0, prefix.size()) != prefix) return parse_entry_file(name);
  if (name.size() < prefix.size() + 7 || name[name.size() - 7] != '-' || !all_of(name.substr(name.size() - 6), is_alnum))
    return std::nullopt;
  std::optional<CacheFile> inner = parse_entry_file(name.substr(prefix.size(), name.size() - prefix.size() - 7));
  if (inner) inner->role = FileRole::Temp;
  return inner;
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
  char text[32] = "?";
  if (gmtime_r(&t, &utc)) std::strftime(text, sizeof text, "%Y-%m-%dT%H:%M:%SZ", &utc);
  return text;
}

// sha256 of the metadata but its own checksum and the creation time, in nlohmann's canonical
// form (sorted keys, shortest round-trip numbers): rewriting the file with another layout
// keeps it, changing any value does not.
std::string metadata_digest(json j) {
  for (const char* field : {"metadata_sha256", "created", "created_unix"}) j.erase(field);
  return sha256_hex(j.dump());
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
  j["metadata_sha256"] = metadata_digest(j);
  return j;
}

// j[name] as an integer in [lo, hi]; a float, a string or a value out of range is refused
// (converting 1e300 to an integer is undefined behaviour).
std::int64_t integer(const json& j, const char* name, std::int64_t lo, std::int64_t hi,
                     const char* label = nullptr) {
  const json& value = j.at(name);
  bool in_range = false;
  std::int64_t result = 0;
  if (value.is_number_unsigned()) {
    const std::uint64_t u = value.get<std::uint64_t>();
    in_range = u <= static_cast<std::uint64_t>(hi) && static_cast<std::int64_t>(u) >= lo;
    result = static_cast<std::int64_t>(u);
  } else if (value.is_number_integer()) {
    result = value.get<std::int64_t>();
    in_range = result >= lo && result <= hi;
  }
  if (!in_range)
    throw std::invalid_argument(std::string(label ? label : name) + " is " + value.dump() + ", not an integer in [" +
                                std::to_string(lo) + ", " + std::to_string(hi) + "]");
  return result;
}

int small_integer(const json& j, const char* name, int hi) { return static_cast<int>(integer(j, name, 0, hi)); }

// The same for a field that may be null (unknown): -1 then.
int optional_integer(const json& j, const char* name, int hi) {
  return j.at(name).is_null() ? -1 : small_integer(j, name, hi);
}

struct Metadata {
  EntryRecord record;
  bool checksum_matches = false;
};

// Throws json::exception for a missing field or a wrong type, std::invalid_argument otherwise.
Metadata record_from_json(const std::string& text) {
  const json j = json::parse(text);
  if (const std::int64_t format = integer(j, "format", 0, 1 << 20); format != kMetadataFormat)
    throw std::invalid_argument("metadata format " + std::to_string(format) + ", expected " +
                                std::to_string(kMetadataFormat));
  constexpr int kInt = std::numeric_limits<int>::max();
  Metadata m;
  EntryRecord& r = m.record;
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
  r.threads = static_cast<int>(integer(j, "threads", 1, 1024));
  r.dynamic_smem_bytes = small_integer(j, "dynamic_smem_bytes", kInt);
  r.compile_ms = j.at("compile_ms").get<double>();
  if (!std::isfinite(r.compile_ms) || r.compile_ms < 0)
    throw std::invalid_argument("compile_ms is " + j.at("compile_ms").dump());
  r.registers = optional_integer(j, "registers", kInt);
  r.local_bytes = optional_integer(j, "local_bytes", kInt);
  r.static_smem_bytes = optional_integer(j, "static_smem_bytes", kInt);
  r.created_unix = integer(j, "created_unix", 0, kLatestTime);
  r.payload_bytes = static_cast<std::uint64_t>(
      integer(j.at("payload"), "bytes", 0, static_cast<std::int64_t>(kMaxPayloadBytes), "payload.bytes"));
  r.payload_sha256 = j.at("payload").at("sha256").get<std::string>();
  if (r.kind == EntryKind::Cubin) {
    r.target.cc_major = small_integer(j.at("compute_capability"), "major", kInt);
    r.target.cc_minor = small_integer(j.at("compute_capability"), "minor", kInt);
    r.target.driver_version = small_integer(j, "driver_version", kInt);
  }
  m.checksum_matches = j.contains("metadata_sha256") && j.at("metadata_sha256").is_string() &&
                       j.at("metadata_sha256").get<std::string>() == metadata_digest(j);
  return m;
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
  if (r.entry.empty()) return "it has no entry name";
  return "";
}

// One entry read from disk: the entry, or (problem, file), or neither when it is absent.
struct ReadResult {
  std::optional<Entry> entry;
  std::string file;
  std::string problem;
};

ReadResult read_entry(const DirFd& kernels, const std::string& kernels_path, const std::string& key) {
  ReadResult result;
  result.file = kernels_path + "/" + key + ".json";
  std::string text;
  if (const int error = read_file_at(kernels, key + ".json", text, kMaxMetadataBytes); error != 0) {
    if (error != ENOENT) result.problem = "cannot read it: " + error_text(error);
    return result;
  }
  Entry entry;
  try {
    Metadata metadata = record_from_json(text);
    entry.record = std::move(metadata.record);
    if (result.problem = record_problem(entry.record, key); !result.problem.empty()) return result;
    if (!metadata.checksum_matches) {
      result.problem = "its metadata checksum does not match (edited or corrupted)";
      return result;
    }
  } catch (const std::exception& e) {  // json::exception or std::invalid_argument
    result.problem = std::string("its metadata is not valid: ") + e.what();
    return result;
  }

  const std::string payload = payload_name(key, entry.record.kind);
  result.file = kernels_path + "/" + payload;
  const std::uint64_t expected = entry.record.payload_bytes;
  if (const int error = read_file_at(kernels, payload, entry.payload, expected); error != 0) {
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

}  // namespace

// One folder of the cache opened for one operation, or why it could not be.
struct DiskCache::Folder {
  DirFd fd;
  std::string path;     // the folder's, or the one that failed
  int error = 0;        // errno; ELOOP: a symbolic link
  std::string problem;  // what is wrong with `path`, when error != 0
};

namespace {

// Unlinks kernels/<key>.json first (uncommits the entry), then its payload and lock file,
// adding the bytes freed to `bytes`. Returns "cannot remove <path>: <reason>" for each file
// that stays; an absent file is not a failure. While the metadata stays, so does the rest: a
// committed entry is never left without its payload.
std::vector<std::string> remove_entry_files(const DirFd& kernels, const std::string& kernels_path,
                                            const DirFd& locks, const std::string& locks_path,
                                            const std::string& key, std::uint64_t& bytes) {
  std::vector<std::string> failures;
  const auto remove = [&](const DirFd& dir, const std::string& dir_path, const std::string& name) {
    if (!dir) return;
    if (const int error = remove_regular_file_at(dir, name, bytes); error != 0 && error != ENOENT)
      failures.push_back("cannot remove " + dir_path + "/" + name + ": " + error_text(error));
  };
  remove(kernels, kernels_path, key + ".json");
  if (!failures.empty()) return failures;
  remove(kernels, kernels_path, payload_name(key));
  remove(locks, locks_path, key + ".lock");
  return failures;
}

std::string join(const std::vector<std::string>& lines) {
  std::string text;
  for (const std::string& line : lines) text += (text.empty() ? "" : "; ") + line;
  return text;
}

}  // namespace

bool is_cache_key(std::string_view text) { return is_ptx_key(text) || is_cubin_key(text); }

std::string not_removed_message(const std::vector<std::string>& failures) {
  constexpr std::size_t kShown = 10;
  std::string text = "could not remove " + std::to_string(failures.size()) + " file(s) of the kernel cache:";
  for (std::size_t i = 0; i < failures.size() && i < kShown; ++i) text += "\n  " + failures[i];
  if (failures.size() > kShown) text += "\n  and " + std::to_string(failures.size() - kShown) + " more";
  return text;
}

CacheLocation default_cache_location() { return default_cache_location(Options::current()); }

CacheLocation default_cache_location(const Options& options) {
  if (!options.cache_dir_env.empty()) return {options.cache_dir_env, true};
  // The XDG spec says to ignore a relative XDG_CACHE_HOME.
  if (options.xdg_cache_home.rfind('/', 0) == 0) return {options.xdg_cache_home + "/lfce", false};
  if (!options.home.empty()) return {options.home + "/.cache/lfce", false};
  passwd entry{};
  passwd* found = nullptr;
  char buffer[4096];
  if (getpwuid_r(getuid(), &entry, buffer, sizeof buffer, &found) == 0 && found && found->pw_dir)
    return {std::string(found->pw_dir) + "/.cache/lfce", false};
  return {"", false};  // DiskCache keeps everything in memory then
}

std::string default_cache_dir() { return default_cache_location().dir; }

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

DiskCache::DiskCache(std::string dir, bool named_by_user)
    : dir_(std::move(dir)), named_by_user_(named_by_user), kernels_(dir_ + "/kernels"), locks_(dir_ + "/locks") {
  if (dir_.empty()) {
    fall_back_to_memory("", "no cache directory: set LFCE_CACHE_DIR or HOME");
    return;
  }
  for (const char* name : {"kernels", "locks"}) {
    // A directory that exists but is read-only passes here; its first write falls back.
    if (const Folder folder = open_folder(name, /*create=*/true); folder.error != 0) {
      fall_back_to_memory(folder.path, folder.problem);
      return;
    }
  }
}

DiskCache::Folder DiskCache::open_folder(const std::string& name, bool create) const {
  Folder folder;
  DirFd root;
  folder.path = dir_;
  if (dir_.empty()) {
    folder.error = ENOENT;
  } else if ((folder.error = open_directory(dir_, named_by_user_, create, root)) == 0) {
    folder.path = dir_ + "/" + name;
    folder.error = open_subdirectory(root, name, create, folder.fd);
  }
  if (folder.error == ELOOP && folder.path == dir_) {
    folder.problem = "it is a symbolic link, followed only where the user names the directory: set LFCE_CACHE_DIR "
                     "or --cache-dir to it to use it";
  } else if (folder.error == ELOOP) {
    folder.problem = "it is a symbolic link, which lfce does not follow inside its cache";
  } else if (folder.error != 0) {
    folder.problem = error_text(folder.error);
  }
  return folder;
}

DiskCache::Folder DiskCache::open_folder_or_throw(const std::string& name) const {
  Folder folder = open_folder(name, /*create=*/false);
  if (folder.error != 0 && folder.error != ENOENT)
    throw CacheError("kernel cache: cannot use '" + folder.path + "': " + folder.problem);
  return folder;
}

bool DiskCache::persistent() const {
  std::lock_guard<std::mutex> lock(mutex_);
  return persistent_;
}

void DiskCache::fall_back_to_memory(const std::string& path, const std::string& reason) {
  std::lock_guard<std::mutex> lock(mutex_);
  if (!persistent_) return;
  persistent_ = false;
  spdlog::warn(
      "kernel cache directory '{}' cannot be written ({}); kernels compiled from now on are cached in memory for "
      "this process only",
      path.empty() ? dir_ : path, reason);
}

std::optional<Entry> DiskCache::load_from_disk(const std::string& key, bool warn) const {
  {
    std::lock_guard<std::mutex> lock(mutex_);
    if (auto it = memory_.find(key); it != memory_.end()) return it->second;
  }
  const Folder kernels = open_folder("kernels", /*create=*/false);
  if (kernels.error != 0) return std::nullopt;  // absent, or refused (said when the cache was opened)
  ReadResult read = read_entry(kernels.fd, kernels.path, key);
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
  const std::string key = entry.record.key;
  if (persistent()) {
    // Created again, in case the folder was removed meanwhile.
    const Folder kernels = open_folder("kernels", /*create=*/true);
    if (kernels.error != 0) {
      fall_back_to_memory(kernels.path, kernels.problem);
    } else {
      // Payload first, metadata last: the metadata is the commit record.
      WriteResult written = write_atomically_at(kernels.fd, kernels.path, payload_name(key, entry.record.kind),
                                                entry.payload);
      if (written.ok) written = write_atomically_at(kernels.fd, kernels.path, key + ".json",
                                                    to_json(entry.record).dump(2) + "\n");
      if (written.ok) {
        sync_directory(kernels.fd);
        std::lock_guard<std::mutex> lock(mutex_);
        memory_.erase(key);
        return;
      }
      if (written.target) {
        // Something else has this entry's name: only this entry stays in memory.
        spdlog::warn("kernel cache: {}; kernel {} is cached in memory for this process only", written.error, key);
      } else {
        fall_back_to_memory(kernels.path, written.error);
      }
    }
  }
  std::lock_guard<std::mutex> lock(mutex_);
  memory_[key] = std::move(entry);
}

DiskCache::Lookup DiskCache::get_or_create(const std::string& key, const std::function<Entry()>& produce) {
  require_key(key);
  if (auto entry = load_from_disk(key, /*warn=*/true)) return {std::move(*entry), true};
  std::optional<FileLock> lock;
  if (persistent()) {
    if (const Folder locks = open_folder("locks", /*create=*/true); locks.error == 0) lock.emplace(locks.fd, key + ".lock");
  }
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
  const Folder kernels = open_folder("kernels", false), locks = open_folder("locks", false);
  std::uint64_t bytes = 0;
  remove_entry_files(kernels.fd, kernels.path, locks.fd, locks.path, key, bytes);
}

std::vector<EntryRecord> DiskCache::list() const {
  std::vector<EntryRecord> records;
  const Folder kernels = open_folder_or_throw("kernels");
  for (const DirEntry& file : list_directory(kernels.fd)) {
    const std::optional<CacheFile> parsed = parse_cache_file(file.name);
    if (!parsed || parsed->role != FileRole::Metadata) continue;
    std::string text;
    if (read_file_at(kernels.fd, file.name, text, kMaxMetadataBytes) != 0) continue;
    try {
      records.push_back(record_from_json(text).record);
    } catch (const std::exception&) {  // verify() reports it
    }
  }
  std::stable_sort(records.begin(), records.end(),
                   [](const EntryRecord& a, const EntryRecord& b) { return a.created_unix < b.created_unix; });
  return records;
}

std::string DiskCache::info(const std::string& key_or_prefix) const {
  const Folder kernels = open_folder_or_throw("kernels");
  std::vector<std::string> matches;
  for (const DirEntry& file : list_directory(kernels.fd)) {
    const std::optional<CacheFile> parsed = parse_cache_file(file.name);
    if (!parsed || parsed->role != FileRole::Metadata) continue;
    const std::string& key = parsed->key;
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
  const std::string name = matches.front() + ".json";
  if (const int error = read_file_at(kernels.fd, name, text, kMaxMetadataBytes); error != 0)
    throw CacheError("cannot read " + kernels_ + "/" + name + ": " + error_text(error));
  return text;
}

VerifyReport DiskCache::verify(bool remove_bad) {
  VerifyReport report;
  const std::int64_t settled = static_cast<std::int64_t>(std::time(nullptr)) - kWriteGraceSeconds;
  const Folder kernels = open_folder_or_throw("kernels");
  const Folder locks = remove_bad ? open_folder_or_throw("locks") : Folder{};
  const std::vector<DirEntry> files = list_directory(kernels.fd);
  std::set<std::string> names;
  for (const DirEntry& file : files) names.insert(file.name);
  const auto remove_file = [&](BadEntry& bad, const std::string& name) {
    std::uint64_t bytes = 0;
    if (const int error = remove_regular_file_at(kernels.fd, name, bytes); error != 0 && error != ENOENT)
      bad.not_removed = "cannot remove " + kernels.path + "/" + name + ": " + error_text(error);
  };
  for (const DirEntry& file : files) {
    const std::optional<CacheFile> parsed = parse_cache_file(file.name);
    if (!parsed) continue;  // not the cache's
    const std::string path = kernels.path + "/" + file.name;
    BadEntry bad;
    bad.key = parsed->key;
    if (parsed->role == FileRole::Temp) {
      if (file.mtime >= settled) continue;  // a write in progress
      bad.file = path, bad.problem = "temp file of an interrupted write";
      if (remove_bad) remove_file(bad, file.name);
    } else if (parsed->role == FileRole::Metadata) {
      ++report.checked;
      ReadResult read;
      try {
        read = read_entry(kernels.fd, kernels.path, parsed->key);
      } catch (const std::exception& e) {  // e.g. out of memory: this entry is bad, not the run
        read.file = path, read.problem = e.what();
      }
      if (read.problem.empty()) continue;
      bad.file = read.file, bad.problem = read.problem;
      if (remove_bad) {
        std::uint64_t bytes = 0;
        bad.not_removed = join(remove_entry_files(kernels.fd, kernels.path, locks.fd, locks.path, parsed->key, bytes));
      }
    } else {
      if (names.count(parsed->key + ".json") || file.mtime >= settled) continue;
      bad.file = path, bad.problem = "payload without metadata (an interrupted write)";
      if (remove_bad) remove_file(bad, file.name);
    }
    bad.removed = remove_bad && bad.not_removed.empty();
    report.bad.push_back(std::move(bad));
  }
  return report;
}

ClearReport DiskCache::clear(std::optional<double> older_than_days) {
  if (older_than_days && !(std::isfinite(*older_than_days) && *older_than_days >= 0))
    throw std::invalid_argument(fmt::format("older_than_days must be a finite number >= 0, got {}", *older_than_days));
  ClearReport report;
  const std::int64_t now = static_cast<std::int64_t>(std::time(nullptr));
  const std::int64_t settled = now - kWriteGraceSeconds;
  const double cutoff = older_than_days ? static_cast<double>(now) - *older_than_days * 86400.0
                                        : std::numeric_limits<double>::infinity();
  const Folder kernels = open_folder_or_throw("kernels");
  const Folder locks = open_folder_or_throw("locks");
  const std::vector<DirEntry> files = list_directory(kernels.fd);
  std::set<std::string> names;
  for (const DirEntry& file : files) names.insert(file.name);
  for (const DirEntry& file : files) {
    const std::optional<CacheFile> parsed = parse_cache_file(file.name);
    if (!parsed) continue;  // not the cache's
    if (parsed->role == FileRole::Metadata) {
      std::int64_t created = file.mtime;
      std::string text;
      try {
        if (read_file_at(kernels.fd, file.name, text, kMaxMetadataBytes) == 0)
          created = record_from_json(text).record.created_unix;
      } catch (const std::exception&) {  // unreadable metadata: judged by the file's age
      }
      if (static_cast<double>(created) >= cutoff) continue;
      const std::vector<std::string> failures =
          remove_entry_files(kernels.fd, kernels.path, locks.fd, locks.path, parsed->key, report.bytes);
      if (failures.empty()) ++report.removed;
      report.failures.insert(report.failures.end(), failures.begin(), failures.end());
      continue;
    }
    // Temp files and payloads without metadata: leftovers once past the grace period.
    const bool orphan = parsed->role == FileRole::Temp || !names.count(parsed->key + ".json");
    if (!orphan || file.mtime >= settled || static_cast<double>(file.mtime) >= cutoff) continue;
    if (const int error = remove_regular_file_at(kernels.fd, file.name, report.bytes); error == 0) {
      ++report.removed;
    } else if (error != ENOENT) {
      report.failures.push_back("cannot remove " + kernels.path + "/" + file.name + ": " + error_text(error));
    }
  }
  if (!older_than_days) {
    std::lock_guard<std::mutex> lock(mutex_);
    memory_.clear();
  }
  return report;
}

}  // namespace lfce::runtime
