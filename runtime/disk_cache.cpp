#include "runtime/disk_cache.h"

#include <pwd.h>
#include <unistd.h>

#include <spdlog/spdlog.h>

#include <cerrno>
#include <chrono>
#include <cmath>
#include <ctime>
#include <stdexcept>
#include <utility>

#include "compiler/errors.h"
#include "runtime/cache_entry.h"
#include "runtime/cache_files.h"
#include "runtime/options.h"
#include "runtime/sha256.h"

namespace lfce::runtime {

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
                                                    metadata_text(entry.record));
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
    const auto timeout = std::chrono::milliseconds(
        static_cast<std::int64_t>(std::ceil(Options::current().cache_lock_timeout_s * 1000)));
    if (const Folder locks = open_folder("locks", /*create=*/true); locks.error == 0)
      lock.emplace(locks.fd, locks.path, key + ".lock", timeout);
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

}  // namespace lfce::runtime
