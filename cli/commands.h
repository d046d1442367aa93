// Each subcommand registers itself on the app; its callback runs when it is chosen and
// throws CLI::Error on failure: a usage error (CLI::ValidationError, naming the option and
// the value) or a Failure (the request was valid but could not be done).
#pragma once

#include <CLI/CLI.hpp>

#include <string>

namespace lfce::cli {

// The exit statuses of `lfce`, listed by `lfce --help` (kExitStatusHelp) and docs/cache.md.
enum ExitStatus : int {
  kExitOk = 0,
  kExitBadEntries = 1,  // `cache verify` found bad entries (and was not asked to remove them)
  kExitUsage = 2,       // an unknown command, option or value; the message names it
  kExitFailure = 3,     // a valid request failed: a file or folder, LLVM, the driver or the GPU
  kExitInternal = 4,    // a bug in lfce
};
extern const char kExitStatusHelp[];

// A valid request that failed; main prints "lfce: <message>" and exits with its status.
class Failure : public CLI::Error {
 public:
  explicit Failure(std::string message, int exit_code = kExitFailure)
      : CLI::Error("Failure", std::move(message), exit_code) {}
};

void add_compile_command(CLI::App& app);
void add_precompile_command(CLI::App& app);
void add_tune_command(CLI::App& app);
void add_cache_command(CLI::App& app);

}  // namespace lfce::cli
