#include "autotune/config_space.h"

#include <algorithm>
#include <cstdio>

#include "compiler/errors.h"
#include "templates/templates.h"

namespace lfce::autotune {
namespace {

using runtime::Problem;
using runtime::Tuning;

// Registers ptxas keeps besides accumulators and fragments: addresses, loop counters,
// predicates, the epilogue's temporaries.
constexpr int kRegisterOverhead = 40;

struct Axes {
  std::vector<int> bm, bn, bk, stages;
  std::vector<std::pair<int, int>> warps;
};

Axes default_axes(DType dtype) {
  Axes a;
  a.bm = a.bn = {64, 128, 256};
  // 16-bit K-major rows must span >= 128 bytes for the 16-byte-chunk swizzle (BK >= 64);
  // fp32 rows are 128 bytes at BK = 32 already.
  a.bk = dtype == DType::FP32 ? std::vector<int>{32} : std::vector<int>{64, 128};
  a.warps = {{1, 4}, {2, 2}, {2, 4}, {4, 2}};
  a.stages = {2, 3, 4};
  return a;
}

// A few configs per kind that ptxas compiles without spills (config_space_test checks).
std::vector<TileConfig> small_tiles(DType dtype) {
  if (dtype == DType::FP32)
    return {{128, 128, 32, 2, 4, 2}, {64, 64, 32, 2, 2, 2}, {64, 128, 32, 2, 4, 2}};
  return {{128, 128, 64, 2, 4, 3}, {64, 128, 64, 2, 2, 3}, {128, 64, 64, 2, 2, 4}};
}

int64_t budget_chunk(const Problem& problem) {
  runtime::Plan plan(problem, Arch::SM90A);  // the chunk does not depend on the arch
  return plan.chunk();
}

// Chunk widths to sweep: the budget's, and halves of it while the vocabulary needs several
// chunks anyway (a single-chunk vocabulary is never re-split: see Plan). Multiples of 128.
std::vector<int64_t> chunk_choices(const Problem& problem, bool small) {
  const int64_t budget = budget_chunk(problem);
  std::vector<int64_t> out = {budget};
  if (problem.chunk_size > 0 || budget >= problem.vocab) return out;
  for (int64_t div : small ? std::vector<int64_t>{2} : std::vector<int64_t>{2, 4}) {
    int64_t c = budget / div / 128 * 128;
    if (c >= 128 && std::find(out.begin(), out.end(), c) == out.end()) out.push_back(c);
  }
  return out;
}

std::vector<int64_t> ctas_choices(bool small) {
  if (small) return {runtime::kDefaultForwardCtas, 2 * runtime::kDefaultForwardCtas};
  return {runtime::kDefaultForwardCtas, 2 * runtime::kDefaultForwardCtas, 4 * runtime::kDefaultForwardCtas};
}

std::string tile_text(const TileConfig& t) {
  return std::to_string(t.bm) + "x" + std::to_string(t.bn) + "x" + std::to_string(t.bk) + "/" +
         std::to_string(t.warps_m) + "x" + std::to_string(t.warps_n) + "/s" + std::to_string(t.stages);
}

// Candidates for `kind` with tiles from `tiles`: every tile crossed with the kind's extra
// axis (CTA target or chunk); in the small space, only the first tile is crossed.
std::vector<Candidate> cross(KernelKind kind, const Problem& problem, const std::vector<TileConfig>& tiles,
                             bool small) {
  std::vector<int64_t> ctas = kind == KernelKind::LseForward ? ctas_choices(small) : std::vector<int64_t>{0};
  std::vector<int64_t> chunks =
      kind == KernelKind::DlogitsBackward ? chunk_choices(problem, small) : std::vector<int64_t>{0};
  std::vector<Candidate> out;
  for (size_t i = 0; i < tiles.size(); ++i)
    for (size_t f = 0; f < ctas.size(); ++f)
      for (size_t c = 0; c < chunks.size(); ++c)
        if (!small || i == 0 || (f == 0 && c == 0)) out.push_back(Candidate{kind, tiles[i], ctas[f], chunks[c]});
  return out;
}

}  // namespace

const std::vector<KernelKind>& tuned_kinds() {
  static const std::vector<KernelKind> kinds = [] {
    std::vector<KernelKind> out;
    for (const KernelKindInfo& info : kKernelKinds)
      if (info.gemm) out.push_back(info.kind);
    return out;
  }();
  return kinds;
}

bool is_tuned_kind(KernelKind kind) { return kind_info(kind).gemm; }

std::string Candidate::text() const {
  std::string out = tile_text(tile);
  if (kind == KernelKind::LseForward) out += ";ctas=" + std::to_string(forward_ctas);
  if (kind == KernelKind::DlogitsBackward) out += ";chunk=" + std::to_string(chunk);
  return out;
}

Candidate Candidate::parse(KernelKind kind, std::string_view text) {
  const std::string s(text);
  Candidate c;
  c.kind = kind;
  TileConfig& t = c.tile;
  long long extra = 0;
  int used = 0;
  bool ok = false;
  if (kind == KernelKind::LseForward) {
    ok = std::sscanf(s.c_str(), "%dx%dx%d/%dx%d/s%d;ctas=%lld%n", &t.bm, &t.bn, &t.bk, &t.warps_m, &t.warps_n,
                     &t.stages, &extra, &used) == 7;
    c.forward_ctas = extra;
  } else if (kind == KernelKind::DlogitsBackward) {
    ok = std::sscanf(s.c_str(), "%dx%dx%d/%dx%d/s%d;chunk=%lld%n", &t.bm, &t.bn, &t.bk, &t.warps_m, &t.warps_n,
                     &t.stages, &extra, &used) == 7;
    c.chunk = extra;
  } else {
    ok = std::sscanf(s.c_str(), "%dx%dx%d/%dx%d/s%d%n", &t.bm, &t.bn, &t.bk, &t.warps_m, &t.warps_n, &t.stages,
                     &used) == 6;
  }
  // Round trip: rejects trailing text and non-canonical spellings (" 128", "+128").
  if (!ok || static_cast<size_t>(used) != s.size() || c.text() != s)
    throw SpecError("'" + s + "' is not a " + std::string(kind_name(kind)) + " candidate; expected e.g. '" +
                    Candidate{kind, runtime::default_tile(kind, DType::BF16), kind == KernelKind::LseForward ? runtime::kDefaultForwardCtas : 0,
                              kind == KernelKind::DlogitsBackward ? 16384 : 0}
                        .text() +
                    "'");
  return c;
}

Tuning Candidate::apply(Tuning base) const {
  base.tiles[kind] = tile;
  if (kind == KernelKind::LseForward) base.forward_ctas = forward_ctas;
  if (kind == KernelKind::DlogitsBackward) base.chunk = chunk;
  return base;
}

Candidate default_candidate(KernelKind kind, const Problem& problem) {
  return candidate_of(kind, problem, Tuning{});
}

Candidate candidate_of(KernelKind kind, const Problem& problem, const Tuning& tuning) {
  Candidate c{kind, tuning.tile(kind, problem.dtype), 0, 0};
  if (kind == KernelKind::LseForward)
    c.forward_ctas = tuning.forward_ctas > 0 ? tuning.forward_ctas : runtime::kDefaultForwardCtas;
  if (kind == KernelKind::DlogitsBackward) c.chunk = runtime::Plan(problem, Arch::SM90A, tuning).chunk();
  return c;
}

int estimated_registers(const TileConfig& t, DType dtype) {
  const int threads = std::max(t.threads(), 1);
  const int accumulators = t.bm * t.bn / threads;  // fp32, one register each
  int fragments;
  if (dtype == DType::FP32) {
    // SIMT: per k, one A value per owned row and one B value per owned column.
    const int rows_step = std::max(threads / 16, 1);
    fragments = t.bm / rows_step + t.bn / 16;
  } else {
    // mma.sync m16n8k16: an A fragment is 4 registers per 16 rows, a B fragment 2 per 8 columns.
    fragments = 4 * (t.bm / std::max(t.warps_m, 1) / 16) + 2 * (t.bn / std::max(t.warps_n, 1) / 8);
  }
  return accumulators + fragments + kRegisterOverhead;
}

std::optional<std::string> rejection(const Candidate& c, const Problem& problem, Arch arch, int64_t smem_limit) {
  const ArchInfo& info = arch_info(arch);
  const int64_t smem_max = smem_limit > 0 ? std::min<int64_t>(smem_limit, info.smem_per_block_optin)
                                          : info.smem_per_block_optin;
  const std::string on = std::string(" on ") + info.name;
  try {
    c.tile.check_range();  // first: a tile read from a file may hold anything
  } catch (const SpecError& e) {
    return e.what();
  }
  if (c.tile.threads() > info.threads_per_block_max)
    return "threads per block " + std::to_string(c.tile.threads()) + " > limit " +
           std::to_string(info.threads_per_block_max) + on;
  if (c.kind == KernelKind::LseForward && (c.forward_ctas < 1 || c.forward_ctas > runtime::kMaxForwardCtas))
    return "forward CTAs " + std::to_string(c.forward_ctas) + " outside 1.." +
           std::to_string(runtime::kMaxForwardCtas) + " (the forward workspace's bound)";
  if (c.kind == KernelKind::DlogitsBackward && (c.chunk < 1 || (c.chunk % 128 != 0 && c.chunk != problem.vocab)))
    return "chunk " + std::to_string(c.chunk) + " is not a positive multiple of 128";
  KernelSpec spec;
  try {
    spec = runtime::Plan(problem, arch, c.apply(Tuning{})).spec(c.kind);
  } catch (const SpecError& e) {
    return std::string("invalid plan: ") + e.what();
  }
  const int smem = kernel_smem_bytes(spec);
  if (smem > smem_max)
    return "shared memory " + std::to_string(smem) + " bytes > limit " + std::to_string(smem_max) + " bytes" +
           (smem_limit > 0 ? std::string(" of this device") : on);
  const int regs = estimated_registers(c.tile, problem.dtype);
  if (regs > info.regs_per_thread_max)
    return "registers per thread ~" + std::to_string(regs) + " (estimated) > limit " +
           std::to_string(info.regs_per_thread_max) + on;
  try {
    spec.validate();
  } catch (const SpecError& e) {
    return std::string("invalid spec: ") + e.what();
  }
  return std::nullopt;
}

ConfigSpace config_space(KernelKind kind, const Problem& problem, Arch arch, std::string_view name,
                         int64_t smem_limit) {
  if (!is_tuned_kind(kind))
    throw SpecError(std::string(kind_name(kind)) + " is not a GEMM kernel: it has no config space");
  std::vector<TileConfig> tiles;
  const bool small = name == "small";
  if (small) {
    tiles = small_tiles(problem.dtype);
  } else if (name == "default") {
    const Axes a = default_axes(problem.dtype);
    for (int bm : a.bm)
      for (int bn : a.bn)
        for (int bk : a.bk)
          for (auto [wm, wn] : a.warps)
            for (int s : a.stages) tiles.push_back(TileConfig{bm, bn, bk, wm, wn, s});
  } else {
    throw SpecError("config space '" + std::string(name) + "' does not exist; expected default or small");
  }
  ConfigSpace space;
  const Candidate fallback = default_candidate(kind, problem);
  space.kept.push_back(fallback);  // measured first: every speed-up is relative to it
  for (const Candidate& c : cross(kind, problem, tiles, small)) {
    if (c == fallback) continue;
    if (auto reason = rejection(c, problem, arch, smem_limit))
      space.rejected.push_back({c, *reason});
    else
      space.kept.push_back(c);
  }
  return space;
}

}  // namespace lfce::autotune
