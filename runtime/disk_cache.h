// On-disk kernel cache: generated PTX and driver-compiled cubins outlive the process, so a
// spec costs LLVM once per machine (or once per container image, precompiled offline without
// a GPU) and the driver's JIT once per (GPU model, driver).
//
// Layout under the cache directory:
//   kernels/<key>.ptx | <key>.cubin   the payload
//   kernels/<key>.json                metadata, written last: its presence commits the entry
//   locks/<key>.lock                  flock'ed while one process produces the entry (holding its pid)
// The cache reads, writes and removes only these names (and the temp files of its writes):
// anything else in its folders is left alone. It never follows a symbolic link inside the
// cache, and opens nothing that is not a regular file (a FIFO would block).
//
// Keys. A PTX entry's key is sha256 over exactly these inputs (PtxKeyInputs):
//   generator version (kGeneratorVersion), LLVM version (LFCE_LLVM_VERSION), PTX ISA of the
//   arch, and KernelSpec::text() (which names the kernel, sizes, dtype, mode, arch and tile).
// A cubin is the driver's compilation of one PTX entry for one device, keyed by that PTX key
// and the target (compute capability, driver version), readably: "<ptx key>.sm90-drv13000".
// Nothing else (cache directory, process, time, the KernelSpec object) enters a key.
#pragma once

#include <cstdint>
#include <functional>
#include <map>
#include <mutex>
#include <optional>
#include <stdexcept>
#include <string>
#include <string_view>
#include <vector>

#include "compiler/kernel_signature.h"
#include "compiler/kernel_spec.h"
#include "runtime/options.h"
#include "lfce_generator_version.h"  // generated: LFCE_GENERATOR_VERSION

namespace lfce::runtime {

// Bump whenever generated code may change for an unchanged spec (templates, codegen, LLVM
// options): it enters every key, so older entries are never found again; verify() calls them
// stale and clear() removes them.
inline constexpr char kGeneratorVersion[] = LFCE_GENERATOR_VERSION;  // cmake/generator_version.cmake

// The cache directory, and whether the user named it (LFCE_CACHE_DIR; --cache-dir and
// lfce_set_cache_dir name one too). A directory the user named is used through symbolic
// links; a derived one ($XDG_CACHE_HOME/lfce, ~/.cache/lfce) that is itself a link is refused.
struct CacheLocation {
  std::string dir;
  bool named_by_user = true;
};

// $LFCE_CACHE_DIR, else $XDG_CACHE_HOME/lfce, else ~/.cache/lfce. The only place the cache
// reads the environment.
CacheLocation default_cache_location(const Options& options);  // from these options
CacheLocation default_cache_location();                         // from Options::current()
std::string default_cache_dir();  // default_cache_location().dir

// The cache's folders cannot be used as asked: a symbolic link where a folder should be, or
// files that could not be removed. The environment's fault, neither the caller's nor lfce's.
class CacheError : public std::runtime_error {
 public:
  using std::runtime_error::runtime_error;
};

// "could not remove N files:\n  <failure>..." for a CacheError.
std::string not_removed_message(const std::vector<std::string>& failures);

// What ptx_key and cubin_key produce, and nothing else: the only names the cache acts on.
bool is_cache_key(std::string_view text);

enum class EntryKind { Ptx, Cubin };
std::string_view entry_kind_name(EntryKind kind);  // "ptx", "cubin"

struct PtxKeyInputs {
  std::string generator_version;
  std::string llvm_version;
  std::string ptx_isa;  // e.g. "8.5"
  std::string spec;     // KernelSpec::text()

