// One kernel cache entry's files (runtime/disk_cache.h describes the layout): the names the
// cache owns, the metadata and its checksum, reading an entry back whole or saying what is
// wrong with it, and removing its files. Internal to the runtime: disk_cache.cpp (load, store)
// and cache_maintenance.cpp (ls, info, verify, clear) share it.
#pragma once

#include <cstdint>
#include <optional>
#include <string>
#include <string_view>
#include <vector>

#include "runtime/cache_files.h"
#include "runtime/disk_cache.h"

namespace lfce::runtime {

constexpr std::size_t kMaxMetadataBytes = 1 << 20;  // a larger .json is not ours
// Temp files and payloads without metadata younger than this may belong to a write in
// progress in another process (a write takes milliseconds); older ones are leftovers.
constexpr std::int64_t kWriteGraceSeconds = 60;

// Keys become file names: only what ptx_key and cubin_key produce may pass (else
// std::invalid_argument naming it).
void require_key(const std::string& key);

std::string payload_name(const std::string& key, EntryKind kind);  // "<key>.ptx" or "<key>.cubin"
std::string payload_name(const std::string& key);

// The files of the cache, by name: anything else in its folders is the user's.
enum class FileRole { Metadata, Payload, Temp };
struct CacheFile {
  FileRole role;
  std::string key;
};

// What a file of the cache folders is (metadata, payload, or the temp file of a write of
// one), or nothing when it is not the cache's.
std::optional<CacheFile> parse_cache_file(std::string_view name);

// "+ptx85" in the arch table -> "8.5".
std::string ptx_isa_of(Arch arch);

// The metadata file of `r`, with its checksum.
std::string metadata_text(const EntryRecord& r);

struct Metadata {
  EntryRecord record;
  bool checksum_matches = false;
};

// Throws json::exception for a missing field or a wrong type, std::invalid_argument otherwise.
Metadata record_from_json(const std::string& text);

// One entry read from disk: the entry, or (problem, file), or neither when it is absent.
struct ReadResult {
  std::optional<Entry> entry;
  std::string file;
  std::string problem;
};

ReadResult read_entry(const DirFd& kernels, const std::string& kernels_path, const std::string& key);

// Unlinks kernels/<key>.json first (uncommits the entry), then its payload and lock file,
// adding the bytes freed to `bytes`. Returns "cannot remove <path>: <reason>" for each file
// that stays; an absent file is not a failure. While the metadata stays, so does the rest: a
// committed entry is never left without its payload.
std::vector<std::string> remove_entry_files(const DirFd& kernels, const std::string& kernels_path,
                                            const DirFd& locks, const std::string& locks_path,
                                            const std::string& key, std::uint64_t& bytes);

// The failures, on one line.
std::string join_failures(const std::vector<std::string>& lines);

// One folder of the cache opened for one operation, or why it could not be.
struct DiskCache::Folder {
  DirFd fd;
  std::string path;     // the folder's, or the one that failed
  int error = 0;        // errno; ELOOP: a symbolic link
  std::string problem;  // what is wrong with `path`, when error != 0
};

}  // namespace lfce::runtime
