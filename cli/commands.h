// Each subcommand registers itself on the app; its callback runs when it is chosen and
// throws CLI::Error (with a message naming the bad value) on failure.
#pragma once

#include <CLI/CLI.hpp>

namespace lfce::cli {

void add_compile_command(CLI::App& app);
void add_precompile_command(CLI::App& app);
void add_tune_command(CLI::App& app);
void add_cache_command(CLI::App& app);

}  // namespace lfce::cli
