// The on-disk kernel cache, without a GPU: key derivation, atomic entries and their recovery,
// read-only and unusable directories, management, and many processes asking for one spec.
#include "runtime/disk_cache.h"

#include <fcntl.h>
#include <gtest/gtest.h>
#include <spdlog/sinks/ostream_sink.h>
#include <spdlog/spdlog.h>
#include <sys/prctl.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <unistd.h>
#include <utime.h>

#include <chrono>
#include <cmath>
#include <condition_variable>
#include <csignal>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <functional>
#include <limits>
#include <mutex>
#include <nlohmann/json.hpp>
#include <set>
#include <sstream>
#include <string>
#include <thread>
#include <tuple>
#include <vector>

#include "compiler/errors.h"
#include "compiler/nvptx_backend.h"
#include "runtime/cache_files.h"
#include "runtime/kernel_cache.h"
#include "runtime/options.h"
#include "runtime/sha256.h"
#include "templates/templates.h"
#include "tests/log_capture.h"
#include "tests/runtime/helper_process.h"
#include "tests/temp_dir.h"

namespace lfce::runtime {
namespace {

namespace fs = std::filesystem;
using nlohmann::json;

bool contains(const std::string& text, const std::string& part) { return text.find(part) != std::string::npos; }

using testing_files::read_text;
using testing_files::TempDir;
using testing_files::write_text;

using LogCapture = testing_log::WarningCapture;

KernelSpec small_spec(KernelKind kind = KernelKind::LossReduce) {
  KernelSpec s;
  s.kind = kind;
  s.vocab = 32000;
  s.hidden = 1024;
  s.arch = Arch::SM80;
  return s;
}

// A PTX entry as kernel_cache makes one, with a made-up payload: no LLVM needed.
Entry fake_ptx_entry(const KernelSpec& spec, const std::string& payload = "// ptx\n.visible .entry k()\n") {
  const PtxKeyInputs inputs = PtxKeyInputs::current(spec);
  Entry e;
  e.record.kind = EntryKind::Ptx;
  e.record.key = ptx_key(inputs);
  e.record.spec = inputs.spec;
  e.record.arch = std::string(arch_name(spec.arch));
  e.record.generator_version = inputs.generator_version;
  e.record.llvm_version = inputs.llvm_version;
  e.record.ptx_isa = inputs.ptx_isa;
  e.record.entry = "k";
  e.record.threads = kernel_threads(spec);  // the spec's launch shape, which the cache checks
  e.record.dynamic_smem_bytes = kernel_smem_bytes(spec);
  e.record.params = {{"targets", ParamType::GlobalPtr}, {"n", ParamType::I64}, {"splits", ParamType::I32}};
  e.record.compile_ms = 12.5;
  e.payload = payload;
  return e;
}

// ---- sha256 and keys ----

TEST(Sha256, MatchesTheFipsExamples) {
  EXPECT_EQ(sha256_hex(""), "e3b0c44298fc1c149afbf4c8996fb92427ae41e4649b934ca495991b7852b855");
  EXPECT_EQ(sha256_hex("abc"), "ba7816bf8f01cfea414140de5dae2223b00361a396177a9cb410ff61f20015ad");
  EXPECT_EQ(sha256_hex("abcdbcdecdefdefgefghfghighijhijkijkljklmklmnlmnomnopnopq"),
            "248d6a61d20638b8e5c026930c3e6039a33ce45964ff2167f6ecedd419db06c1");
  EXPECT_EQ(sha256_hex(std::string(1000000, 'a')),
            "cdc76e5c9914fb9281a1c7e284d73e67f1809a48a497200e046d39ccc7112cd0");
}

TEST(Sha256, GivesTheFipsDigestWhateverTheUpdateSizes) {
  const std::string data(1000000, 'a');  // FIPS 180-2's long example, fed in growing pieces
  Sha256 pieces;
  for (std::size_t at = 0, step = 1; at < data.size(); at += step, step = step * 2 + 1)
    pieces.update(std::string_view(data).substr(at, step));
  EXPECT_EQ(pieces.hex_digest(), "cdc76e5c9914fb9281a1c7e284d73e67f1809a48a497200e046d39ccc7112cd0");
}

TEST(CacheKey, EachPtxInputChangesTheKey) {
  const PtxKeyInputs base = PtxKeyInputs::current(small_spec());
  std::vector<PtxKeyInputs> variants(4, base);
  variants[0].generator_version += "x";
  variants[1].llvm_version = "19.1.0-other";
  variants[2].ptx_isa = "8.4";
  variants[3].spec = small_spec(KernelKind::LseCombine).text();
  std::set<std::string> keys = {ptx_key(base)};
  for (const PtxKeyInputs& v : variants) keys.insert(ptx_key(v));
  EXPECT_EQ(keys.size(), 5u);
}

TEST(CacheKey, EverySpecFieldChangesTheKey) {
  std::vector<KernelSpec> specs(6, small_spec(KernelKind::LseForward));
  specs[1].vocab += 1;
  specs[2].hidden += 8;
  specs[3].arch = Arch::SM90A;
  specs[4].tile.stages = 2;
  specs[5].dtype = DType::FP16;
  std::set<std::string> keys;
  for (const KernelSpec& s : specs) keys.insert(ptx_key(s));
  EXPECT_EQ(keys.size(), specs.size());
}

TEST(CacheKey, NothingButTheInputsEntersTheKey) {
  const KernelSpec a = small_spec();
  const KernelSpec b = KernelSpec::parse(a.text());  // another object, the same value
  EXPECT_EQ(ptx_key(a), ptx_key(b));
  EXPECT_EQ(ptx_key(a), ptx_key(PtxKeyInputs::current(a)));
  EXPECT_EQ(ptx_key(a).size(), 64u);
  // The inputs are this build's generator and toolchain, and the spec's canonical text.
  const PtxKeyInputs inputs = PtxKeyInputs::current(a);
  EXPECT_EQ(inputs.generator_version, kGeneratorVersion);
  EXPECT_EQ(inputs.llvm_version, LFCE_LLVM_VERSION);
  EXPECT_EQ(inputs.ptx_isa, "8.5");
  EXPECT_EQ(inputs.spec, a.text());
  // Neither the directory nor the cache object: two caches store it under one name.
  TempDir d1, d2;
  DiskCache c1(d1.path()), c2(d2.path());
  c1.store(fake_ptx_entry(a));
  c2.store(fake_ptx_entry(b));
  EXPECT_TRUE(fs::exists(d1.path() + "/kernels/" + ptx_key(a) + ".json"));
  EXPECT_TRUE(fs::exists(d2.path() + "/kernels/" + ptx_key(a) + ".json"));
}

TEST(CacheKey, CubinKeyNamesThePtxKeyAndEachTargetInput) {
  const std::string ptx = ptx_key(small_spec());
  const CubinTarget h200{9, 0, 13000};
  EXPECT_EQ(cubin_key(ptx, h200), ptx + ".sm90-drv13000");
  std::set<std::string> keys = {
      cubin_key(ptx, h200),
      cubin_key(ptx_key(small_spec(KernelKind::LseCombine)), h200),
      cubin_key(ptx, {8, 0, 13000}),
      cubin_key(ptx, {9, 1, 13000}),
      cubin_key(ptx, {9, 0, 12080}),
  };
  EXPECT_EQ(keys.size(), 5u);
}

TEST(CacheDir, FollowsLfceCacheDirThenXdgThenHome) {
  const auto saved = [](const char* name) {
    const char* v = std::getenv(name);
    return v ? std::optional<std::string>(v) : std::nullopt;
  };
  const auto lfce = saved("LFCE_CACHE_DIR"), xdg = saved("XDG_CACHE_HOME"), home = saved("HOME");
  setenv("LFCE_CACHE_DIR", "/a/lfce", 1);
  setenv("XDG_CACHE_HOME", "/b/xdg", 1);
  setenv("HOME", "/c/home", 1);
  EXPECT_EQ(default_cache_location(Options::from_env()).dir, "/a/lfce");
  unsetenv("LFCE_CACHE_DIR");
  EXPECT_EQ(default_cache_location(Options::from_env()).dir, "/b/xdg/lfce");
  setenv("XDG_CACHE_HOME", "relative", 1);  // the XDG spec says to ignore it
  EXPECT_EQ(default_cache_location(Options::from_env()).dir, "/c/home/.cache/lfce");
  unsetenv("XDG_CACHE_HOME");
  EXPECT_EQ(default_cache_location(Options::from_env()).dir, "/c/home/.cache/lfce");
  const auto restore = [](const char* name, const std::optional<std::string>& v) {
    v ? setenv(name, v->c_str(), 1) : unsetenv(name);
  };
  restore("LFCE_CACHE_DIR", lfce), restore("XDG_CACHE_HOME", xdg), restore("HOME", home);
}

// ---- entries on disk ----

TEST(DiskCache, StoresAnEntryThatAnotherCacheObjectLoads) {
  TempDir dir;
  const Entry e = fake_ptx_entry(small_spec());
  DiskCache(dir.path()).store(e);
  std::optional<Entry> loaded = DiskCache(dir.path()).load(e.record.key);
  ASSERT_TRUE(loaded);
  EXPECT_EQ(loaded->payload, e.payload);
  EXPECT_EQ(loaded->record.spec, e.record.spec);
  EXPECT_EQ(loaded->record.entry, "k");
  EXPECT_EQ(loaded->record.threads, 1024);  // loss_reduce's
  EXPECT_EQ(loaded->record.dynamic_smem_bytes, 8192);
  EXPECT_EQ(loaded->record.params, e.record.params);
  EXPECT_EQ(loaded->record.payload_bytes, e.payload.size());
  EXPECT_EQ(loaded->record.payload_sha256, sha256_hex(e.payload));
}

TEST(DiskCache, WritesMetadataWithEveryFieldAndNoTempFiles) {
  TempDir dir;
  const Entry e = fake_ptx_entry(small_spec());
  DiskCache(dir.path()).store(e);
  const std::string kernels = dir.path() + "/kernels/";
  std::set<std::string> names;
  for (const auto& f : fs::directory_iterator(kernels)) names.insert(f.path().filename().string());
  EXPECT_EQ(names, (std::set<std::string>{e.record.key + ".json", e.record.key + ".ptx"}));
  const json j = json::parse(read_text(kernels + e.record.key + ".json"));
  for (const char* field : {"spec", "generator_version", "llvm_version", "ptx_isa", "arch", "registers", "local_bytes",
                            "static_smem_bytes", "dynamic_smem_bytes", "params", "compile_ms", "created", "payload"})
    EXPECT_TRUE(j.contains(field)) << field;
  EXPECT_EQ(j["kind"], "ptx");
  EXPECT_EQ(j["arch"], "sm_80");
  EXPECT_EQ(j["generator_version"], kGeneratorVersion);
  EXPECT_EQ(j["payload"]["bytes"], e.payload.size());
  EXPECT_EQ(j["payload"]["sha256"], sha256_hex(e.payload));
  EXPECT_TRUE(j["registers"].is_null());  // known only once the driver compiled it
  EXPECT_EQ(j["params"], json::parse(R"([{"name": "targets", "type": "ptr"}, {"name": "n", "type": "i64"},
                                         {"name": "splits", "type": "i32"}])"));
}

TEST(DiskCache, KeepsACubinUnderTheKeyOfItsTarget) {
  TempDir dir;
  DiskCache cache(dir.path());
  Entry cubin = fake_ptx_entry(small_spec(), std::string("\x7f" "ELF-image", 10));
  const std::string ptx = cubin.record.key;
  cubin.record.kind = EntryKind::Cubin;
  cubin.record.target = {9, 0, 13000};
  cubin.record.key = cubin_key(ptx, cubin.record.target);
  cubin.record.registers = 128;
  cache.store(cubin);
  const std::optional<Entry> loaded = DiskCache(dir.path()).load(cubin.record.key);
  ASSERT_TRUE(loaded);
  EXPECT_EQ(loaded->payload, cubin.payload);
  EXPECT_EQ(loaded->record.kind, EntryKind::Cubin);
  EXPECT_EQ(loaded->record.registers, 128);
  EXPECT_EQ(loaded->record.target.driver_version, 13000);
  EXPECT_TRUE(fs::exists(dir.path() + "/kernels/" + cubin.record.key + ".cubin"));
  const json j = json::parse(cache.info(cubin.record.key));
  EXPECT_EQ(j["driver_version"], 13000);
  EXPECT_EQ(j["compute_capability"]["major"], 9);
  // Another driver or GPU is another key, and no PTX entry came with the cubin.
  EXPECT_FALSE(cache.load(cubin_key(ptx, {9, 0, 13010})));
  EXPECT_FALSE(cache.load(ptx));
}

// Runs get_or_create with a producer that counts its calls.
struct CountingProducer {
  Entry entry;
  int calls = 0;
  DiskCache::Lookup operator()(DiskCache& cache) {
    return cache.get_or_create(entry.record.key, [this] {
      ++calls;
      return entry;
    });
  }
};

// A damaged entry is a logged miss; the entry is produced again and overwritten.
void expect_recovery(const std::function<void(const std::string& kernels, const Entry&)>& damage,
                     const std::string& problem) {
  TempDir dir;
  CountingProducer producer{fake_ptx_entry(small_spec())};
  const std::string key = producer.entry.record.key;
  {
    DiskCache cache(dir.path());
    producer(cache);
  }
  damage(dir.path() + "/kernels/", producer.entry);
  LogCapture log;
  DiskCache cache(dir.path());
  const DiskCache::Lookup again = producer(cache);
  EXPECT_FALSE(again.hit);
  EXPECT_EQ(producer.calls, 2);
  EXPECT_EQ(again.entry.payload, producer.entry.payload);
  EXPECT_TRUE(contains(log.text(), "/kernels/" + key)) << log.text();
  EXPECT_TRUE(contains(log.text(), problem)) << log.text();
  // Overwritten: a new cache object finds a valid entry, and nothing is bad.
  EXPECT_TRUE(producer(*std::make_unique<DiskCache>(dir.path())).hit);
  EXPECT_TRUE(cache.verify(false).bad.empty());
}

TEST(DiskCache, RegeneratesATruncatedPayload) {
  expect_recovery(
      [](const std::string& kernels, const Entry& e) {
        fs::resize_file(kernels + e.record.key + ".ptx", e.payload.size() / 2);
      },
      "truncated");
}

TEST(DiskCache, RegeneratesAPayloadWithAWrongChecksum) {
  expect_recovery(
      [](const std::string& kernels, const Entry& e) {
        std::string bytes = e.payload;
        bytes[3] ^= 0x20;  // same size, one bit
        write_text(kernels + e.record.key + ".ptx", bytes);
      },
      "sha256");
}

TEST(DiskCache, RegeneratesAnEntryOfAStaleGeneratorVersion) {
  expect_recovery(
      [](const std::string& kernels, const Entry& e) {
        json j = json::parse(read_text(kernels + e.record.key + ".json"));
        j["generator_version"] = "lfce-gen-0";
        write_text(kernels + e.record.key + ".json", j.dump());
      },
      "stale generator version 'lfce-gen-0'");
}

TEST(DiskCache, RegeneratesMetadataThatDoesNotParse) {
  expect_recovery(
      [](const std::string& kernels, const Entry& e) {
        write_text(kernels + e.record.key + ".json", "{\"format\": 1,");  // cut short
      },
      "metadata is not valid");
}

TEST(DiskCache, RegeneratesAnEntryWhoseMetadataBelongsToAnotherSpec) {
  expect_recovery(
      [](const std::string& kernels, const Entry& e) {
        json j = json::parse(read_text(kernels + e.record.key + ".json"));
        j["spec"] = small_spec(KernelKind::LseCombine).text();
        write_text(kernels + e.record.key + ".json", j.dump());
      },
      "not its own");
}

TEST(DiskCache, TreatsAPayloadWithoutMetadataAsAMiss) {
  TempDir dir;
  const Entry e = fake_ptx_entry(small_spec());
  fs::create_directories(dir.path() + "/kernels");
  write_text(dir.path() + "/kernels/" + e.record.key + ".ptx", e.payload);  // crashed before the commit
  LogCapture log;
  CountingProducer producer{e};
  DiskCache cache(dir.path());
  EXPECT_FALSE(producer(cache).hit);
  EXPECT_EQ(log.text(), "");  // an absent entry is an ordinary miss
}

// ---- directories that cannot be written ----

TEST(DiskCache, KeepsEntriesInMemoryWhenTheDirectoryCannotBeCreatedAndSaysSoOnce) {
  TempDir tmp;
  write_text(tmp.path() + "/file", "");
  const std::string dir = tmp.path() + "/file/cache";  // ENOTDIR, for root too
  LogCapture log;
  DiskCache cache(dir);
  EXPECT_FALSE(cache.persistent());
  CountingProducer a{fake_ptx_entry(small_spec())}, b{fake_ptx_entry(small_spec(KernelKind::LseCombine))};
  EXPECT_FALSE(a(cache).hit);
  EXPECT_TRUE(a(cache).hit);
  EXPECT_FALSE(b(cache).hit);
  EXPECT_EQ(a.calls, 1);
  EXPECT_EQ(log.count("cannot be written"), 1) << log.text();
  EXPECT_TRUE(contains(log.text(), "'" + dir + "'")) << log.text();
  EXPECT_TRUE(contains(log.text(), "in memory")) << log.text();
}

// Checks made by a process that cannot write `dir`, which holds the entry of small_spec();
// 0 if all pass, else the number of the first that failed.
int read_only_checks(const std::string& dir) {
  DiskCache cache(dir);
  CountingProducer present{fake_ptx_entry(small_spec())}, absent{fake_ptx_entry(small_spec(KernelKind::LseCombine))};
  if (!present(cache).hit || present.calls != 0) return 1;  // entries on disk are still read
  if (absent(cache).hit || absent.calls != 1) return 2;     // a new one is produced
  if (!absent(cache).hit || absent.calls != 1) return 3;    // and then kept in memory
  if (cache.persistent()) return 4;
  return 0;
}

TEST(DiskCache, ReadsAReadOnlyDirectoryAndKeepsNewEntriesInMemory) {
  TempDir dir;
  DiskCache(dir.path()).store(fake_ptx_entry(small_spec()));
  for (const std::string& d : {dir.path() + "/kernels", dir.path() + "/locks", dir.path()})
    fs::permissions(d, fs::perms::owner_read | fs::perms::owner_exec | fs::perms::group_read |
                           fs::perms::group_exec | fs::perms::others_read | fs::perms::others_exec);
  // Root ignores permissions: run the checks in a child that drops to user nobody.
  const pid_t child = fork();
  ASSERT_GE(child, 0);
  if (child == 0) {
    if (geteuid() == 0 && (setgid(65534) != 0 || setuid(65534) != 0)) _exit(100);
    _exit(read_only_checks(dir.path()));
  }
  int status = 0;
  ASSERT_EQ(waitpid(child, &status, 0), child);
  ASSERT_TRUE(WIFEXITED(status));
  ASSERT_NE(WEXITSTATUS(status), 100) << "could not drop root privileges to test a read-only directory";
  EXPECT_EQ(WEXITSTATUS(status), 0) << "read_only_checks failed at check " << WEXITSTATUS(status);
  std::size_t files = 0;
  for (auto it = fs::directory_iterator(dir.path() + "/kernels"); it != fs::directory_iterator(); ++it) ++files;
  EXPECT_EQ(files, 2u);  // nothing was written
}

// ---- management ----

// Rewrites an entry's creation time, as if it had been made `days` ago.
void age_entry(const std::string& dir, const std::string& key, double days) {
  const std::string path = dir + "/kernels/" + key + ".json";
  json j = json::parse(read_text(path));
  j["created_unix"] = j["created_unix"].get<std::int64_t>() - static_cast<std::int64_t>(days * 86400);
  write_text(path, j.dump());
}

TEST(DiskCache, ListsEntriesWithTheirSpecKindSizeAndArch) {
  TempDir dir;
  DiskCache cache(dir.path());
  const Entry e = fake_ptx_entry(small_spec());
  cache.store(e);
  const std::vector<EntryRecord> entries = cache.list();
  ASSERT_EQ(entries.size(), 1u);
  EXPECT_EQ(entries[0].key, e.record.key);
  EXPECT_EQ(entries[0].spec, e.record.spec);
  EXPECT_EQ(entries[0].kind, EntryKind::Ptx);
  EXPECT_EQ(entries[0].payload_bytes, e.payload.size());
  EXPECT_EQ(entries[0].arch, "sm_80");
  EXPECT_GT(entries[0].created_unix, 0);
}

TEST(DiskCache, InfoFindsAnEntryByKeyOrUniquePrefix) {
  TempDir dir;
  DiskCache cache(dir.path());
  const Entry e = fake_ptx_entry(small_spec());
  cache.store(e);
  const std::string& key = e.record.key;
  EXPECT_EQ(json::parse(cache.info(key))["spec"], e.record.spec);
  EXPECT_EQ(json::parse(cache.info(key.substr(0, 8)))["key"], key);
  try {
    cache.info("0123456789abcdef");
    FAIL() << "info of a missing key";
  } catch (const std::invalid_argument& error) {
    EXPECT_TRUE(contains(error.what(), "0123456789abcdef")) << error.what();
  }
}

TEST(DiskCache, InfoRejectsAnAmbiguousPrefix) {
  TempDir dir;
  DiskCache cache(dir.path());
  cache.store(fake_ptx_entry(small_spec()));
  cache.store(fake_ptx_entry(small_spec(KernelKind::LseCombine)));
  EXPECT_THROW(cache.info(""), std::invalid_argument);
}

TEST(DiskCache, VerifyReportsAndRemovesBadEntriesAndLeftovers) {
  TempDir dir;
  DiskCache cache(dir.path());
  const Entry good = fake_ptx_entry(small_spec()), bad = fake_ptx_entry(small_spec(KernelKind::LseCombine));
  cache.store(good);
  cache.store(bad);
  const std::string kernels = dir.path() + "/kernels/";
  fs::resize_file(kernels + bad.record.key + ".ptx", 3);
  // Leftovers of interrupted writes, an hour old (younger ones may be writes in progress).
  const std::string orphan = ptx_key(small_spec(KernelKind::GradBias)) + ".ptx";
  const std::string temp = ".tmp-" + good.record.key + ".json-a1B2c3";
  write_text(kernels + temp, "partial");
  write_text(kernels + orphan, "orphan");
  for (const std::string& name : {temp, orphan}) {
    const utimbuf old{std::time(nullptr) - 3600, std::time(nullptr) - 3600};
    utime((kernels + name).c_str(), &old);
  }
  const VerifyReport report = cache.verify(false);
  EXPECT_EQ(report.checked, 2u);
  ASSERT_EQ(report.bad.size(), 3u);
  std::set<std::string> files;
  for (const BadEntry& b : report.bad) {
    files.insert(fs::path(b.file).filename().string());
    EXPECT_FALSE(b.removed);
    EXPECT_FALSE(b.problem.empty());
  }
  EXPECT_EQ(files, (std::set<std::string>{bad.record.key + ".ptx", temp, orphan}));
  for (const BadEntry& b : cache.verify(true).bad) EXPECT_TRUE(b.removed) << b.file;
  const VerifyReport after = cache.verify(false);
  EXPECT_EQ(after.checked, 1u);
  EXPECT_TRUE(after.bad.empty());
  EXPECT_TRUE(cache.load(good.record.key));
}

TEST(DiskCache, ClearRemovesEntriesOlderThanTheGivenDays) {
  TempDir dir;
  DiskCache cache(dir.path());
  const Entry recent = fake_ptx_entry(small_spec()), old = fake_ptx_entry(small_spec(KernelKind::LseCombine));
  cache.store(recent);
  cache.store(old);
  age_entry(dir.path(), old.record.key, 10);
  const ClearReport aged = cache.clear(7.0);
  EXPECT_EQ(aged.removed, 1u);
  EXPECT_GT(aged.bytes, old.payload.size());
  EXPECT_FALSE(fs::exists(dir.path() + "/kernels/" + old.record.key + ".ptx"));
  EXPECT_TRUE(cache.load(recent.record.key));
  EXPECT_EQ(cache.clear().removed, 1u);
  EXPECT_TRUE(cache.list().empty());
  EXPECT_TRUE(fs::is_empty(dir.path() + "/kernels"));
}

// ---- what the cache may touch: key-shaped names it wrote, never through a link ----

// Files a user keeps in the cache's folders: clear and verify must leave them alone. Aged an
// hour, so that none is a write in progress.
const std::vector<std::string> kUserFiles = {"notes.txt", "model.json", "weights.ptx", "0000.cubin", ".tmp-mine"};

void put_user_files(const std::string& folder) {
  fs::create_directories(folder);
  for (const std::string& name : kUserFiles) {
    write_text(folder + "/" + name, "mine\n");
    const utimbuf old{std::time(nullptr) - 3600, std::time(nullptr) - 3600};
    utime((folder + "/" + name).c_str(), &old);
  }
}

void expect_user_files(const std::string& folder) {
  for (const std::string& name : kUserFiles)
    EXPECT_EQ(read_text(folder + "/" + name), "mine\n") << folder << "/" << name << " was touched";
}

TEST(DiskCache, ClearAndVerifyLeaveFilesWhoseNamesAreNotKeys) {
  TempDir dir;
  DiskCache cache(dir.path());
  const Entry e = fake_ptx_entry(small_spec());
  cache.store(e);
  put_user_files(dir.path() + "/kernels");
  put_user_files(dir.path() + "/locks");
  const VerifyReport report = cache.verify(true);
  EXPECT_TRUE(report.bad.empty()) << report.bad.front().file << ": " << report.bad.front().problem;
  EXPECT_EQ(cache.clear().removed, 1u);
  EXPECT_FALSE(fs::exists(dir.path() + "/kernels/" + e.record.key + ".json"));
  expect_user_files(dir.path() + "/kernels");
  expect_user_files(dir.path() + "/locks");
}

// `<cache>/kernels` is a link to another cache's entries (and the user's files there).
std::string link_kernels_elsewhere(const TempDir& dir) {
  const std::string elsewhere = dir.path() + "/elsewhere";
  DiskCache(elsewhere).store(fake_ptx_entry(small_spec()));
  put_user_files(elsewhere + "/kernels");
  fs::create_directories(dir.path() + "/cache");
  fs::create_directory_symlink(elsewhere + "/kernels", dir.path() + "/cache/kernels");
  return elsewhere + "/kernels";
}

void expect_untouched(const std::string& kernels) {
  std::size_t files = 0;
  for (auto it = fs::directory_iterator(kernels); it != fs::directory_iterator(); ++it) ++files;
  EXPECT_EQ(files, kUserFiles.size() + 2) << "files behind the link were removed";
  expect_user_files(kernels);
}

void expect_refused_link(const std::function<void()>& call, const std::string& link) {
  try {
    call();
    FAIL() << "a symbolic link at " << link << " was followed";
  } catch (const CacheError& e) {
    EXPECT_TRUE(contains(e.what(), link)) << e.what();
    EXPECT_TRUE(contains(e.what(), "symbolic link")) << e.what();
  }
}

TEST(DiskCache, ClearRefusesAKernelsFolderThatIsASymbolicLink) {
  TempDir dir;
  const std::string target = link_kernels_elsewhere(dir);
  DiskCache cache(dir.path() + "/cache");
  expect_refused_link([&] { cache.clear(); }, dir.path() + "/cache/kernels");
  expect_untouched(target);
}

TEST(DiskCache, VerifyRefusesAKernelsFolderThatIsASymbolicLink) {
  TempDir dir;
  const std::string target = link_kernels_elsewhere(dir);
  DiskCache cache(dir.path() + "/cache");
  expect_refused_link([&] { cache.verify(true); }, dir.path() + "/cache/kernels");
  expect_untouched(target);
}

TEST(DiskCache, KeepsEntriesInMemoryWhenTheKernelsFolderIsASymbolicLink) {
  TempDir dir;
  const std::string target = link_kernels_elsewhere(dir);
  LogCapture log;
  DiskCache cache(dir.path() + "/cache");
  CountingProducer producer{fake_ptx_entry(small_spec(KernelKind::LseCombine))};
  EXPECT_FALSE(producer(cache).hit);
  EXPECT_TRUE(producer(cache).hit);
  EXPECT_FALSE(cache.persistent());
  EXPECT_FALSE(cache.load(fake_ptx_entry(small_spec()).record.key)) << "read through the link";
  EXPECT_TRUE(contains(log.text(), dir.path() + "/cache/kernels")) << log.text();
  EXPECT_TRUE(contains(log.text(), "symbolic link")) << log.text();
  expect_untouched(target);
}

TEST(DiskCache, FollowsACacheRootLinkTheUserNamed) {
  TempDir dir;
  fs::create_directories(dir.path() + "/real");
  fs::create_directory_symlink(dir.path() + "/real", dir.path() + "/link");
  const Entry e = fake_ptx_entry(small_spec());
  DiskCache(dir.path() + "/link").store(e);
  EXPECT_TRUE(fs::exists(dir.path() + "/real/kernels/" + e.record.key + ".json"));
  EXPECT_TRUE(DiskCache(dir.path() + "/link").load(e.record.key));
}

TEST(DiskCache, RefusesADerivedCacheRootThatIsASymbolicLink) {
  TempDir dir;
  fs::create_directories(dir.path() + "/real");
  fs::create_directory_symlink(dir.path() + "/real", dir.path() + "/lfce");
  LogCapture log;
  DiskCache cache(dir.path() + "/lfce", /*named_by_user=*/false);
  cache.store(fake_ptx_entry(small_spec()));
  EXPECT_FALSE(cache.persistent());
  EXPECT_TRUE(fs::is_empty(dir.path() + "/real"));
  EXPECT_TRUE(contains(log.text(), dir.path() + "/lfce")) << log.text();
  EXPECT_TRUE(contains(log.text(), "LFCE_CACHE_DIR")) << log.text();
  expect_refused_link([&] { cache.clear(); }, dir.path() + "/lfce");
}

TEST(DiskCache, DoesNotCreateAFileThroughALockFileLink) {
  TempDir dir;
  DiskCache cache(dir.path() + "/cache");
  CountingProducer producer{fake_ptx_entry(small_spec())};
  const std::string victim = dir.path() + "/victim";
  fs::create_symlink(victim, dir.path() + "/cache/locks/" + producer.entry.record.key + ".lock");
  EXPECT_FALSE(producer(cache).hit);
  EXPECT_FALSE(fs::exists(victim)) << "the lock file's link was followed";
  EXPECT_TRUE(cache.load(producer.entry.record.key));
}

// Sets Options::current()'s cache lock timeout for the life of the object.
class LockTimeout {
 public:
  explicit LockTimeout(double seconds) : previous_(Options::current()) {
    Options o = previous_;
    o.cache_lock_timeout_s = seconds;
    Options::set_current(o);
  }
  ~LockTimeout() { Options::set_current(previous_); }

