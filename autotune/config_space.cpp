#include "autotune/config_space.h"

#include <algorithm>

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

// sm_90a, 16-bit: the TMA + wgmma pipeline's axes (BM = 64 x consumer warpgroups, BK = 64),
// and for the persistent backward GEMMs, ping-pong consumers (BM = 64 or 128 each) and CTA pairs
// multicasting B (BN a multiple of 128; within about 1% of single CTAs on the H200,
// docs/measurements.md#cta-pairs: only the small space, which the GPU tests verify, has one);
// for grad_weight and grad_input, CTA pairs along N multicasting A (dz, the operand the GEMM
// streams), as cuBLAS pairs them.
std::vector<TileConfig> wgmma_tiles(KernelKind kind, bool small) {
  const bool backward = kind != KernelKind::LseForward;
  auto pingpong = [](int bn, int stages, int cluster = 1, int bm = 64) {
    TileConfig t{bm, bn, 64, 1, 1, stages, 2, cluster};
    t.pingpong = true;
    return t;
  };
  auto pair_n = [](int bn, int stages) {  // two consumers, 128 x BN, paired along N
    TileConfig t{128, bn, 64, 1, 1, stages, 2, 2};
    t.cluster_n = true;
    return t;
  };
  if (small) {  // two consumers sharing a CTA, one consumer with two CTAs per SM, a CTA pair, ping-pongs
    std::vector<TileConfig> out = {{128, 128, 64, 1, 1, 3, 2}, {64, 128, 64, 1, 1, 4, 1}};
    if (backward) {
      out.push_back({128, 128, 64, 1, 1, 4, 2, 2});
      out.push_back(pingpong(128, 4));
      out.push_back(pingpong(128, 4, 2));
      if (kind != KernelKind::DlogitsBackward) out.push_back(pingpong(128, 4, 1, 128));
      if (kind == KernelKind::GradWeight || kind == KernelKind::GradInput) out.push_back(pair_n(128, 4));
    }
    return out;
  }
  std::vector<TileConfig> out;
  for (int consumers : {1, 2})
    for (int bn : {128, 192, 256})
      for (int stages : {2, 3, 4, 5}) out.push_back(TileConfig{64 * consumers, bn, 64, 1, 1, stages, consumers});
  if (backward) {
    for (int stages : {4, 5}) out.push_back(pingpong(256, stages));
    for (int stages : {5, 6, 7}) out.push_back(pingpong(192, stages));
    for (int stages : {6, 8}) out.push_back(pingpong(128, stages));
    // Two m64 blocks per consumer: a fifth less operand traffic per FLOP than 64 x 256. Not for
    // dlogits_backward: its epilogue over four rows spilled 80-160 bytes under the driver's JIT
    // (H200, driver 580; ptxas 13.0 allocates it without spills).
    if (kind != KernelKind::DlogitsBackward)
      for (int stages : {4, 5, 6}) out.push_back(pingpong(128, stages, 1, 128));
    // Split along N, 128 x 256: each consumer 128 x 128 (two m64 blocks), whole 64-element boxes of
    // an MN-major B. (cuBLAS's 192 x 192 split needs 144 accumulators: over kMaxAccumulators.)
    for (int stages : {3, 4}) {
      TileConfig t{128, 256, 64, 1, 1, stages, 2};
      t.split_n = true;
      out.push_back(t);
    }
    if (kind == KernelKind::GradWeight || kind == KernelKind::GradInput)
      for (const auto& [bn, stages] : {std::pair{192, 4}, std::pair{192, 5}, std::pair{256, 4}})
        out.push_back(pair_n(bn, stages));
  }
  return out;
}

