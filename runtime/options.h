// Every setting lfce takes from the environment, read in this one place.
//
//   LFCE_LIBCUDA     the driver library to dlopen (default libcuda.so.1)
//   LFCE_LOG_LEVEL   trace, debug, info, warn, error, off (default warn)
//   LFCE_CACHE_DIR   kernel cache directory (else $XDG_CACHE_HOME/lfce, else ~/.cache/lfce)
//   LFCE_AUTOTUNE    1: tune a problem with no stored winners on its first use
//
// Read at each call rather than once, so that a process (or a test) that sets a variable
// before first use is honoured; the callers cache what they derive from it.
#pragma once

#include <string>

namespace lfce::runtime {

struct Options {
  std::string libcuda = "libcuda.so.1";
  std::string log_level;      // empty: not set
  std::string cache_dir_env;  // LFCE_CACHE_DIR, empty if unset
  std::string xdg_cache_home;
  std::string home;
  bool autotune_on_first_use = false;

  static Options from_env();
};

}  // namespace lfce::runtime
