#include "api/session.h"

#include <string>

#include "runtime/disk_cache.h"
#include "runtime/driver.h"
#include "runtime/kernel_cache.h"
#include "runtime/logging.h"
#include "runtime/tuning_files.h"

namespace lfce::api {

Session& Session::get() {
  static Session* session = new Session(runtime::Options::from_env());  // leaked: used at exit
  return *session;
}

Session::Session(runtime::Options options) : options_(std::move(options)) { apply_options(); }

void Session::apply_options() {
  runtime::Options::set_current(options_);
  if (!options_.log_level.empty()) runtime::set_log_level(options_.log_level);
  if (!cache_dir_named_) {
    const runtime::CacheLocation location = runtime::default_cache_location(options_);
    runtime::use_cache_dir(location.dir, location.named_by_user);
  }
}

void Session::reload() {
  runtime::Options fresh = runtime::Options::from_env();  // throws before anything changes
  std::lock_guard<std::mutex> lock(mutex_);
  options_ = std::move(fresh);
  apply_options();
  tunings_.clear();
  plans_.clear();
}

runtime::Options Session::options() const {
  std::lock_guard<std::mutex> lock(mutex_);
  return options_;
}

std::string Session::cache_dir() const { return runtime::disk_cache()->dir(); }

void Session::set_cache_dir(const std::string& dir) {
  std::lock_guard<std::mutex> lock(mutex_);
  runtime::use_cache_dir(dir);
  cache_dir_named_ = true;
  tunings_.clear();  // the winners live in the new directory too
  plans_.clear();
}

runtime::Tuning Session::tuning(const runtime::Problem& problem, Arch arch, const runtime::DeviceLimits& limits) {
  const std::string dir = cache_dir();
  const std::string key = dir + "|" + std::string(arch_name(arch)) + "|" + std::to_string(limits.smem_per_block) +
                          "|" + std::to_string(limits.sm_count) + "|" + runtime::problem_text(problem);
  {
    std::lock_guard<std::mutex> lock(mutex_);
    if (auto it = tunings_.find(key); it != tunings_.end()) return it->second;
  }
  // Read outside the lock; two threads reading the same files agree. The environment's switch
  // goes in here, so that launches and precompilation plan the same kernels.
  runtime::Tuning tuning = runtime::stored_tuning(runtime::TuningFiles(dir), problem, arch, limits);
  tuning.eager_operand = options().eager_operand;
  tuning.eager_fixup = options().eager_fixup;
  std::lock_guard<std::mutex> lock(mutex_);
  return tunings_.emplace(key, std::move(tuning)).first->second;
}

runtime::Plan Session::plan(const runtime::Problem& problem, int device) {
  const std::string key = cache_dir() + "|" + std::to_string(device) + "|" + runtime::problem_text(problem);
  {
    std::lock_guard<std::mutex> lock(mutex_);
    if (auto it = plans_.find(key); it != plans_.end()) return it->second;
  }
  const runtime::DeviceInfo& info = runtime::device_info(device);
  const Arch arch = info.arch();
  const runtime::DeviceLimits limits{info.max_smem_optin, info.sm_count};
  runtime::Plan plan(problem, arch, tuning(problem, arch, limits), limits);
  std::lock_guard<std::mutex> lock(mutex_);
  return plans_.emplace(key, std::move(plan)).first->second;
}

void Session::forget_tunings() {
  std::lock_guard<std::mutex> lock(mutex_);
  tunings_.clear();
  plans_.clear();
}

}  // namespace lfce::api
