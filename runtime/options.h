// Every setting lfce takes from the environment, read in this one place.
//
//   LFCE_LIBCUDA     the driver library to dlopen (default libcuda.so.1)
//   LFCE_LOG_LEVEL   trace, debug, info, warn, error, off (default warn)
//   LFCE_CACHE_DIR   kernel cache directory (else $XDG_CACHE_HOME/lfce, else ~/.cache/lfce)
//   LFCE_CACHE_LOCK_TIMEOUT
//                    seconds a process waits for another's lock on a kernel it is compiling
//                    before it goes on without it (default 60; 0: never waits): a stopped or
//                    hung holder then delays the others by this much, not forever
//   LFCE_DEVICE_SMEM_LIMIT, LFCE_DEVICE_SM_COUNT
//                    pretend every device has at most this much opt-in shared memory per
//                    block (bytes) / this many SMs: tile and grid choices follow, as on a
//                    smaller GPU (a 99 KiB RTX 4090 or L40S, a 108-SM A100) — for tests
//   LFCE_DEVICE_ARCH sm_80: run the portable mma.sync kernels even on a Hopper GPU (an sm_80
//                    module runs on sm_90), to test or compare that path there
//   LFCE_EXPERIMENTAL a comma-separated list of paths that compute the same bits as the default
//                    but were measured slower (kept for the speed work; not for users):
//                    eager_operand: eager mode's grad_weight and grad_input form dz from the
//                    stored exponentials in registers on their way to the tensor cores
//                    (Plan::eager_operand; docs/measurements.md#eager-operand);
//                    eager_dz_kernel: eager_dz's pass rewrites the workspace as a kernel of its
//                    own instead of grad_weight's producer warpgroup doing it while its consumers
//                    compute (Plan::eager_fixup off; docs/measurements.md#eager-fixup).
//                    The former LFCE_EAGER_OPERAND / LFCE_EAGER_FIXUP are refused, naming these.
//
// Read once per process: current() is what the first use (or the api layer's Session, which
// calls set_current() on reload) read.
#pragma once

#include <cstdint>
#include <string>

namespace lfce::runtime {

inline constexpr double kMaxCacheLockTimeout = 86400;  // seconds: a day

struct Options {
  std::string libcuda = "libcuda.so.1";
  std::string log_level;      // empty: not set
  std::string cache_dir_env;  // LFCE_CACHE_DIR, empty if unset
  std::string xdg_cache_home;
  std::string home;
  double cache_lock_timeout_s = 60;  // LFCE_CACHE_LOCK_TIMEOUT, in [0, kMaxCacheLockTimeout]
  int64_t device_smem_limit = 0;  // 0: the device's own
  int64_t device_sm_count = 0;    // 0: the device's own
  std::string device_arch;        // LFCE_DEVICE_ARCH, empty if unset (else a valid arch name)
  bool eager_operand = false;     // LFCE_EXPERIMENTAL=eager_operand
  bool eager_fixup = true;        // unless LFCE_EXPERIMENTAL=eager_dz_kernel

  static Options from_env();  // throws SpecError naming a malformed value
  static Options current();   // from_env() at the first call, else what set_current() set
  static void set_current(const Options& options);
};

}  // namespace lfce::runtime
