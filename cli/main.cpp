// lfce: the command line over liblfce's C API.
//   lfce compile     emit PTX and metadata for one configuration (no GPU needed)
//   lfce precompile  fill the kernel cache for model presets (no GPU needed)
//   lfce tune        autotuning sweep on the GPU, winners persisted in the cache
//   lfce cache       ls | info KEY | verify | clear
#include <CLI/CLI.hpp>

#include <exception>
#include <iostream>

#include "cli/commands.h"
#include "lfce/lfce.h"

namespace lfce::cli {

const char kExitStatusHelp[] =
    "Exit status: 0 success; 1 `cache verify` found bad entries; 2 usage error (an unknown command, option or "
    "value, named in the message); 3 failure (a file or folder, LLVM, the driver or the GPU; the message says "
    "what); 4 internal error (a bug in lfce).\n";

}  // namespace lfce::cli

int main(int argc, char** argv) {
  using namespace lfce::cli;
  CLI::App app{"lfce: fused linear + cross-entropy kernels, generated at run time"};
  app.set_version_flag("--version", std::string("lfce ") + lfce_version());
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
