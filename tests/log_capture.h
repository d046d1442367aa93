// For tests of what lfce logs: spdlog's default logger sends warnings and errors into a string
// for the life of the object.
#pragma once

#include <spdlog/sinks/ostream_sink.h>
#include <spdlog/spdlog.h>

#include <memory>
#include <sstream>
#include <string>

namespace lfce::testing_log {

class WarningCapture {
 public:
  WarningCapture() : previous_(spdlog::default_logger()) {
    auto logger = std::make_shared<spdlog::logger>("capture", std::make_shared<spdlog::sinks::ostream_sink_mt>(out_));
    logger->set_level(spdlog::level::warn);
    spdlog::set_default_logger(logger);
  }
  ~WarningCapture() { spdlog::set_default_logger(previous_); }
  WarningCapture(const WarningCapture&) = delete;
  WarningCapture& operator=(const WarningCapture&) = delete;
  std::string text() const { return out_.str(); }
  int count(const std::string& part) const {  // occurrences of `part` in text()
    int n = 0;
    const std::string s = text();
    for (std::size_t at = s.find(part); at != std::string::npos; at = s.find(part, at + 1)) ++n;
    return n;
  }

 private:
  std::ostringstream out_;
  std::shared_ptr<spdlog::logger> previous_;
};

}  // namespace lfce::testing_log
