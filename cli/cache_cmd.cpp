// lfce cache ls | info KEY | verify [--remove] | clear [--older-than DAYS]
#include <cstdio>
#include <ctime>

#include "cli/commands.h"
#include "cli/problem_options.h"

namespace lfce::cli {
namespace {

// `text` (read from the cache's files) made safe for a terminal: control characters (C0, DEL,
// C1 in UTF-8) and bytes that are not UTF-8 become \xNN, so a file cannot send escape
// sequences. With keep_lines, newlines and tabs stay (for the JSON of `info`).
std::string printable(const std::string& text, bool keep_lines = false) {
  std::string out;
  char hex[8];
  const auto escape = [&](unsigned char c) {
    std::snprintf(hex, sizeof hex, "\\x%02x", c);
    out += hex;
  };
  for (std::size_t i = 0; i < text.size();) {
    const auto c = static_cast<unsigned char>(text[i]);
    if (c < 0x80) {
      if ((c < 0x20 && !(keep_lines && (c == '\n' || c == '\t'))) || c == 0x7f) escape(c); else out += text[i];
      ++i;
      continue;
    }
    // A UTF-8 sequence: its length from the lead byte, then continuation bytes 10xxxxxx.
    const std::size_t length = c >= 0xc2 && c <= 0xdf ? 2 : c >= 0xe0 && c <= 0xef ? 3 : c >= 0xf0 && c <= 0xf4 ? 4 : 0;
    bool valid = length > 0 && i + length <= text.size();
    for (std::size_t k = 1; valid && k < length; ++k) valid = (static_cast<unsigned char>(text[i + k]) & 0xc0) == 0x80;
    const bool c1 = valid && c == 0xc2 && static_cast<unsigned char>(text[i + 1]) < 0xa0;  // U+0080..U+009F
    if (!valid || c1) {
      escape(c);
      ++i;
      continue;
    }
    out.append(text, i, length);
    i += length;
  }
  return out;
}

void print_entry(const lfce_cache_entry* e, void* user) {
  auto* count = static_cast<int*>(user);
  char when[32] = "?";
  const std::time_t t = static_cast<std::time_t>(e->created_unix);
  std::tm local{};
  if (localtime_r(&t, &local)) std::strftime(when, sizeof when, "%Y-%m-%d %H:%M", &local);
  const std::string regs = e->registers < 0 ? "-" : std::to_string(e->registers);
  std::printf("%.16s  %-5s %-7s %8.1f KB  %4s  %s  %s\n", printable(e->key).c_str(), e->kind,
              printable(e->arch).c_str(), e->bytes / 1024.0, regs.c_str(), when, printable(e->spec).c_str());
  *count += 1;
}

void print_line(const char* text, void*) { std::printf("%s\n", printable(text).c_str()); }
void print_json(const char* text, void*) { std::printf("%s\n", printable(text, /*keep_lines=*/true).c_str()); }

}  // namespace

void add_cache_command(CLI::App& app) {
  CLI::App* cache = app.add_subcommand("cache", "inspect and clean the kernel cache");
  // Not require_subcommand(1), which reports `lfce cache frob` as a missing command without
  // naming frob: an unknown word is an unexpected argument, named, and none is checked below.
  cache->require_subcommand(0, 1);
  cache->callback([cache] {
    if (cache->get_subcommands().empty())
      throw CLI::ValidationError("cache", "a command is required: ls, info, verify, clear");
  });
  auto cache_dir = std::make_shared<std::string>();
  cache->add_option("--cache-dir", *cache_dir, "cache directory (default: $LFCE_CACHE_DIR or ~/.cache/lfce)")
      ->check(non_empty());
  auto use_dir = [cache_dir] {
    if (!cache_dir->empty()) check(lfce_set_cache_dir(cache_dir->c_str()), "--cache-dir");
  };

  CLI::App* ls = cache->add_subcommand("ls", "list the cached kernels");
  ls->callback([use_dir] {
    use_dir();
    std::printf("cache: %s\n", printable(lfce_cache_dir()).c_str());
    int count = 0;
    check(lfce_cache_list(print_entry, &count), "cache ls");
    std::printf("%d entries\n", count);
  });

  auto key = std::make_shared<std::string>();
  CLI::App* info = cache->add_subcommand("info", "print one entry's metadata");
  info->add_option("key", *key, "entry key, or a unique prefix of it")->required();
  info->callback([use_dir, key] {
    use_dir();
    check(lfce_cache_info(key->c_str(), print_json, nullptr), "KEY");
  });

  auto remove = std::make_shared<bool>(false);
  CLI::App* verify = cache->add_subcommand("verify", "check every entry's checksums and versions");
  verify->add_flag("--remove", *remove, "delete the bad entries");
  verify->callback([use_dir, remove] {
    use_dir();
    int64_t checked = 0, bad = 0;
    const int status = lfce_cache_verify(*remove ? 1 : 0, print_line, nullptr, &checked, &bad);
    std::printf("%lld entries checked, %lld bad\n", static_cast<long long>(checked), static_cast<long long>(bad));
    check(status, "cache verify");
    if (bad > 0 && !*remove) throw CLI::RuntimeError(kExitBadEntries);
  });

  auto days = std::make_shared<double>(0);
  CLI::App* clear = cache->add_subcommand("clear", "remove cached kernels (only the files the cache wrote)");
  clear->add_option("--older-than", *days, "only entries older than this many days")->check(finite_at_least(0));
  clear->callback([use_dir, days] {
    use_dir();
    int64_t removed = 0, bytes = 0;
    const int status = lfce_cache_clear(*days, &removed, &bytes);
    std::printf("removed %lld entries (%.1f MB) from %s\n", static_cast<long long>(removed), bytes / 1e6,
                printable(lfce_cache_dir()).c_str());
    check(status, "--older-than");
  });

  // `lfce cache ls --cache-dir X` as well as `lfce cache --cache-dir X ls`.
  for (CLI::App* command : {ls, info, verify, clear}) command->fallthrough();
}

}  // namespace lfce::cli