// A few configs per kind that ptxas compiles without spills (config_space_test checks).
std::vector<TileConfig> small_tiles(DType dtype) {
  if (dtype == DType::FP32)
    return {{128, 128, 32, 2, 4, 2}, {64, 64, 32, 2, 2, 2}, {64, 128, 32, 2, 4, 2}};
  return {{128, 128, 64, 2, 4, 3}, {64, 128, 64, 2, 2, 3}, {64, 64, 64, 2, 2, 3}};
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

// CTA targets of the forward: one, two and four per SM of the device.
std::vector<int64_t> ctas_choices(bool small, int64_t sm_count) {
  std::vector<int64_t> out;
  for (int64_t per_sm : small ? std::vector<int64_t>{1, 2} : std::vector<int64_t>{1, 2, 4})
    out.push_back(std::min(per_sm * sm_count, runtime::kMaxForwardCtas));
  out.erase(std::unique(out.begin(), out.end()), out.end());
  return out;
}

// Candidates for `kind` with tiles from `tiles`: every tile crossed with the kind's extra
// axis (CTA target or chunk); in the small space, only the first tile is crossed.
std::vector<runtime::Candidate> cross(KernelKind kind, const Problem& problem, const std::vector<TileConfig>& tiles,
                             bool small, int64_t sm_count) {
  std::vector<int64_t> ctas = kind == KernelKind::LseForward ? ctas_choices(small, sm_count) : std::vector<int64_t>{0};
  std::vector<int64_t> chunks =
      kind == KernelKind::DlogitsBackward ? chunk_choices(problem, small) : std::vector<int64_t>{0};
  std::vector<runtime::Candidate> out;
  for (size_t i = 0; i < tiles.size(); ++i)
    for (size_t f = 0; f < ctas.size(); ++f)
      for (size_t c = 0; c < chunks.size(); ++c)
        if (!small || i == 0 || (f == 0 && c == 0)) out.push_back(runtime::Candidate{kind, tiles[i], ctas[f], chunks[c]});
  return out;
}

}  // namespace

const std::vector<KernelKind>& tuned_kinds() {
  static const std::vector<KernelKind> kinds = [] {
    std::vector<KernelKind> out;
    for (const KernelKindInfo& info : kKernelKinds)
      if (info.gemm && !info.eager) out.push_back(info.kind);
    return out;
  }();
  return kinds;
}

bool is_tuned_kind(KernelKind kind) { return kind_info(kind).gemm && !kind_info(kind).eager; }

runtime::Candidate default_candidate(KernelKind kind, const Problem& problem, Arch arch, const runtime::DeviceLimits& limits) {
  return candidate_of(kind, problem, Tuning{}, arch, limits);
}

runtime::Candidate candidate_of(KernelKind kind, const Problem& problem, const Tuning& tuning, Arch arch,
                       const runtime::DeviceLimits& limits) {
  // What a Plan on that device runs (runtime/plan.cpp), whose unknowns are filled as the
  // tuning key fills them.
  const runtime::DeviceLimits device = runtime::effective_limits(arch, limits);
  const runtime::Plan plan(problem, arch, tuning, device);
  runtime::Candidate c{kind, plan.tile(kind), 0, 0};
  if (kind == KernelKind::LseForward)
    c.forward_ctas = std::min(tuning.forward_ctas > 0 ? tuning.forward_ctas : device.sm_count, runtime::kMaxForwardCtas);
  if (kind == KernelKind::DlogitsBackward) c.chunk = plan.chunk();
  return c;
}

