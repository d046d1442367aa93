// Errors split by whose fault they are (see docs/design.md, "Errors").
#pragma once

#include <stdexcept>
#include <string>

namespace lfce {

// The caller asked for something invalid; the message names the value.
class SpecError : public std::invalid_argument {
 public:
  using std::invalid_argument::invalid_argument;
};

// LLVM or the driver's JIT rejected a module; the message carries its log.
class CompileError : public std::runtime_error {
 public:
  using std::runtime_error::runtime_error;
};

// A bug in lfce.
class InternalError : public std::logic_error {
 public:
  using std::logic_error::logic_error;
};

}  // namespace lfce
