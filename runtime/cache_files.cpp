#include "runtime/cache_files.h"

#include <dirent.h>
#include <fcntl.h>
#include <sys/file.h>
#include <sys/stat.h>
#include <unistd.h>

#include <spdlog/spdlog.h>

#include <algorithm>
#include <atomic>
#include <cerrno>
#include <chrono>
#include <cstdlib>
#include <filesystem>
#include <random>
#include <system_error>
#include <thread>

namespace lfce::runtime {

namespace fs = std::filesystem;

std::string error_text(int error) {
  if (error == kNotRegularFile) return "not a regular file";
  return std::error_code(error, std::generic_category()).message();
}

DirFd& DirFd::operator=(DirFd&& other) noexcept {
  if (this != &other) {
    if (fd_ >= 0) close(fd_);
    fd_ = other.fd_;
    other.fd_ = -1;
  }
  return *this;
}

DirFd::~DirFd() {
  if (fd_ >= 0) close(fd_);
}

bool DirEntry::regular() const { return type == S_IFREG; }

namespace {

// O_NOFOLLOW: a link in the cache is none of lfce's, and may point anywhere. O_NONBLOCK: opening
// a FIFO for reading waits for a writer, forever; fstat then turns it away without reading.
constexpr int kReadFlags = O_RDONLY | O_CLOEXEC | O_NOFOLLOW | O_NONBLOCK | O_NOCTTY;

bool write_all(int fd, std::string_view data) {
  while (!data.empty()) {
    const ssize_t n = write(fd, data.data(), data.size());
    if (n < 0 && errno == EINTR) continue;
    if (n < 0) return false;
    if (n == 0) {
      errno = EIO;
      return false;
    }
    data.remove_prefix(static_cast<std::size_t>(n));
  }
  return true;
}

int read_open_file(int fd, std::string& out, std::size_t max_bytes) {
  struct stat st {};
  int error = fstat(fd, &st) != 0                                   ? errno
              : !S_ISREG(st.st_mode)                                ? kNotRegularFile
              : static_cast<std::uint64_t>(st.st_size) > max_bytes ? EFBIG
                                                                    : 0;
  if (error == 0) {
    out.resize(static_cast<std::size_t>(st.st_size));
    std::size_t done = 0;
    while (done < out.size()) {
      const ssize_t n = read(fd, out.data() + done, out.size() - done);
      if (n < 0 && errno == EINTR) continue;
      if (n < 0) {
        error = errno;
        break;
      }
      if (n == 0) break;
      done += static_cast<std::size_t>(n);
    }
    out.resize(done);
  }
  close(fd);
  return error;
}

// "<temp prefix><name>-" and six random letters or digits, unique enough with O_EXCL retries.
std::string temp_name(const std::string& name) {
  static constexpr char kAlphabet[] = "abcdefghijklmnopqrstuvwxyzABCDEFGHIJKLMNOPQRSTUVWXYZ0123456789";
  thread_local std::mt19937_64 random(std::random_device{}() ^
                                      static_cast<std::uint64_t>(getpid()) << 32 ^
                                      static_cast<std::uint64_t>(
                                          std::chrono::steady_clock::now().time_since_epoch().count()));
  std::string text = kTempPrefix + name + "-";
  for (int i = 0; i < 6; ++i) text += kAlphabet[random() % (sizeof kAlphabet - 1)];
  return text;
}

}  // namespace

int open_directory(const std::string& path, bool follow_last, bool create, DirFd& out) {
  if (path.empty()) return ENOENT;
  if (create) {
    std::error_code ec;  // the open below reports what is wrong
    fs::create_directories(path, ec);
  }
  const int fd = open(path.c_str(), O_RDONLY | O_DIRECTORY | O_CLOEXEC | (follow_last ? 0 : O_NOFOLLOW));
  if (fd < 0) {
    const int error = errno;
    struct stat st {};
    if (!follow_last && lstat(path.c_str(), &st) == 0 && S_ISLNK(st.st_mode)) return ELOOP;
    return error;
  }
  out = DirFd(fd);
  return 0;
}

int open_subdirectory(const DirFd& parent, const std::string& name, bool create, DirFd& out) {
  if (create && mkdirat(parent.get(), name.c_str(), 0755) != 0 && errno != EEXIST) return errno;
  const int fd = openat(parent.get(), name.c_str(), O_RDONLY | O_DIRECTORY | O_CLOEXEC | O_NOFOLLOW);
  if (fd < 0) {
    const int error = errno;
    // O_NOFOLLOW | O_DIRECTORY on a link gives ENOTDIR on some kernels: name the link as one.
    struct stat st {};
    if (fstatat(parent.get(), name.c_str(), &st, AT_SYMLINK_NOFOLLOW) == 0 && S_ISLNK(st.st_mode)) return ELOOP;
    return error;
  }
  out = DirFd(fd);
  return 0;
}

int read_file(const std::string& path, std::string& out, std::size_t max_bytes) {
  const int fd = open(path.c_str(), kReadFlags);
  return fd < 0 ? errno : read_open_file(fd, out, max_bytes);
}

int read_file_at(const DirFd& dir, const std::string& name, std::string& out, std::size_t max_bytes) {
  const int fd = openat(dir.get(), name.c_str(), kReadFlags);
  if (fd < 0) return errno == ELOOP ? kNotRegularFile : errno;  // a plain name: ELOOP is the link itself
  return read_open_file(fd, out, max_bytes);
}

// dir/name gets `data` atomically: readers see the old file or the whole new one, never a
// part, since rename within one directory is atomic and the data is on disk before it.
WriteResult write_atomically_at(const DirFd& dir, const std::string& dir_path, const std::string& name,
                                std::string_view data) {
  WriteResult result;
  std::string temp;
  int fd = -1;
  for (int attempt = 0; fd < 0 && attempt < 100; ++attempt) {
    temp = temp_name(name);
    fd = openat(dir.get(), temp.c_str(), O_WRONLY | O_CREAT | O_EXCL | O_NOFOLLOW | O_CLOEXEC, 0644);
    if (fd < 0 && errno != EEXIST) break;
  }
  if (fd < 0) {
    result = {false, false, "cannot create a file in " + dir_path + ": " + error_text(errno)};
    return result;
  }
  const std::string path = dir_path + "/" + name;
  int saved = 0;
  if (!write_all(fd, data) || fchmod(fd, 0644) != 0 || fsync(fd) != 0) saved = errno;
  if (close(fd) != 0 && saved == 0) saved = errno;  // NFS reports a failed write at close
  if (saved != 0) {
    result = {false, false, "cannot write " + path + ": " + error_text(saved)};
  } else if (renameat(dir.get(), temp.c_str(), dir.get(), name.c_str()) != 0) {
    // The directory took the data: only this name is in the way (a directory of that name).
    result = {false, true, "cannot replace " + path + ": " + error_text(errno)};
  }
  if (!result.ok) unlinkat(dir.get(), temp.c_str(), 0);
  return result;
}

bool write_atomically(const std::string& dir, const std::string& name, std::string_view data,
                      std::string& error) {
  DirFd fd;
  if (const int open_error = open_directory(dir, /*follow_last=*/true, /*create=*/false, fd); open_error != 0) {
    error = "cannot open " + dir + ": " + error_text(open_error);
    return false;
  }
  WriteResult result = write_atomically_at(fd, dir, name, data);
  error = std::move(result.error);
  return result.ok;
}

// Without it an entry is still never torn, only possibly absent after a power loss.
void sync_directory(const DirFd& dir) {
  if (dir) fsync(dir.get());
}

void sync_directory(const std::string& dir) {
  DirFd fd;
  if (open_directory(dir, /*follow_last=*/true, /*create=*/false, fd) == 0) sync_directory(fd);
}

int remove_regular_file_at(const DirFd& dir, const std::string& name, std::uint64_t& bytes) {
  struct stat st {};
  if (fstatat(dir.get(), name.c_str(), &st, AT_SYMLINK_NOFOLLOW) != 0) return errno;
  if (!S_ISREG(st.st_mode)) return kNotRegularFile;
  // unlinkat never follows a link: if the name was swapped for one meanwhile, the link goes.
  if (unlinkat(dir.get(), name.c_str(), 0) != 0) return errno;
  bytes += static_cast<std::uint64_t>(st.st_size);
  return 0;
}

std::vector<DirEntry> list_directory(const DirFd& dir) {
  std::vector<DirEntry> entries;
  const int fd = dir ? dup(dir.get()) : -1;
  if (fd < 0) return entries;
  DIR* stream = fdopendir(fd);
  if (!stream) {
    close(fd);
    return entries;
  }
  rewinddir(stream);  // the duplicate shares the position of `dir`
  while (const dirent* d = readdir(stream)) {
    const std::string name = d->d_name;
    if (name == "." || name == "..") continue;
    struct stat st {};
    // A name removed meanwhile is skipped, not the end of the listing.
    if (fstatat(dir.get(), name.c_str(), &st, AT_SYMLINK_NOFOLLOW) != 0) continue;
    entries.push_back({name, static_cast<mode_t>(st.st_mode & S_IFMT), static_cast<std::uint64_t>(st.st_size),
                       static_cast<std::int64_t>(st.st_mtime)});
  }
  closedir(stream);
  std::sort(entries.begin(), entries.end(), [](const DirEntry& a, const DirEntry& b) { return a.name < b.name; });
  return entries;
}

namespace {

// The pid a holder wrote into its lock file, or 0 if there is none (an older lfce, an empty file).
// "process <pid> on <host>" as the holder wrote it into its lock file, or "another process" where
// it wrote nothing (an older lfce, a holder between its flock and its write).
std::string holder_text(int fd) {
  char text[320] = {};
  const ssize_t got = pread(fd, text, sizeof text - 1, 0);
  if (got <= 0) return "another process";
  char* end = nullptr;
  const long pid = std::strtol(text, &end, 10);
  if (end == text || pid <= 0) return "another process";
  std::string host = end && *end == ' ' ? std::string(end + 1) : std::string();
  host = host.substr(0, host.find('\n'));
  return "process " + std::to_string(pid) + (host.empty() ? "" : " on " + host);
}

}  // namespace

FileLock::FileLock(const DirFd& dir, const std::string& dir_path, const std::string& name,
                   std::chrono::milliseconds timeout)
    : fd_(openat(dir.get(), name.c_str(), O_RDWR | O_CREAT | O_CLOEXEC | O_NOFOLLOW | O_NONBLOCK | O_NOCTTY, 0644)) {
  const std::string path = dir_path + "/" + name;
  struct stat st {};
  const int error = fd_ < 0 ? errno : fstat(fd_, &st) != 0 ? errno : !S_ISREG(st.st_mode) ? kNotRegularFile : 0;
  if (error != 0) {
    spdlog::debug("kernel cache: cannot open lock file {} ({}); going on without it", path, error_text(error));
    if (fd_ >= 0) close(fd_);
    fd_ = -1;
    return;
  }
  // Polled, not a blocking flock: a holder that is stopped must not stop every other process.
  using Clock = std::chrono::steady_clock;
  const Clock::time_point deadline = Clock::now() + timeout;
  std::chrono::milliseconds pause{1};
  while (flock(fd_, LOCK_EX | LOCK_NB) != 0) {
    if (errno == EINTR) continue;
    if (errno != EWOULDBLOCK) {
      spdlog::debug("kernel cache: cannot lock {} ({}); going on without it", path, error_text(errno));
      close(fd_);
      fd_ = -1;
      return;
    }
    if (Clock::now() >= deadline) {
      // The pid is the holder's as it wrote it: in its own PID namespace, on its own host.
      spdlog::warn("kernel cache: waited {:.1f} s for the lock {}, held by {} (compiling the kernel slowly, or "
                   "stopped or hung); going on without it (this process may compile a kernel that process is "
                   "compiling too). If that process is stopped or hung, resume or end it; set "
                   "LFCE_CACHE_LOCK_TIMEOUT (seconds) to wait longer or less",
                   std::chrono::duration<double>(timeout).count(), path, holder_text(fd_));
      close(fd_);
      fd_ = -1;
      return;
    }
    std::this_thread::sleep_for(std::min<Clock::duration>(pause, deadline - Clock::now()));
    pause = std::min(pause * 2, std::chrono::milliseconds{50});
  }
  // Who holds it, for the message of a process that waits too long.
  char host[256] = {};
  if (gethostname(host, sizeof host - 1) != 0) host[0] = '\0';
  const std::string pid = std::to_string(static_cast<long>(getpid())) + (host[0] ? std::string(" ") + host : "") + "\n";
  if (ftruncate(fd_, 0) != 0 || pwrite(fd_, pid.data(), pid.size(), 0) < 0)
    spdlog::debug("kernel cache: cannot write this process's pid into {} ({})", path, error_text(errno));
}

FileLock::~FileLock() {
  if (fd_ < 0) return;
  // Clear the pid before releasing, so that a later waiter never names a process that is gone.
  if (ftruncate(fd_, 0) != 0) spdlog::debug("kernel cache: cannot clear the lock file's pid ({})", error_text(errno));
  close(fd_);  // releases the flock
}

}  // namespace lfce::runtime
