#include "runtime/cache_files.h"

#include <fcntl.h>
#include <sys/file.h>
#include <sys/stat.h>
#include <unistd.h>

#include <spdlog/spdlog.h>

#include <algorithm>
#include <cerrno>
#include <filesystem>
#include <system_error>

namespace lfce::runtime {

namespace fs = std::filesystem;

std::string error_text(int error) { return std::error_code(error, std::generic_category()).message(); }

namespace {

bool write_all(int fd, std::string_view data) {
  while (!data.empty()) {
    const ssize_t n = write(fd, data.data(), data.size());
    if (n < 0 && errno == EINTR) continue;
    if (n <= 0) return false;
    data.remove_prefix(static_cast<std::size_t>(n));
  }
  return true;
}

}  // namespace

int read_file(const std::string& path, std::string& out, std::size_t max_bytes) {
  const int fd = open(path.c_str(), O_RDONLY | O_CLOEXEC);
  if (fd < 0) return errno;
  struct stat st {};
  const int error = fstat(fd, &st) != 0                                  ? errno
                    : static_cast<std::uint64_t>(st.st_size) > max_bytes ? EFBIG
                                                                          : 0;
  if (error != 0) {
    close(fd);
    return error;
  }
  out.resize(static_cast<std::size_t>(st.st_size));
  std::size_t done = 0;
  while (done < out.size()) {
    const ssize_t n = read(fd, out.data() + done, out.size() - done);
    if (n < 0 && errno == EINTR) continue;
    if (n < 0) {
      const int error = errno;
      close(fd);
      return error;
    }
    if (n == 0) break;
    done += static_cast<std::size_t>(n);
  }
  out.resize(done);
  close(fd);
  return 0;
}

// dir/name gets `data` atomically: readers see the old file or the whole new one, never a
// part, since rename within one directory is atomic and the data is on disk before it.
bool write_atomically(const std::string& dir, const std::string& name, std::string_view data,
                      std::string& error) {
  std::string temp = dir + "/" + kTempPrefix + name + "-XXXXXX";
  const int fd = mkostemp(temp.data(), O_CLOEXEC);
  if (fd < 0) {
    error = "cannot create a file in " + dir + ": " + error_text(errno);
    return false;
  }
  bool ok = write_all(fd, data) && fchmod(fd, 0644) == 0 && fsync(fd) == 0;
  int saved = errno;
  if (close(fd) != 0 && ok) ok = false, saved = errno;
  const std::string path = dir + "/" + name;
  if (ok && rename(temp.c_str(), path.c_str()) != 0) ok = false, saved = errno;
  if (!ok) {
    unlink(temp.c_str());
    error = "cannot write " + path + ": " + error_text(saved);
  }
  return ok;
}

// Without it an entry is still never torn, only possibly absent after a power loss.
void sync_directory(const std::string& dir) {
  const int fd = open(dir.c_str(), O_RDONLY | O_DIRECTORY | O_CLOEXEC);
  if (fd < 0) return;
  fsync(fd);
  close(fd);
}

std::uint64_t file_size(const std::string& path) {
  struct stat st {};
  return stat(path.c_str(), &st) == 0 ? static_cast<std::uint64_t>(st.st_size) : 0;
}

std::int64_t file_mtime(const std::string& path) {
  struct stat st {};
  return stat(path.c_str(), &st) == 0 ? static_cast<std::int64_t>(st.st_mtime) : 0;
}

std::vector<std::string> file_names(const std::string& dir) {
  std::vector<std::string> names;
  std::error_code ec;
  for (fs::directory_iterator it(dir, ec), end; !ec && it != end; it.increment(ec)) {
    std::error_code type_ec;  // a file removed meanwhile is skipped, not the end of the listing
    if (it->is_regular_file(type_ec)) names.push_back(it->path().filename().string());
  }
  std::sort(names.begin(), names.end());
  return names;
}

FileLock::FileLock(const std::string& path) : fd_(open(path.c_str(), O_RDWR | O_CREAT | O_CLOEXEC, 0644)) {
  if (fd_ < 0) {
    spdlog::debug("kernel cache: cannot open lock file {} ({}); going on without it", path, error_text(errno));
    return;
  }
  while (flock(fd_, LOCK_EX) != 0) {
    if (errno == EINTR) continue;
    spdlog::debug("kernel cache: cannot lock {} ({}); going on without it", path, error_text(errno));
    close(fd_);
    fd_ = -1;
    return;
  }
}

FileLock::~FileLock() {
  if (fd_ >= 0) close(fd_);  // releases the flock
}

}  // namespace lfce::runtime