 private:
  Options previous_;
};

// A process stopped while it holds a kernel's lock (Ctrl-Z, a debugger, a suspended job) delays
// the others by the lock timeout, not forever: they go on unlocked and say which lock, held by whom.
TEST(DiskCache, GoesOnWithoutTheLockOfAStoppedHolderAfterTheTimeout) {
  TempDir dir;
  DiskCache cache(dir.path());
  CountingProducer producer{fake_ptx_entry(small_spec())};
  const std::string lock_name = producer.entry.record.key + ".lock";
  const pid_t parent = getpid();
  const pid_t holder = fork();
  if (holder == 0) {
    // The holder dies with this test (even stopped: SIGKILL ends a stopped process) and keeps
    // none of its output pipes open, so a test that aborts can never leave a stopped process
    // that holds ctest's pipe and hangs the suite.
    prctl(PR_SET_PDEATHSIG, SIGKILL);
    if (getppid() != parent) _exit(4);
    const int null = open("/dev/null", O_WRONLY);
    if (null < 0 || dup2(null, 1) < 0 || dup2(null, 2) < 0) _exit(5);
    DirFd locks;
    if (open_directory(dir.path() + "/locks", true, false, locks) != 0) _exit(2);
    FileLock lock(locks, dir.path() + "/locks", lock_name, std::chrono::milliseconds{0});
    if (!lock.held()) _exit(3);
    raise(SIGSTOP);  // stopped with the lock held
    _exit(0);
  }
  ASSERT_GT(holder, 0);
  int status = 0;
  ASSERT_EQ(waitpid(holder, &status, WUNTRACED), holder);
  ASSERT_TRUE(WIFSTOPPED(status)) << "the holder did not take the lock (exit status " << WEXITSTATUS(status) << ")";
  // Watchdog: should the wait not end by itself, ending the holder releases the lock, so that
  // this test fails on its timing instead of hanging.
  std::mutex mutex;
  std::condition_variable done;
  bool finished = false;
  std::thread watchdog([&] {
    std::unique_lock<std::mutex> lock(mutex);
    if (!done.wait_for(lock, std::chrono::seconds(20), [&] { return finished; })) kill(holder, SIGKILL);
  });
  LockTimeout timeout(0.3);
  LogCapture capture;
  const auto start = std::chrono::steady_clock::now();
  const DiskCache::Lookup lookup = producer(cache);
  const double waited = std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
  {
    std::lock_guard<std::mutex> lock(mutex);
    finished = true;
  }
  done.notify_one();
  watchdog.join();
  kill(holder, SIGKILL);
  waitpid(holder, &status, 0);
  EXPECT_LT(waited, 10.0) << "get_or_create waited for the stopped holder instead of timing out";
  EXPECT_GE(waited, 0.3);
  EXPECT_FALSE(lookup.hit);
  EXPECT_EQ(producer.calls, 1);
  EXPECT_TRUE(cache.load(producer.entry.record.key)) << "the entry was not stored";
  const std::string log = capture.text();
  EXPECT_TRUE(contains(log, dir.path() + "/locks/" + lock_name)) << log;
  EXPECT_TRUE(contains(log, "held by process " + std::to_string(holder))) << log;
  EXPECT_TRUE(contains(log, "LFCE_CACHE_LOCK_TIMEOUT")) << log;
}

TEST(Options, RejectsACacheLockTimeoutThatIsNotANumberOfSeconds) {
  for (const char* bad : {"-1", "soon", "nan", "1e9", "60s"}) {
    SCOPED_TRACE(bad);
    setenv("LFCE_CACHE_LOCK_TIMEOUT", bad, 1);
    try {
      Options::from_env();
      ADD_FAILURE() << "accepted";
    } catch (const SpecError& e) {
      EXPECT_TRUE(contains(e.what(), std::string("LFCE_CACHE_LOCK_TIMEOUT = '") + bad + "'")) << e.what();
      EXPECT_TRUE(contains(e.what(), "seconds in [0, 86400]")) << e.what();
    }
  }
  setenv("LFCE_CACHE_LOCK_TIMEOUT", "0.5", 1);
  EXPECT_EQ(Options::from_env().cache_lock_timeout_s, 0.5);
  unsetenv("LFCE_CACHE_LOCK_TIMEOUT");
  EXPECT_EQ(Options::from_env().cache_lock_timeout_s, 60);
}

TEST(Options, ExperimentalPathsAreOneSwitchAndTheFormerVariablesNameIt) {
  setenv("LFCE_EXPERIMENTAL", "eager_operand,eager_dz_kernel", 1);
  Options both = Options::from_env();
  EXPECT_TRUE(both.eager_operand);
  EXPECT_FALSE(both.eager_fixup);
  unsetenv("LFCE_EXPERIMENTAL");
  Options none = Options::from_env();
  EXPECT_FALSE(none.eager_operand);
  EXPECT_TRUE(none.eager_fixup);
  for (const char* bad : {"eager_operand,", "fast", "eager_operand,,eager_dz_kernel"}) {
    SCOPED_TRACE(bad);
    setenv("LFCE_EXPERIMENTAL", bad, 1);
    try {
      Options::from_env();
      ADD_FAILURE() << "accepted";
    } catch (const SpecError& e) {
      EXPECT_TRUE(contains(e.what(), std::string("LFCE_EXPERIMENTAL = '") + bad + "': unknown switch")) << e.what();
      EXPECT_TRUE(contains(e.what(), "eager_operand and eager_dz_kernel")) << e.what();
    }
  }
  unsetenv("LFCE_EXPERIMENTAL");
  for (const char* old : {"LFCE_EAGER_OPERAND", "LFCE_EAGER_FIXUP"}) {
    SCOPED_TRACE(old);
    setenv(old, "1", 1);
    try {
      Options::from_env();
      ADD_FAILURE() << "accepted";
    } catch (const SpecError& e) {
      EXPECT_TRUE(contains(e.what(), std::string(old) + " is no longer read")) << e.what();
      EXPECT_TRUE(contains(e.what(), "LFCE_EXPERIMENTAL=")) << e.what();
    }
    unsetenv(old);
  }
}

// Checks made by a process that cannot write the folders of `dir`, which holds the entry of
// small_spec(): clear and verify --remove say what they could not remove, and leave the entry
// whole. 0 if all pass, else the number of the first that failed.
int read_only_removal_checks(const std::string& dir) {
  DiskCache cache(dir);
  const std::string key = ptx_key(small_spec());
  const ClearReport cleared = cache.clear();
  if (cleared.removed != 0 || cleared.failures.size() != 2) return 1;  // the entry's metadata, the leftover
  const std::string failures = cleared.failures[0] + "\n" + cleared.failures[1];
  if (!contains(failures, "cannot remove " + dir + "/kernels/" + key + ".json")) return 2;
  if (!contains(failures, "Permission denied")) return 3;
  if (!cache.load(key)) return 4;  // the payload stays with its metadata
  const VerifyReport verified = cache.verify(true);
  if (verified.bad.size() != 1 || verified.bad[0].removed) return 5;
  if (!contains(verified.bad[0].not_removed, "cannot remove " + dir + "/kernels/")) return 6;
  return 0;
}

TEST(DiskCache, ClearAndVerifySayWhatAReadOnlyFolderKeeps) {
  TempDir dir;
  const Entry e = fake_ptx_entry(small_spec());
  DiskCache(dir.path()).store(e);
  // A leftover for verify --remove to flag, an hour old.
  const std::string leftover = dir.path() + "/kernels/" + ptx_key(small_spec(KernelKind::GradBias)) + ".ptx";
  write_text(leftover, "orphan");
  const utimbuf old{std::time(nullptr) - 3600, std::time(nullptr) - 3600};
  utime(leftover.c_str(), &old);
  for (const std::string& d : {dir.path() + "/kernels", dir.path() + "/locks", dir.path()})
    fs::permissions(d, fs::perms::owner_read | fs::perms::owner_exec | fs::perms::group_read |
                           fs::perms::group_exec | fs::perms::others_read | fs::perms::others_exec);
  const pid_t child = fork();  // as user nobody: root ignores permissions
  ASSERT_GE(child, 0);
  if (child == 0) {
    if (geteuid() == 0 && (setgid(65534) != 0 || setuid(65534) != 0)) _exit(100);
    _exit(read_only_removal_checks(dir.path()));
  }
  int status = 0;
  ASSERT_EQ(waitpid(child, &status, 0), child);
  ASSERT_TRUE(WIFEXITED(status));
  ASSERT_NE(WEXITSTATUS(status), 100) << "could not drop root privileges to test a read-only directory";
  EXPECT_EQ(WEXITSTATUS(status), 0) << "read_only_removal_checks failed at check " << WEXITSTATUS(status);
}

// ---- files that are not what they should be ----

// Runs `body` in a child process that is killed after `seconds`: a test of something that
// used to hang fails instead of hanging the suite. `body` returns 0 when its checks pass.
void expect_finishes(const std::function<int()>& body, unsigned seconds = 10) {
  const pid_t child = fork();
  ASSERT_GE(child, 0);
  if (child == 0) {
    alarm(seconds);
    _exit(body());
  }
  int status = 0;
  ASSERT_EQ(waitpid(child, &status, 0), child);
  ASSERT_FALSE(WIFSIGNALED(status) && WTERMSIG(status) == SIGALRM) << "hung for " << seconds << " s";
  ASSERT_TRUE(WIFEXITED(status)) << "died of signal " << WTERMSIG(status);
  EXPECT_EQ(WEXITSTATUS(status), 0) << "check " << WEXITSTATUS(status) << " failed";
}

void replace_with_fifo(const std::string& path) {
  fs::remove(path);
  ASSERT_EQ(mkfifo(path.c_str(), 0644), 0) << path;
}

TEST(DiskCache, AFifoInPlaceOfAPayloadIsAMissNotAHang) {
  TempDir dir;
  const Entry e = fake_ptx_entry(small_spec());
  DiskCache(dir.path()).store(e);
  replace_with_fifo(dir.path() + "/kernels/" + e.record.key + ".ptx");
  expect_finishes([&] {
    DiskCache cache(dir.path());
    if (cache.load(e.record.key)) return 1;
    const VerifyReport report = cache.verify(false);
    if (report.bad.size() != 1 || !contains(report.bad[0].problem, "not a regular file")) return 2;
    CountingProducer producer{e};
    if (producer(cache).hit || !cache.persistent()) return 3;  // the FIFO is replaced by the new payload
    return DiskCache(dir.path()).load(e.record.key) ? 0 : 4;
  });
}

TEST(DiskCache, AFifoInPlaceOfMetadataIsFlaggedNotAHang) {
  TempDir dir;
  const Entry e = fake_ptx_entry(small_spec());
  DiskCache(dir.path()).store(e);
  replace_with_fifo(dir.path() + "/kernels/" + e.record.key + ".json");
  expect_finishes([&] {
    DiskCache cache(dir.path());
    if (cache.load(e.record.key)) return 1;
    const VerifyReport report = cache.verify(false);
    if (report.bad.size() != 1 || !contains(report.bad[0].file, e.record.key + ".json")) return 2;
    return 0;
  });
}

TEST(DiskCache, ADirectoryInPlaceOfAPayloadKeepsOnlyThatEntryInMemory) {
  TempDir dir;
  CountingProducer blocked{fake_ptx_entry(small_spec())}, other{fake_ptx_entry(small_spec(KernelKind::LseCombine))};
  const std::string in_the_way = dir.path() + "/kernels/" + blocked.entry.record.key + ".ptx";
  fs::create_directories(in_the_way);
  LogCapture log;
  DiskCache cache(dir.path());
  EXPECT_FALSE(blocked(cache).hit);
  EXPECT_TRUE(blocked(cache).hit);  // kept in memory
  EXPECT_EQ(blocked.calls, 1);
  EXPECT_TRUE(cache.persistent());
  EXPECT_TRUE(contains(log.text(), in_the_way)) << log.text();
  EXPECT_FALSE(other(cache).hit);
  EXPECT_TRUE(DiskCache(dir.path()).load(other.entry.record.key)) << "persistence was lost for other entries";
}

TEST(DiskCache, FlagsAHugeSparsePayloadWithoutReadingIt) {
  TempDir dir;
  const Entry e = fake_ptx_entry(small_spec());
  DiskCache cache(dir.path());
  cache.store(e);
  const std::string kernels = dir.path() + "/kernels/";
  const std::uint64_t huge = std::uint64_t{64} << 30;
  fs::resize_file(kernels + e.record.key + ".ptx", huge);  // sparse: no disk space used
  json j = json::parse(read_text(kernels + e.record.key + ".json"));
  j["payload"]["bytes"] = huge;
  write_text(kernels + e.record.key + ".json", j.dump());
  const VerifyReport report = cache.verify(false);
  ASSERT_EQ(report.bad.size(), 1u);
  EXPECT_TRUE(contains(report.bad[0].problem, std::to_string(huge))) << report.bad[0].problem;
  EXPECT_FALSE(cache.load(e.record.key));
}

// ---- metadata: checksummed, and every field checked before use ----

TEST(DiskCache, RegeneratesAnEntryWhoseLaunchShapeWasChanged) {
  for (const auto& [field, value] : std::vector<std::pair<std::string, json>>{
           {"threads", 128}, {"entry", "other"}, {"dynamic_smem_bytes", 0}, {"registers", 32},
           {"params", json::parse(R"([{"name": "n", "type": "i64"}])")}}) {
    SCOPED_TRACE(field);
    expect_recovery(
        [&](const std::string& kernels, const Entry& e) {
          json j = json::parse(read_text(kernels + e.record.key + ".json"));
          j[field] = value;
          write_text(kernels + e.record.key + ".json", j.dump(2));
        },
        "metadata checksum");
  }
}

// The launch shape is the spec's: metadata edited and signed again (its checksum recomputed) that
// gives another CTA size or shared memory is a logged miss, compiled again, never launched.
TEST(DiskCache, RegeneratesAnEntryWhoseLaunchShapeWasChangedAndSignedAgain) {
  for (const auto& [field, value, problem] : std::vector<std::tuple<std::string, int, std::string>>{
           {"threads", 512, "its metadata says 512 threads, its spec's kernel is built for 1024"},
           {"dynamic_smem_bytes", 4096, "its metadata says 4096 bytes of dynamic shared memory"}}) {
    SCOPED_TRACE(field);
    expect_recovery(
        [&, field = field, value = value](const std::string& kernels, const Entry& e) {
          json j = json::parse(read_text(kernels + e.record.key + ".json"));
          j[field] = value;
          // Signed again as the cache signs: sha256 of the canonical dump without the checksum and times.
          json signed_part = j;
          for (const char* unsigned_field : {"metadata_sha256", "created", "created_unix"}) signed_part.erase(unsigned_field);
          j["metadata_sha256"] = sha256_hex(signed_part.dump());
          write_text(kernels + e.record.key + ".json", j.dump(2));
        },
        problem);
  }
}

// An entry of the format before parameter lists (signed, but without "params") is a miss: the
// runtime binds arguments by the names the entry holds.
TEST(DiskCache, RegeneratesAnEntryWithoutItsParameterList) {
  expect_recovery(
      [](const std::string& kernels, const Entry& e) {
        json j = json::parse(read_text(kernels + e.record.key + ".json"));
        j.erase("params");
        j["format"] = 2;
        json signed_part = j;
        for (const char* unsigned_field : {"metadata_sha256", "created", "created_unix"}) signed_part.erase(unsigned_field);
        j["metadata_sha256"] = sha256_hex(signed_part.dump());
        write_text(kernels + e.record.key + ".json", j.dump(2));
      },
      "metadata format 2, expected 3");
}

TEST(DiskCache, VerifyFlagsAnImplausibleCreationTime) {
  for (const json& created : {json(std::int64_t{100000000000000000}), json(1e300), json(-5)}) {
    SCOPED_TRACE(created.dump());
    TempDir dir;
    DiskCache cache(dir.path());
    const Entry e = fake_ptx_entry(small_spec());
    cache.store(e);
    const std::string path = dir.path() + "/kernels/" + e.record.key + ".json";
    json j = json::parse(read_text(path));
    j["created_unix"] = created;
    write_text(path, j.dump());
    const VerifyReport report = cache.verify(false);
    ASSERT_EQ(report.bad.size(), 1u);
    EXPECT_TRUE(contains(report.bad[0].problem, "created_unix")) << report.bad[0].problem;
    EXPECT_TRUE(cache.list().empty());
  }
}

TEST(DiskCache, ClearRejectsANegativeOrNonFiniteAge) {
  TempDir dir;
  DiskCache cache(dir.path());
  cache.store(fake_ptx_entry(small_spec()));
  for (double days : {std::nan(""), -1.0, -std::numeric_limits<double>::infinity(),
                      std::numeric_limits<double>::infinity()}) {
    try {
      cache.clear(days);
      ADD_FAILURE() << "clear(" << days << ") was accepted";
    } catch (const std::invalid_argument& e) {
      std::ostringstream value;
      value << days;
      EXPECT_TRUE(contains(e.what(), value.str())) << e.what();
    }
  }
  EXPECT_EQ(cache.list().size(), 1u);
}

// ---- through LLVM: ptx_for and precompile, in this process and in others ----

TEST(Precompile, SecondCallInTheProcessIsAHitWithoutLLVM) {
  TempDir dir;
  use_cache_dir(dir.path());
  const KernelSpec spec = small_spec();
  const int64_t before = emitted_module_count();
  const PrecompileResult first = precompile(spec);
  EXPECT_FALSE(first.hit);
  EXPECT_EQ(emitted_module_count(), before + 1);
  EXPECT_GT(first.compile_ms, 0);
  EXPECT_GT(first.ptx_bytes, 0u);
  const PrecompileResult second = precompile(spec);
  EXPECT_TRUE(second.hit);
  EXPECT_EQ(second.key, first.key);
  EXPECT_EQ(second.ptx_bytes, first.ptx_bytes);
  EXPECT_TRUE(contains(ptx_for(spec), ".entry"));
  EXPECT_EQ(emitted_module_count(), before + 1);
}

TEST(Precompile, EightProcessesAtOnceCompileTheSpecOnceAndLeaveOneValidEntry) {
  TempDir dir;
  const KernelSpec spec = small_spec(KernelKind::LseCombine);
  const auto outputs = testing_helpers::run_helpers(dir.path(), "precompile", {spec.text()}, 8);
  int compiles = 0, misses = 0;
  for (const auto& lines : outputs) {
    ASSERT_EQ(lines.size(), 1u);
    EXPECT_EQ(testing_helpers::field(lines[0], "key"), ptx_key(spec)) << lines[0];
    compiles += static_cast<int>(testing_helpers::number(lines[0], "compiles"));
    misses += testing_helpers::field(lines[0], "hit") == "0";
  }
  EXPECT_EQ(compiles, 1);  // flock works on local file systems
  EXPECT_EQ(misses, 1);
  DiskCache cache(dir.path());
  const VerifyReport report = cache.verify(false);
  EXPECT_EQ(report.checked, 1u);
  EXPECT_TRUE(report.bad.empty());
  std::size_t files = 0;
  for (auto it = fs::directory_iterator(dir.path() + "/kernels"); it != fs::directory_iterator(); ++it) ++files;
  EXPECT_EQ(files, 2u);  // one payload, one metadata, no temp files
}

TEST(Precompile, ANewProcessWithAWarmCacheDoesNotEnterLLVM) {
  TempDir dir;
  use_cache_dir(dir.path());
  const KernelSpec spec = small_spec();
  ASSERT_FALSE(precompile(spec).hit);
  const auto outputs = testing_helpers::run_helpers(dir.path(), "precompile", {spec.text()}, 1);
  ASSERT_EQ(outputs.at(0).size(), 1u);
  const std::string& line = outputs[0][0];
  EXPECT_EQ(testing_helpers::field(line, "hit"), "1") << line;
  EXPECT_EQ(testing_helpers::field(line, "compiles"), "0") << line;
}

}  // namespace
}  // namespace lfce::runtime
