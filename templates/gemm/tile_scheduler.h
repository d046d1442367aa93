// The order in which a GEMM kernel's CTAs take its output tiles, owned in one place for both sides
// of the launch (as CUTLASS's persistent tile scheduler owns its grid shape and its next-tile walk):
// the host asks grid() for the launch's grid, the generated code walks the same tiles in the same
// grouped order with origin() / walk(). The same for the two grids that are not one CTA per
// output tile: lse_forward's row groups by vocabulary splits (SplitForwardGrid) and eager_dz's
// token groups by vocabulary tiles (EagerDzGrid). And the TMA boxes through which the sm_90a
// pipeline loads each operand tile (tma_box()): the runtime's tensor maps and the pipeline's
// shared-memory ring are both built from them.
#pragma once

#include <cstdint>
#include <functional>
#include <string_view>
#include <utility>

#include "compiler/kernel_builder.h"
#include "compiler/kernel_spec.h"

namespace lfce {

// One TMA box: `inner` contiguous elements (one 128-byte swizzled row of 16-bit elements) by
// `outer` rows. A K-major operand tile is one box of {64 = BK, rows / parts}; an MN-major one is
// rows / 64 / parts boxes of {64 of M or N, BK}. `parts` is the cluster where the CTAs of a cluster
// each load a share of a tile they share (B, or A along N), else 1.
struct TmaBox {
  static constexpr int kElements = 64;  // 16-bit elements per 128-byte swizzled row
  int inner = kElements;
  int outer = 0;
  int boxes = 1;  // boxes per CTA per k slice
  int parts = 1;  // CTAs that share the tile, each loading 1 / parts of it
};
// Operand `which` (0: A, BM rows; 1: B, BN rows) of a wgmma tile stored in `layout`.
TmaBox tma_box(const TileConfig& tile, Layout layout, int which);

class TileScheduler {
 public:
  // Tiles are taken in groups of kGroupRows row blocks by as many column blocks as fit, rather
  // than whole columns, so that CTAs running together share their operand tiles in L2.
  static constexpr int kGroupRows = 16;

  explicit TileScheduler(const TileConfig& tile) : tile_(tile) {}

  // Host: the grid (x, y) for an output of tiles_m x tiles_n tiles (counts the caller checked
  // against CUDA's grid limits): one CTA per tile for mma.sync tiles; for wgmma tiles, persistent
  // CTAs (as many as fill the device, `device_ctas`, in whole clusters) that loop over the tiles,
  // counting them in 32 bits and stepping by the grid, so tiles + grid must not wrap (SpecError
  // naming `kernel` otherwise).
  std::pair<int64_t, int64_t> grid(int64_t tiles_m, int64_t tiles_n, int64_t device_ctas, std::string_view kernel) const;

  // Device: the (M block, N block), i32, of tile `pid` (i32) of a (grid_m, grid_n) grid, in grouped order.
  std::pair<llvm::Value*, llvm::Value*> blocks(KernelBuilder& kb, llvm::Value* pid, llvm::Value* grid_m,
                                               llvm::Value* grid_n) const;
  // Its origin (m0, n0), i64.
  std::pair<llvm::Value*, llvm::Value*> origin(KernelBuilder& kb, llvm::Value* pid, llvm::Value* grid_m,
                                               llvm::Value* grid_n) const;
  // The origin of the calling CTA's tile where the grid has one CTA per tile (launch order).
  std::pair<llvm::Value*, llvm::Value*> origin(KernelBuilder& kb) const;
  // Persistent CTAs, in two steps: prepare() where the grid is known (the tiles, or the clusters'
  // groups of tiles, to walk: emitted once, outside the warp roles), then walk() in each role: calls
  // `visit(m0, n0)` for each of the calling CTA's tiles, ctaid.x, ctaid.x + nctaid.x, ... in grouped
  // order; clustered tiles: each cluster takes groups of `cluster` tiles adjacent along M (along N
  // with cluster_n).
  struct Walk {
    llvm::Value* grid_m;  // i32: tiles, or clusters' groups of tiles, along M and N
    llvm::Value* grid_n;
    llvm::Value* count;   // i32: grid_m · grid_n
  };
  Walk prepare(KernelBuilder& kb, llvm::Value* grid_m, llvm::Value* grid_n) const;
  void walk(KernelBuilder& kb, const Walk& walk, const std::function<void(llvm::Value* m0, llvm::Value* n0)>& visit) const;
  // The same walk in one step, for a kernel without warp roles (no clusters).
  void walk(KernelBuilder& kb, llvm::Value* grid_m, llvm::Value* grid_n,
            const std::function<void(llvm::Value* m0, llvm::Value* n0)>& visit) const;

 private:
  TileConfig tile_;
};

// lse_forward's grid (templates/kernels/lse_forward.cpp): G row groups along x by S vocabulary
// splits along y. CTA (g, s) walks the row blocks g, g + G, g + 2G, ... and takes, in each, the
// s-th of S contiguous shares of the vocabulary tiles.
struct SplitForwardGrid {
  // CUDA's limit on grid y: the most splits.
  static constexpr int64_t kMaxSplits = 65535;

  int64_t row_groups = 1, splits = 1;

  // Host: the grid of about `ctas` CTAs for `tokens` rows and `vocab` columns in bm x bn tiles: as
  // many splits as the row blocks need to fill `ctas`, at least `min_splits`, at most one per
  // vocabulary tile and kMaxSplits; then as many row groups as fill the rest, at least one, at
  // most one per row block.
  static SplitForwardGrid for_ctas(int64_t ctas, int64_t tokens, int64_t vocab, int64_t bm, int64_t bn,
                                   int64_t min_splits);

  // Device: calls `visit(block)` (i32) for each of the calling CTA's row blocks, of `row_blocks` (i32).
  static void walk_row_blocks(KernelBuilder& kb, llvm::Value* row_blocks,
                              const std::function<void(llvm::Value* block)>& visit);
  // The calling CTA's split and its share [tile_begin, tile_end) of the `tiles` vocabulary tiles (i32 each).
  struct Share {
    llvm::Value *split, *tile_begin, *tile_end;
  };
  static Share share(KernelBuilder& kb, int64_t tiles);
};

// eager_dz's grid (templates/kernels/eager_dz.cpp): CTAs of kThreads threads, 32 token groups (a
// warp's lanes) of kTokens tokens by kRowGroups row groups (its warps). Along x the tokens,
// kTokensPerCta a CTA; along y the vocabulary tiles, one a CTA, or with `coef_only` (eager_dz
// storing only its constants) one a row group, kRowGroups consecutive tiles a CTA.
class EagerDzGrid {
 public:
  static constexpr int kThreads = 256, kTokens = 8, kRowGroups = kThreads / 32;
  static constexpr int kTokensPerCta = 32 * kTokens;

  explicit EagerDzGrid(bool coef_only) : coef_only_(coef_only) {}

  // Host: the grid (x, y) for a token stride `ld` and `tiles` vocabulary tiles (counts the caller
  // checks against CUDA's grid limits).
  std::pair<int64_t, int64_t> grid(int64_t ld, int64_t tiles) const;

  // Device: the first of the calling thread's kTokens tokens (i64), from its thread index `tid` (i32).
  llvm::Value* first_token(KernelBuilder& kb, llvm::Value* tid) const;
  // The vocabulary tile (i64) the calling thread's row group takes.
  llvm::Value* tile(KernelBuilder& kb, llvm::Value* tid) const;

 private:
  bool coef_only_;
};

}  // namespace lfce
