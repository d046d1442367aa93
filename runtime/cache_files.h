// The file operations of the disk cache, in POSIX terms: whole-file reads, atomic writes,
// and an advisory lock. Failures are returned (errno or a message), never thrown: a cache
// that cannot use its files degrades to a miss, not to an error.
#pragma once

#include <cstddef>
#include <cstdint>
#include <string>
#include <string_view>
#include <vector>

namespace lfce::runtime {

// Prefix of the temp files of atomic writes (hidden, so listings skip them).
inline constexpr char kTempPrefix[] = ".tmp-";

std::string error_text(int error);  // strerror, thread-safe

// Reads all of `path` into `out`: 0, or the errno (EFBIG if it is over max_bytes).
int read_file(const std::string& path, std::string& out, std::size_t max_bytes);

// Replaces dir/name by `data` atomically: temp file in `dir`, write, fsync, rename. False
// with a message naming the file and the reason in `error`; the temp file is removed then.
bool write_atomically(const std::string& dir, const std::string& name, std::string_view data,
                      std::string& error);

// fsync of a directory, making the renames in it durable; best effort.
void sync_directory(const std::string& dir);

std::uint64_t file_size(const std::string& path);  // 0 if absent
std::int64_t file_mtime(const std::string& path);  // unix seconds, 0 if absent
// Names of the plain files in `dir`, sorted (none if it cannot be read).
std::vector<std::string> file_names(const std::string& dir);

// An exclusive flock on `path` (created if needed) for the lifetime of the object, where one
// can be had: a read-only directory or an NFS mount without lockd (ENOLCK) gives none, and
// the holder goes on unlocked, which the cache allows since every write is an atomic rename.
// The kernel drops the lock if the process dies, so a crashed holder never blocks others.
class FileLock {
 public:
  explicit FileLock(const std::string& path);
  ~FileLock();
  FileLock(const FileLock&) = delete;
  FileLock& operator=(const FileLock&) = delete;
  bool held() const { return fd_ >= 0; }

 private:
  int fd_;
};

}  // namespace lfce::runtime
