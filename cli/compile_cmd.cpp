// lfce compile --vocab V --hidden H [...] [-o DIR]: writes <kernel>.ptx and <kernel>.json for
// every kernel of one configuration. Generation only: no GPU, no cache.
#include <nlohmann/json.hpp>

#include <cstdio>
#include <filesystem>
#include <fstream>
#include <iostream>

#include "cli/commands.h"
#include "cli/problem_options.h"

namespace lfce::cli {
namespace {

struct CompileOptions {
  int64_t vocab = 0;
  int64_t hidden = 0;
  std::string arch = "sm_90a";
  std::string out = ".";
  ProblemOptions problem;
};

struct Written {
  std::filesystem::path dir;
  std::vector<std::string> errors;
};

void write_kernel(const lfce_kernel_info* k, void* user) {
  auto* w = static_cast<Written*>(user);
  std::filesystem::path ptx = w->dir / (std::string(k->name) + ".ptx");
  std::filesystem::path meta = w->dir / (std::string(k->name) + ".json");
  std::ofstream(ptx) << k->ptx;
  nlohmann::json j = {{"kernel", k->name}, {"spec", k->spec},         {"ptx_bytes", k->ptx_size},
                      {"llvm_ms", k->compile_ms}, {"smem_bytes", k->smem_bytes}, {"threads", k->threads},
                      {"lfce_version", lfce_version()}};
  std::ofstream(meta) << j.dump(1) << "\n";
  std::printf("%-18s %8.1f KB  %7.1f ms  %s\n", k->name, k->ptx_size / 1024.0, k->compile_ms, ptx.c_str());
}

}  // namespace

void add_compile_command(CLI::App& app) {
  auto opts = std::make_shared<CompileOptions>();
  CLI::App* cmd = app.add_subcommand("compile", "emit PTX and metadata for the kernels of one configuration");
  cmd->add_option("--vocab,-V", opts->vocab, "vocabulary size V")->required()->check(at_least(1));
  cmd->add_option("--hidden,-H", opts->hidden, "hidden size H")->required()->check(at_least(1));
  cmd->add_option("--arch", opts->arch, "target: sm_90a or sm_80")->capture_default_str();
  cmd->add_option("-o,--output", opts->out, "folder for the .ptx and .json files")->capture_default_str();
  opts->problem.add_to(*cmd);
  cmd->callback([opts] {
    lfce_problem p = opts->problem.problem(opts->vocab, opts->hidden);
    check(lfce_check_problem(&p), "--vocab/--hidden/...");
    Written written{opts->out, {}};
    std::error_code ec;
    std::filesystem::create_directories(written.dir, ec);
    if (ec) throw CLI::ValidationError("--output", "cannot create " + opts->out + ": " + ec.message());
    check(lfce_generate(&p, opts->arch.c_str(), write_kernel, &written), "--arch");
  });
}

}  // namespace lfce::cli
