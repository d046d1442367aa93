// lfce cache ls | info KEY | verify [--remove] | clear [--older-than DAYS]
#include <cstdio>
#include <ctime>

#include "cli/commands.h"
#include "cli/problem_options.h"

namespace lfce::cli {
namespace {

void print_entry(const lfce_cache_entry* e, void* user) {
  auto* count = static_cast<int*>(user);
  char when[32];
  std::time_t t = static_cast<std::time_t>(e->created_unix);
  std::strftime(when, sizeof when, "%Y-%m-%d %H:%M", std::localtime(&t));
  std::string regs = e->registers < 0 ? "-" : std::to_string(e->registers);
  std::printf("%.16s  %-5s %-7s %8.1f KB  %4s  %s  %s\n", e->key, e->kind, e->arch, e->bytes / 1024.0, regs.c_str(),
              when, e->spec);
  *count += 1;
}

void print_text(const char* text, void*) { std::printf("%s\n", text); }

}  // namespace

void add_cache_command(CLI::App& app) {
  CLI::App* cache = app.add_subcommand("cache", "inspect and clean the kernel cache");
  cache->require_subcommand(1);
  auto cache_dir = std::make_shared<std::string>();
  cache->add_option("--cache-dir", *cache_dir, "cache directory (default: $LFCE_CACHE_DIR or ~/.cache/lfce)");
  auto use_dir = [cache_dir] {
    if (!cache_dir->empty()) check(lfce_set_cache_dir(cache_dir->c_str()), "--cache-dir");
  };

  CLI::App* ls = cache->add_subcommand("ls", "list the cached kernels");
  ls->callback([use_dir] {
    use_dir();
    std::printf("cache: %s\n", lfce_cache_dir());
    int count = 0;
    check(lfce_cache_list(print_entry, &count), "cache ls");
    std::printf("%d entries\n", count);
  });

  auto key = std::make_shared<std::string>();
  CLI::App* info = cache->add_subcommand("info", "print one entry's metadata");
  info->add_option("key", *key, "entry key, or a unique prefix of it")->required();
  info->callback([use_dir, key] {
    use_dir();
    check(lfce_cache_info(key->c_str(), print_text, nullptr), "KEY");
  });

  auto remove = std::make_shared<bool>(false);
  CLI::App* verify = cache->add_subcommand("verify", "check every entry's checksum and versions");
  verify->add_flag("--remove", *remove, "delete the bad entries");
  verify->callback([use_dir, remove] {
    use_dir();
    int64_t checked = 0, bad = 0;
    check(lfce_cache_verify(*remove ? 1 : 0, print_text, nullptr, &checked, &bad), "cache verify");
    std::printf("%lld entries checked, %lld bad\n", static_cast<long long>(checked), static_cast<long long>(bad));
    if (bad > 0 && !*remove) throw CLI::RuntimeError(1);
  });

  auto days = std::make_shared<double>(-1);
  CLI::App* clear = cache->add_subcommand("clear", "remove cached kernels");
  clear->add_option("--older-than", *days, "only entries older than this many days")->check(CLI::NonNegativeNumber);
  clear->callback([use_dir, days] {
    use_dir();
    int64_t removed = 0, bytes = 0;
    check(lfce_cache_clear(*days, &removed, &bytes), "cache clear");
    std::printf("removed %lld entries (%.1f MB) from %s\n", static_cast<long long>(removed), bytes / 1e6,
                lfce_cache_dir());
  });
}

}  // namespace lfce::cli
