#include "runtime/options.h"

#include <algorithm>
#include <cerrno>
#include <cstdlib>
#include <mutex>
#include <optional>

#include "compiler/arch.h"
#include "compiler/errors.h"

namespace lfce::runtime {
namespace {

std::string env(const char* name) {
  const char* value = std::getenv(name);
  return value ? value : "";
}

// A positive integer setting up to `max`, or 0 when unset.
int64_t positive_env(const char* name, int64_t max) {
  const std::string text = env(name);
  if (text.empty()) return 0;
  char* end = nullptr;
  errno = 0;
  const long long value = std::strtoll(text.c_str(), &end, 10);
  if (errno != 0 || end == text.c_str() || *end != '\0' || value < 1 || value > max)
    throw SpecError(std::string(name) + " = '" + text + "' is not an integer in [1, " + std::to_string(max) + "]");
  return value;
}

// A number of seconds in [0, max], or `fallback` when unset.
double seconds_env(const char* name, double max, double fallback) {
  const std::string text = env(name);
  if (text.empty()) return fallback;
  char* end = nullptr;
  errno = 0;
  const double value = std::strtod(text.c_str(), &end);
  if (errno != 0 || end == text.c_str() || *end != '\0' || !(value >= 0 && value <= max))
    throw SpecError(std::string(name) + " = '" + text + "' is not a number of seconds in [0, " +
                    std::to_string(static_cast<long long>(max)) + "]; set it to e.g. 60, or unset it for the default");
  return value;
}

// LFCE_EXPERIMENTAL: a comma-separated list of the switches below, each a path that computes the
// same bits as the default but measured slower today, kept for the speed work that may want it.
void read_experimental(Options& o) {
  for (const char* old : {"LFCE_EAGER_OPERAND", "LFCE_EAGER_FIXUP"})
    if (!env(old).empty())
      throw SpecError(std::string(old) + " is no longer read: the experimental paths are switched on with "
                      "LFCE_EXPERIMENTAL=eager_operand (was LFCE_EAGER_OPERAND=1) or LFCE_EXPERIMENTAL=eager_dz_kernel "
                      "(was LFCE_EAGER_FIXUP=0); unset " + old);
  const std::string text = env("LFCE_EXPERIMENTAL");
  size_t start = 0;
  while (start <= text.size() && !text.empty()) {
    const size_t end = std::min(text.find(',', start), text.size());
    const std::string name = text.substr(start, end - start);
    if (name == "eager_operand") {
      o.eager_operand = true;
    } else if (name == "eager_dz_kernel") {
      o.eager_fixup = false;
    } else {
      throw SpecError("LFCE_EXPERIMENTAL = '" + text + "': unknown switch '" + name +
                      "'; the switches are eager_operand and eager_dz_kernel, separated by commas");
    }
    start = end + 1;
  }
}

struct Current {
  std::mutex mutex;
  std::optional<Options> options;
};

Current& current_slot() {
  static Current* slot = new Current;  // leaked: read during static destruction by late launches
  return *slot;
}

}  // namespace

Options Options::current() {
  Current& slot = current_slot();
  std::lock_guard<std::mutex> lock(slot.mutex);
  if (!slot.options) slot.options = from_env();
  return *slot.options;
}

void Options::set_current(const Options& options) {
  Current& slot = current_slot();
  std::lock_guard<std::mutex> lock(slot.mutex);
  slot.options = options;
}

Options Options::from_env() {
  Options o;
  if (std::string libcuda = env("LFCE_LIBCUDA"); !libcuda.empty()) o.libcuda = libcuda;
  o.log_level = env("LFCE_LOG_LEVEL");
  o.cache_dir_env = env("LFCE_CACHE_DIR");
  o.xdg_cache_home = env("XDG_CACHE_HOME");
  o.home = env("HOME");
  o.cache_lock_timeout_s = seconds_env("LFCE_CACHE_LOCK_TIMEOUT", kMaxCacheLockTimeout, o.cache_lock_timeout_s);
  o.device_smem_limit = positive_env("LFCE_DEVICE_SMEM_LIMIT", int64_t{1} << 30);
  o.device_sm_count = positive_env("LFCE_DEVICE_SM_COUNT", 1 << 20);
  o.device_arch = env("LFCE_DEVICE_ARCH");
  read_experimental(o);
  if (!o.device_arch.empty()) {
    try {
      parse_arch(o.device_arch);
    } catch (const SpecError& e) {
      throw SpecError(std::string("LFCE_DEVICE_ARCH: ") + e.what());
    }
  }
  return o;
}

}  // namespace lfce::runtime
