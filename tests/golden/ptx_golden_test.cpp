// The PTX of every kernel a covering set of problems launches, against tests/golden/ptx_hashes.txt:
// each case (a problem, an arch, a tuning, device limits) names its kernels by the case's
// hand-written name and the kind, so the record stays comparable when KernelSpec's text
// changes. Covered: each option of golden_cases.h on its own for every arch, dtype and mode, a
// few combinations, tuned tiles, eager mode's schedule options and a 99 KiB device.
// LFCE_GOLDEN_UPDATE=1 re-records the file.
#include <gtest/gtest.h>

#include <algorithm>
#include <atomic>
#include <chrono>
#include <map>
#include <mutex>
#include <string>
#include <thread>
#include <vector>

#include "api/problem_from_c.h"
#include "compiler/errors.h"
#include "runtime/plan.h"
#include "runtime/sha256.h"
#include "templates/templates.h"
#include "tests/golden/golden_cases.h"
#include "tests/golden/golden_file.h"

namespace lfce::golden {
namespace {

const std::string kFile = std::string(LFCE_GOLDEN_DIR) + "/ptx_hashes.txt";

const char* const kHeader =
    "The PTX of every kernel each case launches (Plan::launched_specs), one line per kernel:\n"
    "  <case> <kind>[#n, its n-th spec of that kind] <sha256 of the PTX> <KernelSpec text>\n"
    "or \"<case> - rejected\" where the library refuses the problem. Cases are named in\n"
    "tests/golden/ptx_golden_test.cpp and golden_cases.h; the check keys on case and kind, so a\n"
    "changed spec text with the same PTX is reported apart from changed PTX.\n"
    "Regenerate (then review the diff): LFCE_GOLDEN_UPDATE=1 ctest --test-dir build -R '^(PtxGolden|LaunchTrace)\\.'";

struct Case {
  std::string name;
  lfce_problem problem;
  bool lse_grad = false;
  Arch arch = Arch::SM90A;
  runtime::Tuning tuning;
  runtime::DeviceLimits limits;
};

constexpr Arch kArchs[] = {Arch::SM80, Arch::SM90A};
constexpr lfce_dtype kDtypes[] = {LFCE_DTYPE_BF16, LFCE_DTYPE_FP16, LFCE_DTYPE_FP32};
constexpr lfce_mode kModes[] = {LFCE_MODE_RECOMPUTE, LFCE_MODE_EAGER};

// Llama 3's output layer (V not a multiple of any tile), 8192 tokens.
lfce_problem base(lfce_dtype dtype, lfce_mode mode) { return problem(8192, 4096, 128256, dtype, mode); }

std::string case_name(Arch arch, lfce_dtype dtype, lfce_mode mode, const std::string& what) {
  return std::string(arch_name(arch)) + "/" + dtype_label(dtype) + "/" + mode_label(mode) + "/" + what;
}

runtime::Tuning tiles(std::initializer_list<std::pair<KernelKind, const char*>> list) {
  runtime::Tuning t;
  for (const auto& [kind, text] : list) t.tiles[kind] = TileConfig::parse(text);
  return t;
}

std::vector<Case> cases() {
  std::vector<Case> out;
  auto add = [&](Arch arch, lfce_dtype dtype, lfce_mode mode, const std::string& what, const Option& option,
                 lfce_problem p, runtime::Tuning tuning = {}, runtime::DeviceLimits limits = {}) {
    option.apply(p);
    out.push_back({case_name(arch, dtype, mode, what), p, option.lse_grad, arch, tuning, limits});
  };
  const Option& plain = kOptions[0];
  for (Arch arch : kArchs)
    for (lfce_dtype dtype : kDtypes)
      for (lfce_mode mode : kModes) {
        for (const Option& o : kOptions) add(arch, dtype, mode, o.name, o, base(dtype, mode));
        if (dtype != LFCE_DTYPE_FP16)  // (class weights and the lse rows' gradients are not for fp16)
          for (const Option& o : kCombinations) add(arch, dtype, mode, o.name, o, base(dtype, mode));
      }

  // Tuned tiles (from the tuner's spaces, autotune/config_space.cpp).
  for (lfce_mode mode : kModes) {
    add(Arch::SM80, LFCE_DTYPE_BF16, mode, "tuned_tiles", plain, base(LFCE_DTYPE_BF16, mode),
        tiles({{KernelKind::LseForward, "64x128x64/2x2/s3"},
               {KernelKind::DlogitsBackward, "64x64x64/2x2/s3"},
               {KernelKind::GradWeight, "128x128x64/2x4/s3"},
               {KernelKind::GradInput, "64x128x64/2x2/s3"}}));
    add(Arch::SM80, LFCE_DTYPE_FP32, mode, "tuned_tiles", plain, base(LFCE_DTYPE_FP32, mode),
        tiles({{KernelKind::LseForward, "64x64x32/2x2/s2"},
               {KernelKind::DlogitsBackward, "64x128x32/2x4/s2"},
               {KernelKind::GradWeight, "64x64x32/2x2/s2"},
               {KernelKind::GradInput, "64x128x32/2x4/s2"}}));
    for (lfce_dtype dtype : {LFCE_DTYPE_BF16, LFCE_DTYPE_FP16}) {
      add(Arch::SM90A, dtype, mode, "tuned_tiles_clusters", plain, base(dtype, mode),
          tiles({{KernelKind::LseForward, "128x128x64/wg2/s3"},
                 {KernelKind::DlogitsBackward, "128x128x64/wg2/s4/c2"},
                 {KernelKind::GradWeight, "128x192x64/wg2/s4/c2n"},
                 {KernelKind::GradInput, "128x256x64/wg2/s3/sn"}}));
      add(Arch::SM90A, dtype, mode, "tuned_tiles_one_consumer", plain, base(dtype, mode),
          tiles({{KernelKind::LseForward, "64x128x64/wg1/s4"},
                 {KernelKind::DlogitsBackward, "64x128x64/wg1/s4"},
                 {KernelKind::GradWeight, "128x128x64/wg2/s4"},
                 {KernelKind::GradInput, "128x256x64/wg2/s3"}}));
    }
  }

  // Eager mode's schedule: its options, several token chunks, a hidden size below the
  // cooperative eager_logits tile's, and rows TMA cannot load (H * 2 bytes not a multiple of 16).
  for (lfce_dtype dtype : {LFCE_DTYPE_BF16, LFCE_DTYPE_FP16}) {
    runtime::Tuning operand;
    operand.eager_operand = true;
    runtime::Tuning no_fixup;
    no_fixup.eager_fixup = false;
    add(Arch::SM90A, dtype, LFCE_MODE_EAGER, "eager_operand", plain, base(dtype, LFCE_MODE_EAGER), operand);
    add(Arch::SM90A, dtype, LFCE_MODE_EAGER, "eager_fixup_off", plain, base(dtype, LFCE_MODE_EAGER), no_fixup);
    lfce_problem chunked = base(dtype, LFCE_MODE_EAGER);
    chunked.chunk_size = 1024;
    add(Arch::SM90A, dtype, LFCE_MODE_EAGER, "token_chunks", plain, chunked);
    add(Arch::SM90A, dtype, LFCE_MODE_EAGER, "token_chunks_bias", kOptions[1], chunked);
    add(Arch::SM90A, dtype, LFCE_MODE_EAGER, "token_chunks_eager_operand", plain, chunked, operand);
    add(Arch::SM90A, dtype, LFCE_MODE_EAGER, "hidden_1024", plain, problem(8192, 1024, 128256, dtype, LFCE_MODE_EAGER));
    for (lfce_mode mode : kModes)
      add(Arch::SM90A, dtype, mode, "hidden_4100", plain, problem(8192, 4100, 128256, dtype, mode));
  }

  // A 99 KiB, 84-SM device (RTX 30/40, A10, L40S): the default tiles that fit it.
  const runtime::DeviceLimits small{99 * 1024, 84};
  for (lfce_dtype dtype : kDtypes)
    for (lfce_mode mode : kModes) {
      add(Arch::SM80, dtype, mode, "smem_99k", plain, base(dtype, mode), {}, small);
      add(Arch::SM80, dtype, mode, "smem_99k_entropy_logprob_grad", kOptions[12], base(dtype, mode), {}, small);
    }
  return out;
}

struct Row {
  std::string key;   // "<case> <kind>[#n]"
  std::string hash;  // sha256 of the PTX, "rejected", or "error: <message>"
  std::string spec;  // KernelSpec text
  std::string record() const { return key + " " + hash + (spec.empty() ? "" : " " + spec); }
};

// The rows of every case, hashes filled in: each distinct spec generated once, on two threads.
std::vector<Row> compute_rows() {
  std::vector<Row> rows;
  std::vector<KernelSpec> specs;
  std::map<KernelSpec, size_t> index;
  std::vector<std::pair<size_t, size_t>> row_spec;  // row -> spec
  for (const Case& c : cases()) {
    std::vector<KernelSpec> launched;
    try {
      runtime::Problem p = api::problem_from_c(&c.problem);
      p.lse_grad = c.lse_grad;
      launched = runtime::Plan(p, c.arch, c.tuning, c.limits).launched_specs();
    } catch (const SpecError&) {
      rows.push_back({c.name + " -", "rejected", ""});
      continue;
    }
    std::map<KernelKind, int> seen;
    for (const KernelSpec& s : launched) {
      const int n = ++seen[s.kind];
      std::string key = c.name + " " + std::string(kind_name(s.kind)) + (n > 1 ? "#" + std::to_string(n) : "");
      auto [it, inserted] = index.emplace(s, specs.size());
      if (inserted) specs.push_back(s);
      row_spec.emplace_back(rows.size(), it->second);
      rows.push_back({key, "", s.text()});
    }
  }
  std::vector<std::string> hashes(specs.size());
  std::atomic<size_t> next{0};
  auto work = [&] {
    for (size_t i; (i = next++) < specs.size();) {
      try {
        hashes[i] = runtime::sha256_hex(generate_kernel(specs[i]).ptx);
      } catch (const std::exception& e) {
        hashes[i] = std::string("error: ") + e.what();
      }
    }
  };
  const auto start = std::chrono::steady_clock::now();
  std::vector<std::thread> threads;
  for (int t = 0; t < 2; ++t) threads.emplace_back(work);
  for (std::thread& t : threads) t.join();
  const double seconds = std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
  std::printf("%zu rows, %zu distinct specs generated in %.1f s\n", rows.size(), specs.size(), seconds);
  for (const auto& [row, spec] : row_spec) rows[row].hash = hashes[spec];
  return rows;
}

Row parse_row(const std::string& line) {
  // "<case> <kind> <hash> <spec>": the case, kind and spec hold no spaces; an error's hash may.
  Row r;
  const size_t a = line.find(' '), b = line.find(' ', a + 1);
  r.key = line.substr(0, b);
  std::string rest = b == std::string::npos ? "" : line.substr(b + 1);
  if (rest.rfind("error: ", 0) == 0) {
    r.hash = rest;
    return r;
  }
  const size_t c = rest.find(' ');
  r.hash = rest.substr(0, c);
  r.spec = c == std::string::npos ? "" : rest.substr(c + 1);
  return r;
}

TEST(PtxGolden, EveryCaseEmitsTheRecordedPtx) {
  const std::vector<Row> rows = compute_rows();
  std::vector<std::string> records;
  for (const Row& r : rows) records.push_back(r.record());
  if (update_requested()) {
    ASSERT_TRUE(write_records(kFile, kHeader, records)) << "cannot write " << kFile;
    std::printf("re-recorded %s\n", kFile.c_str());
    return;
  }
  const std::vector<std::string> golden_lines = read_records(kFile);
  ASSERT_FALSE(golden_lines.empty()) << kFile << " holds no records: record it with LFCE_GOLDEN_UPDATE=1";
  std::map<std::string, Row> golden;
  for (const std::string& line : golden_lines) {
    Row r = parse_row(line);
    golden.emplace(r.key, r);
  }
  int ptx_changed = 0, text_changed = 0, added = 0;
  std::map<std::string, bool> now;
  for (const Row& r : rows) {
    now[r.key] = true;
    auto it = golden.find(r.key);
    if (it == golden.end()) {
      ++added;
      ADD_FAILURE() << r.key << ": not in the record (now " << r.hash << " " << r.spec << ")";
      continue;
    }
    const Row& g = it->second;
    if (g.hash != r.hash) {
      ++ptx_changed;
      ADD_FAILURE() << r.key << ": PTX changed (sha256 " << g.hash << " -> " << r.hash << ")\n  recorded spec "
                    << g.spec << "\n  spec now      " << r.spec;
    } else if (g.spec != r.spec) {
      ++text_changed;
      ADD_FAILURE() << r.key << ": same PTX, spec text changed\n  recorded " << g.spec << "\n  now      " << r.spec;
    }
  }
  int removed = 0;
  for (const auto& [key, g] : golden)
    if (!now.count(key)) {
      ++removed;
      ADD_FAILURE() << key << ": recorded (" << g.hash << " " << g.spec << ") but no longer launched";
    }
  EXPECT_EQ(ptx_changed + text_changed + added + removed, 0)
      << ptx_changed << " kernels with changed PTX, " << text_changed << " with only a changed spec text, " << added
      << " new and " << removed << " gone, of " << rows.size() << " (" << kFile
      << "; re-record an intended change with LFCE_GOLDEN_UPDATE=1)";
}

}  // namespace
}  // namespace lfce::golden
