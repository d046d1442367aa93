// The cache's maintenance, for `lfce cache ls | info | verify | clear`: walking the kernels
// folder, acting only on the names the cache owns (runtime/cache_entry.h).
#include <fmt/format.h>

#include <algorithm>
#include <cerrno>
#include <cmath>
#include <ctime>
#include <limits>
#include <set>
#include <stdexcept>

#include "runtime/cache_entry.h"
#include "runtime/disk_cache.h"

namespace lfce::runtime {

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
        bad.not_removed = join_failures(remove_entry_files(kernels.fd, kernels.path, locks.fd, locks.path, parsed->key, bytes));
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
