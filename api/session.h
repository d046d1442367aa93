// Session: the process-wide state behind the C API, above every other layer.
//
//   options   read from the environment once (Options::from_env), re-read only by reload();
//   cache     the one cache directory, for the kernels (runtime's disk cache) and the tuning
//             winners (<cache dir>/tuning) alike: set_cache_dir() moves both;
//   tunings   the persisted winners of each problem, read once per problem, device limits and
//             cache directory (the runtime reads the files: runtime/tuning_files.h; no sweep
//             ever runs here: `lfce tune` or lfce.tune() produce them);
//   plans     the launch plan of each (problem, device), built once.
//
// Layering (docs/architecture.md): api -> autotune -> runtime -> templates -> compiler.
#pragma once

#include <map>
#include <mutex>
#include <string>

#include "runtime/options.h"
#include "runtime/plan.h"
#include "runtime/tuning.h"

namespace lfce::api {

class Session {
 public:
  // The process's session, created on first use (reads the environment then).
  static Session& get();

  explicit Session(runtime::Options options);

  // Re-reads the environment: log level, cache directory (unless set_cache_dir named one),
  // forced device limits. Forgets the tunings and plans read so far.
  void reload();
  runtime::Options options() const;

  std::string cache_dir() const;
  void set_cache_dir(const std::string& dir);

  // The stored winners for `problem` on `arch` with the device's `limits` (defaults where
  // none), from <cache dir>/tuning. Unknown limits (0s): the arch table's.
  runtime::Tuning tuning(const runtime::Problem& problem, Arch arch, const runtime::DeviceLimits& limits = {});
  // The plan `problem` runs with on `device`: its arch, limits and tuning.
  runtime::Plan plan(const runtime::Problem& problem, int device);
  // Drops the tunings and plans read so far (after `lfce tune` wrote new winners).
  void forget_tunings();

 private:
  void apply_options();  // pushes options_ into the runtime (log level, cache location)

  mutable std::mutex mutex_;
  runtime::Options options_;
  bool cache_dir_named_ = false;  // set_cache_dir() chose the directory: reload() keeps it
  std::map<std::string, runtime::Tuning> tunings_;  // by cache dir, arch, limits and problem
  std::map<std::string, runtime::Plan> plans_;      // by cache dir, device and problem
};

}  // namespace lfce::api
