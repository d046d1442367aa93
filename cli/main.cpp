// lfce: the command line over liblfce's C API.
//   lfce compile     emit PTX and metadata for one configuration (no GPU needed)
//   lfce precompile  fill the kernel cache for model presets (no GPU needed)
//   lfce tune        autotuning sweep on the GPU, winners persisted in the cache
//   lfce cache       ls | info KEY | verify | clear
#include <CLI/CLI.hpp>

#include <exception>
#include <iostream>
#include <string>

#include "cli/commands.h"
#include "lfce/lfce.h"

namespace lfce::cli {

const char kExitStatusHelp[] =
    "Exit status: 0 success; 1 `cache verify` found bad entries; 2 usage error (an unknown command, option or "
    "value, named in the message); 3 failure (a file or folder, LLVM, the driver or the GPU; the message says "
    "what); 4 internal error (a bug in lfce).\n";

namespace {

// "--bias" where CLI11 refused a value given to the flag --bias (disable_flag_override), else "".
std::string flag_given_a_value(const CLI::Error& e) {
  static const std::string kSuffix = " was given a disallowed flag override";
  const std::string what = e.what();
  if (e.get_name() != "ArgumentMismatch" || what.size() <= kSuffix.size() ||
      what.compare(what.size() - kSuffix.size(), kSuffix.size(), kSuffix) != 0)
    return "";
  return "--" + what.substr(0, what.size() - kSuffix.size());
}

}  // namespace

}  // namespace lfce::cli

int main(int argc, char** argv) {
  using namespace lfce::cli;
  CLI::App app{"lfce: fused linear + cross-entropy kernels, generated at run time"};
  // `lfce --version` alone: an argument beside it would be silently dropped.
  app.set_version_flag("--version", [argc]() -> std::string {
    if (argc != 2) throw CLI::ValidationError("--version", "takes no other argument; give `lfce --version` alone");
    return std::string("lfce ") + lfce_version();
  });
  // A flag given a value (--bias=2) is a usage error, not a silent true or false: set before the
  // commands are added, so that each of their flags inherits it.
  app.option_defaults()->disable_flag_override();
  app.footer(kExitStatusHelp);
  // Not require_subcommand(1): with it CLI11 reports an unknown command as a missing one,
  // without naming it.
  app.require_subcommand(0, 1);
  add_compile_command(app);
  add_precompile_command(app);
  add_tune_command(app);
  add_cache_command(app);
  try {
    app.parse(argc, argv);
  } catch (const Failure& e) {
    std::cerr << "lfce: " << e.what() << "\n";
    return e.get_exit_code();
  } catch (const CLI::Error& e) {
    if (const std::string flag = flag_given_a_value(e); !flag.empty()) {
      std::string given = flag;
      for (int i = 1; i < argc; ++i)
        if (std::string(argv[i]).rfind(flag + "=", 0) == 0) given = argv[i];
      std::cerr << flag << ": a flag takes no value, got '" << given << "'; give " << flag << " alone\n"
                << "Run with --help for more information.\n";
      return kExitUsage;
    }
    // Help, version and `verify`'s status pass through; every other CLI11 error is a usage error.
    const int status = app.exit(e);
    return status == 0 || e.get_name() == "RuntimeError" ? status : kExitUsage;
  } catch (const std::exception& e) {
    std::cerr << "lfce: internal error: " << e.what() << "\n";
    return kExitInternal;
  }
  if (app.get_subcommands().empty()) {
    std::cerr << "lfce: a command is required (compile, precompile, tune, cache); see lfce --help\n";
    return kExitUsage;
  }
  return kExitOk;
}
