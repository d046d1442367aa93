#include "templates/gemm/tile_scheduler.h"

#include <algorithm>
#include <cstdint>
#include <string>

#include "compiler/checked_int.h"
#include "compiler/errors.h"

namespace lfce {

using llvm::Value;

TmaBox tma_box(const TileConfig& tile, Layout layout, int which) {
  const int rows = which == 0 ? tile.bm : tile.bn;
  // The operand a cluster's CTAs share: B with pairs along M, A with pairs along N.
  const bool shared = tile.cluster > 1 && (which == 0) == tile.cluster_n;
  TmaBox box;
  box.parts = shared ? tile.cluster : 1;
  if (layout == Layout::KMajor) {
    box.outer = rows / box.parts;  // one box {BK, rows / parts}: 128-byte rows, whole swizzle atoms
  } else {
    box.outer = tile.bk;  // boxes {64, BK}, one per 64 rows of M or N; this CTA's share of them
    box.boxes = rows / TmaBox::kElements / box.parts;
  }
  return box;
}

std::pair<int64_t, int64_t> TileScheduler::grid(int64_t tiles_m, int64_t tiles_n, int64_t device_ctas,
                                                std::string_view kernel) const {
  if (!tile_.wgmma()) return {tiles_m, tiles_n};
  // Clustered tiles: whole clusters, each taking groups of `cluster` tiles adjacent along M (N).
  const int64_t cluster = tile_.cluster;
  const int64_t tiles = tile_.cluster_n ? tiles_m * (ceil_div(tiles_n, cluster) * cluster)
                                        : ceil_div(tiles_m, cluster) * cluster * tiles_n;
  const int64_t ctas = std::max(std::min(tiles, device_ctas) / cluster, int64_t{1}) * cluster;
  if (tiles > INT32_MAX - ctas)
    throw OutOfResources("problem too large: " + std::to_string(tiles) + " " + std::string(kernel) +
                             " tiles in one launch, over 2^31 - 1 - " + std::to_string(ctas) +
                             ": give fewer tokens per call or a larger tile",
                         "tiles in one launch", tiles, INT32_MAX - ctas);
  return {ctas, 1};
}

std::pair<Value*, Value*> TileScheduler::blocks(KernelBuilder& kb, Value* pid, Value* grid_m, Value* grid_n) const {
  auto& ir = kb.ir();
  // Opaque to LLVM: with a grid known at generation time (grad_input's H / BN) it bounds the
  // divisors below and narrows the 32-bit divisions to 16 bits, which SASS implements as a
  // subroutine call, and any call makes ptxas serialise every wgmma of the kernel.
  grid_m = kb.opaque_i32(grid_m);
  grid_n = kb.opaque_i32(grid_n);
  Value* per_group = ir.CreateMul(kb.c32(kGroupRows), grid_n);
  Value* first_m = ir.CreateMul(ir.CreateUDiv(pid, per_group), kb.c32(kGroupRows));
  Value* rows_left = ir.CreateSub(grid_m, first_m);
  Value* group_rows = ir.CreateSelect(ir.CreateICmpULT(rows_left, kb.c32(kGroupRows)), rows_left, kb.c32(kGroupRows));
  Value* in_group = ir.CreateURem(pid, per_group);
  Value* m_block = ir.CreateAdd(first_m, ir.CreateURem(in_group, group_rows));
  Value* n_block = ir.CreateUDiv(in_group, group_rows);
  return {m_block, n_block};
}

std::pair<Value*, Value*> TileScheduler::origin(KernelBuilder& kb, Value* pid, Value* grid_m, Value* grid_n) const {
  auto& ir = kb.ir();
  Value *m_block, *n_block;
  std::tie(m_block, n_block) = blocks(kb, pid, grid_m, grid_n);
  return {ir.CreateMul(ir.CreateZExt(m_block, kb.i64()), kb.c64(tile_.bm)),
          ir.CreateMul(ir.CreateZExt(n_block, kb.i64()), kb.c64(tile_.bn))};
}

std::pair<Value*, Value*> TileScheduler::origin(KernelBuilder& kb) const {
  auto& ir = kb.ir();
  Value* pid = ir.CreateAdd(kb.ctaid(0), ir.CreateMul(kb.ctaid(1), kb.nctaid(0)));  // launch order
  return origin(kb, pid, kb.nctaid(0), kb.nctaid(1));
}

TileScheduler::Walk TileScheduler::prepare(KernelBuilder& kb, Value* grid_m, Value* grid_n) const {
  auto& ir = kb.ir();
  if (tile_.cluster == 1) return {grid_m, grid_n, ir.CreateMul(grid_m, grid_n)};
  const int c = tile_.cluster;
  const bool along_n = tile_.cluster_n;
  Value* groups_m = along_n ? grid_m : ir.CreateUDiv(ir.CreateAdd(grid_m, kb.c32(c - 1)), kb.c32(c));
  Value* groups_n = along_n ? ir.CreateUDiv(ir.CreateAdd(grid_n, kb.c32(c - 1)), kb.c32(c)) : grid_n;
  return {groups_m, groups_n, ir.CreateMul(groups_m, groups_n)};
}

void TileScheduler::walk(KernelBuilder& kb, const Walk& w,
                         const std::function<void(Value* m0, Value* n0)>& visit) const {
  auto& ir = kb.ir();
  if (tile_.cluster == 1) {
    kb.for_range(kb.ctaid(0), w.count, kb.nctaid(0), [&](Value* pid) {
      Value *m0, *n0;
      std::tie(m0, n0) = origin(kb, pid, w.grid_m, w.grid_n);
      visit(m0, n0);
    });
    return;
  }
  // Clusters of C CTAs (consecutive along x) walk a grid of C x 1 tile groups (1 x C along N);
  // CTA r of a cluster takes M block C·i + r of group i (N block C·j + r), so the pair's tiles
  // share their B tile (A tile). Where grid_m (grid_n) is not a multiple of C, the last group's
  // extra CTAs compute a tile wholly past M (N): TMA loads zeros, the epilogues write no row at
  // or past M (no column at or past N: grad_weight's and grad_input's, which alone take
  // clusters along N), and they still multicast their share to the peer that needs it.
  const int c = tile_.cluster;
  const bool along_n = tile_.cluster_n;
  Value* rank = kb.cluster_rank();
  Value* cluster = ir.CreateUDiv(kb.ctaid(0), kb.c32(c));
  Value* clusters = ir.CreateUDiv(kb.nctaid(0), kb.c32(c));
  kb.for_range(cluster, w.count, clusters, [&](Value* pid) {
    Value *group_m, *group_n;
    std::tie(group_m, group_n) = blocks(kb, pid, w.grid_m, w.grid_n);
    Value* m_block = along_n ? group_m : ir.CreateAdd(ir.CreateMul(group_m, kb.c32(c)), rank);
    Value* n_block = along_n ? ir.CreateAdd(ir.CreateMul(group_n, kb.c32(c)), rank) : group_n;
    Value* m0 = ir.CreateMul(ir.CreateZExt(m_block, kb.i64()), kb.c64(tile_.bm));
    Value* n0 = ir.CreateMul(ir.CreateZExt(n_block, kb.i64()), kb.c64(tile_.bn));
    visit(m0, n0);
  });
}

void TileScheduler::walk(KernelBuilder& kb, Value* grid_m, Value* grid_n,
                         const std::function<void(Value* m0, Value* n0)>& visit) const {
  if (tile_.cluster != 1) throw InternalError("a one-step tile walk of a clustered tile (" + tile_.text() + ")");
  kb.for_range(kb.ctaid(0), kb.ir().CreateMul(grid_m, grid_n), kb.nctaid(0), [&](Value* pid) {
    Value *m0, *n0;
    std::tie(m0, n0) = origin(kb, pid, grid_m, grid_n);
    visit(m0, n0);
  });
}

SplitForwardGrid SplitForwardGrid::for_ctas(int64_t ctas, int64_t tokens, int64_t vocab, int64_t bm, int64_t bn,
                                            int64_t min_splits) {
  const int64_t row_blocks = ceil_div(tokens, bm);
  SplitForwardGrid g;
  g.splits = std::clamp<int64_t>(std::max(ceil_div(ctas, row_blocks), min_splits), 1,
                                 std::min(ceil_div(vocab, bn), kMaxSplits));
  g.row_groups = std::clamp<int64_t>(ctas / g.splits, 1, row_blocks);
  return g;
}

void SplitForwardGrid::walk_row_blocks(KernelBuilder& kb, Value* row_blocks, const std::function<void(Value*)>& visit) {
  kb.for_range(kb.ctaid(0), row_blocks, kb.nctaid(0), visit);
}

SplitForwardGrid::Share SplitForwardGrid::share(KernelBuilder& kb, int64_t tiles) {
  auto& ir = kb.ir();
  // Split s's share ends at s · tiles / S. In 64 bits: s · tiles can pass 2^31 for the largest
  // vocabularies.
  auto share_end = [&](Value* s) {
    Value* end =
        ir.CreateUDiv(ir.CreateMul(ir.CreateZExt(s, kb.i64()), kb.c64(tiles)), ir.CreateZExt(kb.nctaid(1), kb.i64()));
    return ir.CreateTrunc(end, kb.i32());
  };
  Share share;
  share.split = kb.ctaid(1);
  share.tile_begin = share_end(share.split);
  share.tile_end = share_end(ir.CreateAdd(share.split, kb.c32(1)));
  return share;
}

std::pair<int64_t, int64_t> EagerDzGrid::grid(int64_t ld, int64_t tiles) const {
  return {ceil_div(ld, int64_t{kTokensPerCta}), coef_only_ ? ceil_div(tiles, int64_t{kRowGroups}) : tiles};
}

Value* EagerDzGrid::first_token(KernelBuilder& kb, Value* tid) const {
  auto& ir = kb.ir();
  return ir.CreateMul(ir.CreateAdd(ir.CreateMul(ir.CreateZExt(kb.ctaid(0), kb.i64()), kb.c64(32)),
                                   ir.CreateZExt(ir.CreateAnd(tid, kb.c32(31)), kb.i64())),
                      kb.c64(kTokens));
}

Value* EagerDzGrid::tile(KernelBuilder& kb, Value* tid) const {
  auto& ir = kb.ir();
  Value* tile = ir.CreateZExt(kb.ctaid(1), kb.i64());
  if (coef_only_)
    tile = ir.CreateAdd(ir.CreateMul(tile, kb.c64(kRowGroups)), ir.CreateZExt(ir.CreateLShr(tid, kb.c32(5)), kb.i64()));
  return tile;
}

}  // namespace lfce
