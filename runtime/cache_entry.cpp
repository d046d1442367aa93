#include "runtime/cache_entry.h"

#include <algorithm>
#include <cerrno>
#include <cmath>
#include <ctime>
#include <limits>
#include <nlohmann/json.hpp>
#include <stdexcept>
#include <utility>

#include "compiler/errors.h"
#include "runtime/sha256.h"
#include "templates/templates.h"

namespace lfce::runtime {
namespace {

using nlohmann::json;

// 2: metadata_sha256, and every number range-checked. 3: the kernel's parameters (an entry
// without them reads as invalid: rebuilt).
constexpr int kMetadataFormat = 3;
// Far above any kernel's PTX or cubin (hundreds of KB); a larger payload is not read.
constexpr std::uint64_t kMaxPayloadBytes = std::uint64_t{256} << 20;
// 9999-12-31T23:59:59Z: later times do not fit the calendar functions.
constexpr std::int64_t kLatestTime = 253402300799;

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

std::optional<CacheFile> parse_entry_file(std::string_view name) {
  if (ends_with(name, ".json") && is_cache_key(name.substr(0, name.size() - 5)))
    return CacheFile{FileRole::Metadata, std::string(name.substr(0, name.size() - 5))};
  if (ends_with(name, ".ptx") && is_ptx_key(name.substr(0, name.size() - 4)))
    return CacheFile{FileRole::Payload, std::string(name.substr(0, name.size() - 4))};
  if (ends_with(name, ".cubin") && is_cubin_key(name.substr(0, name.size() - 6)))
    return CacheFile{FileRole::Payload, std::string(name.substr(0, name.size() - 6))};
  return std::nullopt;
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

json params_json(const KernelSignature& params) {
  json list = json::array();
  for (const KernelParam& p : params) list.push_back({{"name", p.name}, {"type", param_type_name(p.type)}});
  return list;
}

KernelSignature params_from_json(const json& list) {
  if (!list.is_array()) throw std::invalid_argument("params is " + list.dump() + ", not a list");
  KernelSignature params;
  for (const json& p : list) {
    const std::string name = p.at("name").get<std::string>();
    const std::string type = p.at("type").get<std::string>();
    const std::optional<ParamType> parsed = parse_param_type(type);
    if (name.empty() || !parsed) throw std::invalid_argument("params: '" + name + "' of unknown type '" + type + "'");
    params.push_back({name, *parsed});
  }
  return params;
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
      {"params", params_json(r.params)},
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
  if (r.params.empty()) return "it has no parameter list";
  return "";
}

// The launch shape is the spec's: a record that says otherwise (edited and signed again, or from
// a build whose templates differed under the same generator version) would launch wrong. For a
// record whose spec parses (record_problem).
std::string launch_shape_problem(const EntryRecord& r) {
  const KernelSpec spec = KernelSpec::parse(r.spec);
  if (const int threads = kernel_threads(spec); r.threads != threads)
    return "its metadata says " + std::to_string(r.threads) + " threads, its spec's kernel is built for " +
           std::to_string(threads);
  if (const int smem = kernel_smem_bytes(spec); r.dynamic_smem_bytes != smem)
    return "its metadata says " + std::to_string(r.dynamic_smem_bytes) +
           " bytes of dynamic shared memory, its spec's kernel asks for " + std::to_string(smem);
  return "";
}

}  // namespace

bool is_cache_key(std::string_view text) { return is_ptx_key(text) || is_cubin_key(text); }

void require_key(const std::string& key) {
  if (!is_cache_key(key)) throw std::invalid_argument("'" + key + "' is not a kernel cache key");
}

std::string payload_name(const std::string& key, EntryKind kind) {
  return key + (kind == EntryKind::Ptx ? ".ptx" : ".cubin");
}
std::string payload_name(const std::string& key) {
  return payload_name(key, is_ptx_key(key) ? EntryKind::Ptx : EntryKind::Cubin);
}

// Temp files: "<temp prefix><metadata or payload name>-XXXXXX", as write_atomically_at names them.
std::optional<CacheFile> parse_cache_file(std::string_view name) {
  const std::string_view prefix = kTempPrefix;
  if (name.substr(0, prefix.size()) != prefix) return parse_entry_file(name);
  if (name.size() < prefix.size() + 7 || name[name.size() - 7] != '-' || !all_of(name.substr(name.size() - 6), is_alnum))
    return std::nullopt;
  std::optional<CacheFile> inner = parse_entry_file(name.substr(prefix.size(), name.size() - prefix.size() - 7));
  if (inner) inner->role = FileRole::Temp;
  return inner;
}

std::string ptx_isa_of(Arch arch) {
  const std::string features = arch_info(arch).llvm_features;
  const std::size_t at = features.find("+ptx");
  if (at == std::string::npos) return features;
  std::string digits = features.substr(at + 4);
  if (digits.size() < 2) return features;
  return digits.substr(0, digits.size() - 1) + "." + digits.back();
}

std::string metadata_text(const EntryRecord& r) { return to_json(r).dump(2) + "\n"; }

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
  r.params = params_from_json(j.at("params"));
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
    if (result.problem = launch_shape_problem(entry.record); !result.problem.empty()) return result;
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

std::string join_failures(const std::vector<std::string>& lines) {
  std::string text;
  for (const std::string& line : lines) text += (text.empty() ? "" : "; ") + line;
  return text;
}

}  // namespace lfce::runtime
