#include "runtime/logging.h"
#include "runtime/options.h"

#include <spdlog/sinks/stdout_sinks.h>
#include <spdlog/spdlog.h>

#include <mutex>
#include <string>

namespace lfce::runtime {

bool set_log_level(std::string_view name) {
  auto level = spdlog::level::from_str(std::string(name));
  // from_str maps unknown names to "off": accept "off" only when asked for.
  if (level == spdlog::level::off && name != "off") return false;
  spdlog::set_level(level);
  return true;
}

void init_logging() {
  static std::once_flag once;
  std::call_once(once, [] {
    auto logger = spdlog::stderr_logger_mt("lfce");
    logger->set_pattern("[lfce %l] %v");
    spdlog::set_default_logger(logger);
    std::string level;
    try {
      level = Options::current().log_level;
    } catch (const std::exception&) {
      // A malformed setting elsewhere: the call that needs it reports it; logging stays at warn.
    }
    if (level.empty() || !set_log_level(level)) spdlog::set_level(spdlog::level::warn);
    if (!level.empty() && spdlog::get_level() == spdlog::level::warn && level != "warn")
      spdlog::warn("LFCE_LOG_LEVEL='{}' is not a level (trace, debug, info, warn, error, off); using warn", level);
  });
}

}  // namespace lfce::runtime