int estimated_registers(const TileConfig& t, DType dtype) {
  // wgmma: each consumer thread holds BN/2 accumulators per m64 block of its rows; operands
  // stay in shared memory (descriptors), and setmaxnreg gives the consumers the producer's share.
  if (t.wgmma()) return t.accumulators() + kRegisterOverhead;
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

std::optional<std::string> rejection(const runtime::Candidate& c, const Problem& problem, Arch arch,
                                     const runtime::DeviceLimits& limits) {
  if (auto reason = runtime::unrunnable(c, problem, arch, limits)) return reason;
  const ArchInfo& info = arch_info(arch);
  // A one-consumer wgmma tile is built for two CTAs per SM (ptxas budgets half the registers):
  // two must fit in the SM's shared memory (the opt-in per-block limit + 1 KiB the driver reserves
  // per CTA), or the second never runs beside the first.
  const int64_t smem = [&] {
    KernelSpec s = runtime::problem_spec(c.kind, problem, arch);
    s.tile = c.tile;
    return static_cast<int64_t>(kernel_smem_bytes(s));
  }();
  const int64_t per_sm = runtime::effective_limits(arch, limits).smem_per_block + 1024;
  if (c.tile.ctas_per_sm() > 1 && c.tile.ctas_per_sm() * (smem + 1024) > per_sm)
    return "a " + c.tile.text() + " tile runs " + std::to_string(c.tile.ctas_per_sm()) + " CTAs per SM, needing " +
           std::to_string(c.tile.ctas_per_sm() * (smem + 1024)) + " bytes of shared memory, over the SM's " +
           std::to_string(per_sm);
  // lse_forward's staged epilogue (a bias, or class-weighted label smoothing) with one consumer
  // warpgroup (two CTAs per SM, half the registers) spilled 56 bytes under the driver's JIT (H200,
  // driver 580, V = 5000, H = 512; commit 49625a4), though ptxas 13.0 assembles it without spills.
  if (c.kind == KernelKind::LseForward && c.tile.wgmma() && c.tile.consumers == 1 &&
      (problem.bias || (problem.class_weight && problem.label_smoothing != 0.f)))
    return "lse_forward's staged epilogue (a bias or class-weighted smoothing) with one consumer warpgroup (" +
           c.tile.text() + ") spills under the driver's JIT (56 bytes, H200, driver 580)";
  const int regs = estimated_registers(c.tile, problem.dtype);
  if (regs > info.regs_per_thread_max)
    return "registers per thread ~" + std::to_string(regs) + " (estimated) > limit " +
           std::to_string(info.regs_per_thread_max) + " on " + info.name;
  return std::nullopt;
}

ConfigSpace config_space(KernelKind kind, const Problem& problem, Arch arch, std::string_view name,
                         const runtime::DeviceLimits& limits) {
  if (!is_tuned_kind(kind))
    throw SpecError(std::string(kind_name(kind)) + " is not a GEMM kernel: it has no config space");
  std::vector<TileConfig> tiles;
  const bool small = name == "small";
  const bool hopper = arch == Arch::SM90A && problem.dtype != DType::FP32;
  if (name == "wgmma" && !hopper)
    throw SpecError("config space 'wgmma' needs arch sm_90a and a 16-bit dtype, got " + std::string(arch_name(arch)) +
                    " " + std::string(dtype_name(problem.dtype)));
  if (small) {
    tiles = small_tiles(problem.dtype);
  } else if (name == "wgmma") {
    // the TMA + wgmma tiles alone (below)
  } else if (name == "default") {
    const Axes a = default_axes(problem.dtype);
    for (int bm : a.bm)
      for (int bn : a.bn)
        for (int bk : a.bk)
          for (auto [wm, wn] : a.warps)
            for (int s : a.stages) tiles.push_back(TileConfig{bm, bn, bk, wm, wn, s});
  } else {
    throw SpecError("config space '" + std::string(name) + "' does not exist; expected default, small or wgmma");
  }
  if (hopper) {
    const std::vector<TileConfig> hopper = wgmma_tiles(kind, small);
    tiles.insert(tiles.begin(), hopper.begin(), hopper.end());
  }
  ConfigSpace space;
  const runtime::Candidate fallback = default_candidate(kind, problem, arch, limits);
  space.kept.push_back(fallback);  // measured first: every speed-up is relative to it
  for (const runtime::Candidate& c : cross(kind, problem, tiles, small, runtime::effective_limits(arch, limits).sm_count)) {
    if (c == fallback) continue;
    if (auto reason = rejection(c, problem, arch, limits))
      space.rejected.push_back({c, *reason});
    else
      space.kept.push_back(c);
  }
  return space;
}

}  // namespace lfce::autotune
