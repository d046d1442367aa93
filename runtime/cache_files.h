// The file operations of the disk cache, in POSIX terms: whole-file reads, atomic writes,
// removals and an advisory lock, each relative to an open directory and never through a
// symbolic link, and never blocking on what is not a regular file (a FIFO, a device).
// Failures are returned (errno or a message), never thrown: a cache that cannot use its
// files degrades to a miss, not to an error.
#pragma once

#include <sys/types.h>

#include <chrono>
#include <cstddef>
#include <cstdint>
#include <string>
#include <string_view>
#include <vector>

namespace lfce::runtime {

// Prefix of the temp files of atomic writes (hidden, so listings skip them).
inline constexpr char kTempPrefix[] = ".tmp-";

// Returned, like an errno, for a path that exists but is not a regular file.
inline constexpr int kNotRegularFile = -1;

std::string error_text(int error);  // strerror (thread-safe), or "not a regular file"

// An open directory: the anchor of the *at() calls below. Move-only; closes on destruction.
class DirFd {
 public:
  DirFd() = default;
  explicit DirFd(int fd) : fd_(fd) {}
  DirFd(DirFd&& other) noexcept : fd_(other.fd_) { other.fd_ = -1; }
  DirFd& operator=(DirFd&& other) noexcept;
  DirFd(const DirFd&) = delete;
  DirFd& operator=(const DirFd&) = delete;
  ~DirFd();
  int get() const { return fd_; }
  explicit operator bool() const { return fd_ >= 0; }

 private:
  int fd_ = -1;
};

// Opens `path` as a directory, creating it (and its parents) first if `create`. Symbolic links
// in the path are followed, except that with follow_last false a path that is itself a link
// gives ELOOP. 0, or the errno.
int open_directory(const std::string& path, bool follow_last, bool create, DirFd& out);
// Opens the directory `name` in `parent`, creating it first if `create`; never through a
// link (ELOOP) and only a directory (ENOTDIR). 0, or the errno.
int open_subdirectory(const DirFd& parent, const std::string& name, bool create, DirFd& out);

// Reads all of `path` (or `name` in `dir`) into `out`: 0, or the errno (EFBIG if it is over
// max_bytes, ELOOP for a symbolic link, kNotRegularFile for a FIFO, device or directory: none
// of these is opened in a way that could block or has side effects). For any small file the
// cache or the tuning store reads.
int read_file(const std::string& path, std::string& out, std::size_t max_bytes);
int read_file_at(const DirFd& dir, const std::string& name, std::string& out, std::size_t max_bytes);

// What write_atomically_at did. `target` tells a failure to replace this one name (a
// directory in its place) from one of the whole directory (read-only, full, gone).
struct WriteResult {
  bool ok = true;
  bool target = false;
  std::string error;  // names the file and the reason
};

// Replaces `name` in `dir` (shown as `dir_path` in messages) by `data` atomically: temp file
// in `dir`, write, fsync, close, rename. The temp file is removed on failure.
WriteResult write_atomically_at(const DirFd& dir, const std::string& dir_path, const std::string& name,
                                std::string_view data);
// The same by path (the directory's symbolic links followed). False with a message in `error`.
bool write_atomically(const std::string& dir, const std::string& name, std::string_view data,
                      std::string& error);

// fsync of a directory, making the renames in it durable; best effort.
void sync_directory(const DirFd& dir);
void sync_directory(const std::string& dir);

// Removes `name` from `dir` if it is a regular file (never a link's target, a directory or
// another kind of file: kNotRegularFile), adding its size to `bytes`. 0, or the errno
// (ENOENT when it is already gone).
int remove_regular_file_at(const DirFd& dir, const std::string& name, std::uint64_t& bytes);

// One name in a directory, as lstat sees it.
struct DirEntry {
  std::string name;
  mode_t type = 0;  // S_IFREG, S_IFDIR, S_IFLNK, ... (st_mode & S_IFMT)
  std::uint64_t size = 0;
  std::int64_t mtime = 0;  // unix seconds
  bool regular() const;
};
// Every name in `dir` but . and .., sorted (none if it cannot be read).
std::vector<DirEntry> list_directory(const DirFd& dir);

// An exclusive flock on `name` in `dir` (a regular file, created if needed, never through a
// link) for the lifetime of the object, where one can be had within `timeout`: a read-only
// directory, a name taken by something else, an NFS mount without lockd (ENOLCK) or a holder
// that keeps it past the timeout gives none, and the waiter goes on unlocked, which the cache
// allows since every write is an atomic rename (two processes may then both compile one
// kernel). The kernel drops the lock if the process dies, so a crashed holder never blocks
// others; a stopped one (Ctrl-Z, a debugger, a suspended job) would, hence the timeout, after
// which a warning names the lock file (`dir_path`/`name`) and the pid its holder wrote into it.
class FileLock {
 public:
  FileLock(const DirFd& dir, const std::string& dir_path, const std::string& name, std::chrono::milliseconds timeout);
  ~FileLock();
  FileLock(const FileLock&) = delete;
  FileLock& operator=(const FileLock&) = delete;
  bool held() const { return fd_ >= 0; }

 private:
  int fd_;
};

}  // namespace lfce::runtime
