// lfce compile --vocab V --hidden H [...] [-o DIR]: writes <kernel>.ptx and <kernel>.json for
// every kernel of one configuration (<kernel>.2.ptx and so on for a kind's second spec, such as
// eager_dz's constants and its pass). Generation only: no GPU, no cache.
#include <nlohmann/json.hpp>

#include <cerrno>
#include <cstdio>
#include <cstring>
#include <filesystem>
#include <map>
#include <string>

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
  std::string error;  // the first write that failed; nothing is written after it
  std::map<std::string, int> written;  // specs written per kernel name
};

// "" or "cannot write <path>: <reason>". Every write and the close are checked: a full disk
// may fail only when the buffer is flushed, NFS only at close.
std::string write_file(const std::filesystem::path& path, const std::string& data) {
  std::FILE* file = std::fopen(path.c_str(), "wb");
  if (!file) return "cannot write " + path.string() + ": " + std::strerror(errno);
  int error = std::fwrite(data.data(), 1, data.size(), file) == data.size() ? 0 : errno;
  if (std::fclose(file) != 0 && error == 0) error = errno;
  return error == 0 ? "" : "cannot write " + path.string() + ": " + std::strerror(error);
}

void write_kernel(const lfce_kernel_info* k, void* user) {
  auto* w = static_cast<Written*>(user);
  if (!w->error.empty()) return;
  const int nth = ++w->written[k->name];
  const std::string stem = std::string(k->name) + (nth > 1 ? "." + std::to_string(nth) : "");
  const std::filesystem::path ptx = w->dir / (stem + ".ptx");
  const std::filesystem::path meta = w->dir / (stem + ".json");
  nlohmann::json j = {{"kernel", k->name}, {"spec", k->spec},         {"ptx_bytes", k->ptx_size},
                      {"llvm_ms", k->compile_ms}, {"smem_bytes", k->smem_bytes}, {"threads", k->threads},
                      {"lfce_version", lfce_version()}};
  w->error = write_file(ptx, std::string(k->ptx, k->ptx_size));
  if (w->error.empty()) w->error = write_file(meta, j.dump(1) + "\n");
  if (w->error.empty())
    std::printf("%-18s %8.1f KB  %7.1f ms  %s\n", k->name, k->ptx_size / 1024.0, k->compile_ms, ptx.c_str());
}

}  // namespace

void add_compile_command(CLI::App& app) {
  auto opts = std::make_shared<CompileOptions>();
  CLI::App* cmd = app.add_subcommand("compile", "emit PTX and metadata for the kernels of one configuration");
  cmd->add_option("--vocab,-V", opts->vocab, "vocabulary size V")->required()->check(at_least(1));
  cmd->add_option("--hidden,-H", opts->hidden, "hidden size H")->required()->check(at_least(1));
  cmd->add_option("--arch", opts->arch, "target: sm_90a or sm_80")->capture_default_str();
  cmd->add_option("-o,--output", opts->out, "folder for the .ptx and .json files")
      ->check(non_empty())
      ->capture_default_str();
  opts->problem.add_to(*cmd);
  cmd->callback([opts] {
    lfce_problem p = opts->problem.problem(opts->vocab, opts->hidden);
    check(lfce_check_problem(&p), "--vocab/--hidden/...");
    Written written{opts->out, {}};
    std::error_code ec;
    std::filesystem::create_directories(written.dir, ec);
    if (ec) throw Failure("cannot create the output folder " + opts->out + ": " + ec.message());
    check(lfce_generate(&p, opts->arch.c_str(), write_kernel, &written), "--arch");
    if (!written.error.empty()) throw Failure(written.error);
  });
}

}  // namespace lfce::cli