  // The inputs for `spec` with this build's generator and toolchain.
  static PtxKeyInputs current(const KernelSpec& spec);
};

// The device and driver a cubin was compiled for.
struct CubinTarget {
  int cc_major = 0, cc_minor = 0;
  int driver_version = 0;  // cuDriverGetVersion, e.g. 13000
};

std::string ptx_key(const PtxKeyInputs& inputs);  // 64 hex digits
std::string ptx_key(const KernelSpec& spec);      // ptx_key(PtxKeyInputs::current(spec))
std::string cubin_key(const std::string& ptx_key, const CubinTarget& target);

// Metadata of one entry (the .json file).
struct EntryRecord {
  EntryKind kind = EntryKind::Ptx;
  std::string key;
  std::string spec;  // KernelSpec::text()
  std::string arch;  // the spec's arch, e.g. "sm_90a"
  std::string generator_version, llvm_version, ptx_isa;
  // How to launch it, so that a cache hit needs neither LLVM nor the template.
  std::string entry;
  int threads = 0;
  int dynamic_smem_bytes = 0;
  KernelSignature params;  // the kernel's parameters, as its template declared them
  double compile_ms = 0;  // LLVM (ptx) or driver JIT (cubin) time when it was produced
  // Cubin only: the target, and what ptxas allotted (-1: unknown, as for PTX entries).
  CubinTarget target;
  int registers = -1, local_bytes = -1, static_smem_bytes = -1;
  // Filled in by DiskCache::store. The metadata's sha256 covers every field but the creation
  // time, which only `ls` and `clear --older-than` read.
  std::int64_t created_unix = 0;
  std::uint64_t payload_bytes = 0;
  std::string payload_sha256;
};

struct Entry {
  EntryRecord record;
  std::string payload;  // PTX text or cubin image
};

// A bad entry found by verify().
struct BadEntry {
  std::string key;
  std::string file;     // the file that is wrong
  std::string problem;  // what is wrong with it
  bool removed = false;
  std::string not_removed;  // why, when removal was asked for and failed ("path: reason")
};

struct VerifyReport {
  std::size_t checked = 0;  // entries with metadata, valid or not
  std::vector<BadEntry> bad;
};

struct ClearReport {
  std::size_t removed = 0;  // entries (and stray files)
  std::uint64_t bytes = 0;  // freed
  std::vector<std::string> failures;  // "cannot remove <path>: <reason>", one per file left
};

// Thread-safe and process-safe. I/O failures never throw: a bad entry is a logged miss, and
// a directory that cannot be written makes the cache keep new entries in memory for the life
// of this object (logged once), while entries already on disk are still read. One entry that
// cannot be written (a directory in the way of its file) stays in memory alone.
class DiskCache {
 public:
  // named_by_user: see CacheLocation.
  explicit DiskCache(std::string dir, bool named_by_user = true);

  const std::string& dir() const { return dir_; }
  // False once a write failed and new entries live in memory only.
  bool persistent() const;

  // The entry if present and valid: metadata parses, belongs to `key` with this build's
  // generator and toolchain, and the payload has the recorded size and sha256. Otherwise
  // nullopt, after a warning naming the file and the problem.
  std::optional<Entry> load(const std::string& key);

  // Writes payload, then metadata, each atomically (temp file, fsync, rename), overwriting
  // what was there. Fills created_unix, payload_bytes and payload_sha256.
  void store(Entry entry);

  struct Lookup {
    Entry entry;
    bool hit = false;  // false: `produce` ran in this call
  };
  // load(key), else under an exclusive flock of the key's lock file (where one can be had
  // within Options::cache_lock_timeout_s, LFCE_CACHE_LOCK_TIMEOUT; past it a warning names the
  // lock and its holder, and this call goes on unlocked): load again, else produce() and
  // store. Many processes asking for one key at once produce it once. Exceptions from produce() propagate; nothing is stored then.
  Lookup get_or_create(const std::string& key, const std::function<Entry()>& produce);

  // Removes the entry if present (e.g. a cubin the driver no longer accepts).
  void remove(const std::string& key);

  // Management, for the CLI. Nothing here prints. Each throws CacheError when a folder of the
  // cache is a symbolic link (or the root, where the user did not name it).
  std::vector<EntryRecord> list() const;  // entries whose metadata parses, oldest first
  // The metadata JSON of the entry whose key is `key`, or the one key that starts with it.
  // Throws std::invalid_argument if there is none or the prefix is ambiguous.
  std::string info(const std::string& key_or_prefix) const;
  // Checks every entry as load() would, and files left by interrupted writes.
  VerifyReport verify(bool remove_bad);
  // Removes every entry, or those created more than `older_than_days` ago (finite, >= 0, else
  // std::invalid_argument), with their lock files; temp files of writes are removed once a
  // minute old (a writer may be using them).
  ClearReport clear(std::optional<double> older_than_days = std::nullopt);

 private:
  struct Folder;
  // dir_/name (kernels or locks), opened for one operation: the folder, or why not.
  Folder open_folder(const std::string& name, bool create) const;
  Folder open_folder_or_throw(const std::string& name) const;  // for management; absent is empty
  std::optional<Entry> load_from_disk(const std::string& key, bool warn) const;
  static void seal(EntryRecord& record, const std::string& payload);  // created, size, sha256
  void persist(Entry entry);  // to disk, else to memory
  void fall_back_to_memory(const std::string& path, const std::string& reason);

  std::string dir_;
  bool named_by_user_;
  std::string kernels_;  // dir_/kernels
  std::string locks_;    // dir_/locks
  mutable std::mutex mutex_;
  bool persistent_ = true;             // guarded by mutex_
  std::map<std::string, Entry> memory_;  // guarded by mutex_; entries that could not be written
};

}  // namespace lfce::runtime
