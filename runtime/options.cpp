#include "runtime/options.h"

#include <cstdlib>

namespace lfce::runtime {
namespace {

std::string env(const char* name) {
  const char* value = std::getenv(name);
  return value ? value : "";
}

}  // namespace

Options Options::from_env() {
  Options o;
  if (std::string libcuda = env("LFCE_LIBCUDA"); !libcuda.empty()) o.libcuda = libcuda;
  o.log_level = env("LFCE_LOG_LEVEL");
  o.cache_dir_env = env("LFCE_CACHE_DIR");
  o.xdg_cache_home = env("XDG_CACHE_HOME");
  o.home = env("HOME");
  o.autotune_on_first_use = env("LFCE_AUTOTUNE") == "1";
  return o;
}

}  // namespace lfce::runtime
