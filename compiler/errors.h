// Errors split by whose fault they are (see docs/design.md, "Errors").
#pragma once

#include <cstdint>
#include <stdexcept>
#include <string>
#include <utility>

namespace lfce {

// The caller asked for something invalid; the message names the value.
class SpecError : public std::invalid_argument {
 public:
  using std::invalid_argument::invalid_argument;
};

// LLVM or the driver's JIT rejected a module: what() says which kernel and why, followed by
// the toolchain's log; log() is the log alone ("" where there is none).
class CompileError : public std::runtime_error {
 public:
  explicit CompileError(const std::string& message, std::string log = "")
      : std::runtime_error(log.empty() ? message : message + "\n" + log), log_(std::move(log)) {}
  const std::string& log() const { return log_; }

 private:
  std::string log_;
};

// The problem, or a kernel of it, needs more of a device resource than the device has (shared
// memory per block, tiles in one launch): what() says so and names the fix; resource(),
// required() and limit() are the numbers (as Triton's OutOfResources carries them).
class OutOfResources : public std::runtime_error {
 public:
  OutOfResources(const std::string& message, std::string resource, int64_t required, int64_t limit)
      : std::runtime_error(message), resource_(std::move(resource)), required_(required), limit_(limit) {}
  const std::string& resource() const { return resource_; }
  int64_t required() const { return required_; }
  int64_t limit() const { return limit_; }

 private:
  std::string resource_;
  int64_t required_;
  int64_t limit_;
};

// A bug in lfce.
class InternalError : public std::logic_error {
 public:
  using std::logic_error::logic_error;
};

}  // namespace lfce
