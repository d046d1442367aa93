// lfce: the command line over liblfce's C API.
//   lfce compile     emit PTX and metadata for one configuration (no GPU needed)
//   lfce precompile  fill the kernel cache for model presets (no GPU needed)
//   lfce tune        autotuning sweep on the GPU, winners persisted in the cache
//   lfce cache       ls | info KEY | verify | clear
#include <CLI/CLI.hpp>

#include <iostream>

#include "cli/commands.h"
#include "lfce/lfce.h"

int main(int argc, char** argv) {
  CLI::App app{"lfce: fused linear + cross-entropy kernels, generated at run time"};
  app.set_version_flag("--version", std::string("lfce ") + lfce_version());
  // Not require_subcommand(1): with it CLI11 reports an unknown command as a missing one,
  // without naming it.
  app.require_subcommand(0, 1);
  lfce::cli::add_compile_command(app);
  lfce::cli::add_precompile_command(app);
  lfce::cli::add_tune_command(app);
  lfce::cli::add_cache_command(app);
  CLI11_PARSE(app, argc, argv);
  if (app.get_subcommands().empty()) {
    std::cerr << "lfce: a command is required (compile, precompile, tune, cache); see lfce --help\n";
    return 2;
  }
  return 0;
}
