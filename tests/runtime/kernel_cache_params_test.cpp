// The kernel cache uses a cached entry only with the parameter list its spec's template declares
// (runtime/kernel_cache.cpp): the runtime binds arguments by the entry's list, so an entry whose
// list differs (signed, its launch shape the spec's) is removed, logged and generated again.
#include <gtest/gtest.h>
#include <stdlib.h>

#include <filesystem>
#include <fstream>
#include <functional>
#include <iterator>
#include <string>
#include <utility>

#include "compiler/nvptx_backend.h"
#include "runtime/cache_entry.h"
#include "runtime/disk_cache.h"
#include "runtime/kernel_cache.h"
#include "tests/log_capture.h"
#include "tests/temp_dir.h"

namespace lfce::runtime {
namespace {

namespace fs = std::filesystem;

using testing_files::read_text;
using testing_files::TempDir;
using testing_files::write_text;

KernelSpec small_spec() {
  KernelSpec s;
  s.kind = KernelKind::LseCombine;
  s.vocab = 32000;
  s.hidden = 1024;
  s.arch = Arch::SM80;
  return s;
}

TEST(KernelCache, RegeneratesAnEntryWhoseParameterListIsNotItsTemplates) {
  const std::vector<std::pair<std::string, std::function<void(KernelSignature&)>>> edits = {
      {"two names swapped", [](KernelSignature& p) { std::swap(p[0].name, p[1].name); }},
      {"a type changed",
       [](KernelSignature& p) { p.back().type = p.back().type == ParamType::I32 ? ParamType::I64 : ParamType::I32; }},
      {"one parameter more", [](KernelSignature& p) { p.push_back({"extra", ParamType::GlobalPtr}); }}};
  for (const auto& [what, edit] : edits) {
    SCOPED_TRACE(what);
    TempDir dir;
    use_cache_dir(dir.path());
    const KernelSpec spec = small_spec();
    const PrecompileResult first = precompile(spec);
    ASSERT_FALSE(first.hit);
    const std::string path = dir.path() + "/kernels/" + first.key + ".json";
    Metadata stored = record_from_json(read_text(path));
    ASSERT_TRUE(stored.checksum_matches);
    const KernelSignature declared = stored.record.params;
    ASSERT_GE(declared.size(), 2u);
    edit(stored.record.params);
    ASSERT_NE(stored.record.params, declared);
    write_text(path, metadata_text(stored.record));  // signed again, as the cache signs
    // As far as the disk cache can tell, a valid entry: only the template's list tells it is stale.
    ASSERT_TRUE(DiskCache(dir.path()).load(first.key));

    testing_log::WarningCapture log;
    const int64_t emitted = emitted_module_count();
    const PrecompileResult second = precompile(spec);
    EXPECT_FALSE(second.hit);
    EXPECT_EQ(emitted_module_count(), emitted + 1);  // generated again
    EXPECT_EQ(log.count("declares the parameters"), 1) << log.text();
    EXPECT_NE(log.text().find(first.key), std::string::npos) << log.text();
    // Stored again with the template's list; from then on a hit, quietly.
    EXPECT_EQ(record_from_json(read_text(path)).record.params, declared);
    EXPECT_TRUE(precompile(spec).hit);
    EXPECT_EQ(emitted_module_count(), emitted + 1);
    EXPECT_EQ(log.count("declares the parameters"), 1) << log.text();
  }
}

}  // namespace
}  // namespace lfce::runtime
