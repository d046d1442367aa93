// Logging goes through spdlog's default logger, to stderr, prefixed "[lfce <level>]".
// The level comes from LFCE_LOG_LEVEL (trace, debug, info, warn, error, off; default warn).
#pragma once

#include <string_view>

namespace lfce::runtime {

void init_logging();                       // idempotent; called by every C API entry point
bool set_log_level(std::string_view name);  // false if the name is not a level

}  // namespace lfce::runtime
