// The one GEMM skeleton every matrix kernel is written against.
//
//   compute_tile(A, B, m0, n0, k_tiles)      C[BM x BN] = Σ_k A[m0+m, k] · B[n0+n, k]
//     producer: cp.async copies of A and B tiles into a `stages`-deep shared-memory ring,
//               16-byte chunks, XOR-swizzled so ldmatrix reads are bank-conflict free;
//               edges are zero-filled, so any M, N, K works; rows that are not a multiple
//               of 16 bytes (GemmOperand::row_align) are copied in narrower pieces;
//     mainloop: replaceable — mma.sync tensor cores (16-bit inputs) or SIMT FMA (fp32);
//   or, for wgmma tiles (TileConfig::consumers > 0, sm_90a), the whole loop is replaced by a
//   warp-specialised pipeline (templates/gemm/wgmma_pipeline.cpp): TMA loads into a 128-byte-swizzled
//   ring signalled by mbarriers, wgmma consumer warpgroups; the kernel then takes two extra
//   TensorMap parameters (gemm_params), built by the runtime for the same operands;
//     staging:  the fp32 tile lands in shared memory, readable through staged();
//   epilogue:   each template's own slot, reading staged() and writing wherever it needs.
//
// Operands can be K-major (K contiguous) or MN-major (M or N contiguous); the three LFCE
// GEMMs need both (design.md §3). Each kind's layouts are in kKernelKinds (compiler/kernel_kind.h).
#pragma once

#include <functional>
#include <memory>
#include <tuple>
#include <utility>
#include <vector>

#include "compiler/kernel_builder.h"
#include "compiler/kernel_spec.h"

namespace lfce {

struct GemmOperand {
  llvm::Value* base;       // global pointer to element (0, 0)
  llvm::Value* ld;         // i64: elements between consecutive rows of the stored matrix
  Layout layout;
  llvm::Value* mn_extent;  // i64: rows (M for A, N for B) that exist
  llvm::Value* k_extent;   // i64: K that exists; contiguous extents are multiples of 16 bytes
  // Bytes every row (and the base) is aligned to, known when the kernel is generated: 16, or
  // for rows of H elements that are not a multiple of 16 bytes, hidden_row_align(H) (8, 4 or
  // the element size; H is then the contiguous extent, a whole number of such pieces). Such
  // rows are copied in pieces of this width (cp.async of 8 or 4 bytes, else element loads).
  int row_align = 16;
};

class Mainloop;
class WgmmaPipeline;

// One consumer thread's share of a wgmma accumulator tile (the m64nNk16 fragment layout), per
// m64 block i of the consumer's rows: tile rows row[2i] and row[2i + 1] = row[2i] + 8 and, in
// each n8 block j, columns col0 + 8j and col0 + 8j + 1; the four lanes of a quad (lane / 4
// equal) hold the same rows. Rows 2i and 2i + 1 are 64i apart from rows 0 and 1.
struct FragmentPosition {
  std::vector<llvm::Value*> row;  // i32, within the tile: two per m64 block
  llvm::Value* col0;              // i32: 2 · (lane % 4), plus a split consumer's first column (split_n)
  llvm::Value* quad_lane;         // i32: lane % 4
};
struct Fragment {
  FragmentPosition pos;
  // m64 block i's accumulators, then block i + 1's: acc[4·blocks()·i + 4j + 2h' + e] is row
  // row[2i + h'], column col0 + 8j + e.
  std::vector<llvm::Value*> acc;
  int rows() const { return static_cast<int>(pos.row.size()); }
  int blocks() const { return static_cast<int>(acc.size()) / (2 * rows()); }  // n8 blocks
  llvm::Value* at(int j, int h, int e) const { return acc[4 * blocks() * (h / 2) + 4 * j + 2 * (h % 2) + e]; }
  // Row row[h] and column col0 + 8j + e of a tile at (m0, n0), as i64 indices of the output.
  llvm::Value* row_at(KernelBuilder& kb, llvm::Value* m0, int h) const {
    return kb.ir().CreateAdd(m0, kb.ir().CreateZExt(pos.row[h], kb.i64()));
  }
  llvm::Value* col_at(KernelBuilder& kb, llvm::Value* n0, int j, int e = 0) const {
    return kb.ir().CreateAdd(n0, kb.ir().CreateZExt(kb.ir().CreateAdd(pos.col0, kb.c32(8 * j + e)), kb.i64()));
  }
};
using FragmentEpilogue = std::function<void(const Fragment&)>;
// Visits one tile: (m0, n0) i64, k_tiles i32; the epilogue runs on its accumulators.
using TileVisit = std::function<void(llvm::Value* m0, llvm::Value* n0, llvm::Value* k_tiles, const FragmentEpilogue&)>;
// Enumerates a CTA's tiles by calling visit on each, in the same order for both roles.
using TileSchedule = std::function<void(bool consumer, const TileVisit& visit)>;

// A transform of operand A on its way from shared memory to the tensor cores (sm_90a pipeline,
// run() only): each consumer thread loads its share of every k16 step's A fragment with ldmatrix
// (the m64k16 register fragment: per m64 block, the rows of its FragmentPosition, columns
// col0 + {0, 1} and col0 + 8 + {0, 1}), transforms it in registers and issues the wgmma with A from
// registers (the RS form) instead of from a shared-memory descriptor. The position the transform
// sees has the fragment's rows and, as col0, its first K column within a k16 step, 2 · (lane % 4). A stays in shared memory as
// TMA wrote it, 16-bit elements of any type the transform reads. Two paths: `pair` on every pair,
// and `fix`, for the whole warp, on the slices where `may_fix` holds in some lane (rare elements
// that `pair` gets wrong, such as eager's target column).
struct OperandTransform {
  // Per consumer thread and slice, loaded a slice ahead (so that global loads overlap the
  // previous slice's wgmmas): what `pair` and `may_fix` need, from the tile's origin m0 (i64), the
  // slice's first k (i64) and the thread's fragment position (rows within the tile; the thread's
  // A elements of k16 step ks are at columns k0 + 16·ks + col0 + 8·half + e, e = 0, 1).
  std::function<std::vector<llvm::Value*>(llvm::Value* m0, llvm::Value* k0, const FragmentPosition& pos)> slice;
  // One 32-bit pair of A as loaded (two stored elements, the lower column in the low half) at
  // fragment row pos.row[h], k16 step ks and half `half`: to the pair of the kernel's dtype the
  // wgmma reads.
  std::function<llvm::Value*(const std::vector<llvm::Value*>& state, llvm::Value* pair, int h, int ks, int half)> pair;
  // i1: whether `fix` may change a pair of this lane's warp in the slice.
  std::function<llvm::Value*(const std::vector<llvm::Value*>& state)> may_fix;
  // Corrects the slice's pairs from `pair`, pairs[(ks · rows + h) · 2 + half], rows = pos.row.size().
  std::function<void(llvm::Value* m0, llvm::Value* k0, const FragmentPosition& pos, std::vector<llvm::Value*>& pairs)>
      fix;
};

// Work for the producer warpgroup beside its TMA thread (sm_90a pipeline, run() only): `helpers`
// runs in warps 1..3 of warpgroup 0 (96 threads, `registers` each, a multiple of 8: the consumers
// get what the producer leaves) while the TMA thread walks the schedule, and `before_tile` runs in
// the TMA thread before it issues the first load of each tile (m0: the tile's first row, i64).
struct ProducerWork {
  int registers = 32;
  std::function<void()> helpers;
  std::function<void(llvm::Value* m0)> before_tile;
};

// The template's parameters followed by those the skeleton's mainloop needs (for wgmma tiles:
// tma_a and tma_b, the tensor maps of operands A and B, which the runtime builds where a
// kernel declares them and binds by these names).
std::vector<Param> gemm_params(const TileConfig& tile, std::vector<Param> params);

// Shared-memory bytes of the skeleton for one tile, computed without building IR (the
// autotuner prunes configs with it): the cp.async ring (stages x (A + B tiles)) and the staged
// fp32 tile (BM rows of BN+1 floats) overlap, so the larger of the two, rounded up to 16
// bytes; a template's own `extra_bytes` follow.
int gemm_smem_bytes(const TileConfig& tile, DType dtype, Layout a, Layout b, int extra_bytes = 0);

class GemmSkeleton {
 public:
  // The operand layouts are the spec's kind's (kKernelKinds in compiler/kernel_kind.h).
  GemmSkeleton(KernelBuilder& kb, const KernelSpec& spec);
  ~GemmSkeleton();

  // Shared memory: the pipeline ring and the staged tile overlap; templates may use the
  // bytes from extra_offset() on (extra_bytes of them, counted into smem_bytes()).
  int extra_offset() const;
  int smem_bytes(int extra_bytes) const { return extra_offset() + extra_bytes; }

  // Computes the tile at (m0, n0) (i64) over `k_tiles` (i32) BK-deep steps and stages it.
  // Every thread of the CTA must call it. Ends with a barrier: staged() is readable.
  void compute_tile(const GemmOperand& a, const GemmOperand& b, llvm::Value* m0, llvm::Value* n0,
                    llvm::Value* k_tiles);
  // The warp-specialised, register-epilogue form (wgmma tiles only): the schedule runs twice,
  // in the producer thread (each visit issues that tile's loads; the ring runs ahead across
  // tiles) and in every consumer thread (each visit runs the mainloop, then the epilogue on the
  // accumulators in registers). Nothing is staged and no CTA-wide barrier is taken, so the
  // schedule must not take one either; consumer-only state lives in the consumer's branch.
  void run_specialised(const TileSchedule& schedule, const OperandTransform* transform = nullptr,
                       const ProducerWork* work = nullptr);
  // Whether the spec's kernel transforms operand A (KernelSpec::eager_operand): run_persistent's
  // `transform` is then required.
  bool transforms() const { return transform_; }
  // run_specialised over a (grid_m, grid_n) grid of tiles (i32 counts), each K = k_tiles deep:
  // persistent CTAs take the tiles in the order of the TileScheduler (templates/gemm/tile_scheduler.h,
  // which also gives the host its grid), and `epilogue` runs on each tile's fragment with the
  // tile's origin (m0, n0), i64.
  using TileEpilogue = std::function<void(llvm::Value* m0, llvm::Value* n0, const Fragment&)>;
  // With `transform`, operand A reaches the wgmma through registers (OperandTransform); with
  // `work`, the producer warpgroup's spare warps and its TMA thread do more (ProducerWork).
  void run_persistent(llvm::Value* grid_m, llvm::Value* grid_n, llvm::Value* k_tiles, const TileEpilogue& epilogue,
                      const OperandTransform* transform = nullptr, const ProducerWork* work = nullptr);
  // The calling consumer thread's fragment rows and columns (wgmma tiles only).
  FragmentPosition fragment_position();
  bool specialised() const { return pipeline_ != nullptr; }
  // Address of staged element (r, c), both i32.
  llvm::Value* staged(llvm::Value* r, llvm::Value* c);
  // Visits every (r, c) of the tile once across the CTA; rows fastest (coalesced along M)
  // or columns fastest (coalesced along N).
  void for_each_element(bool rows_fastest, const std::function<void(llvm::Value*, llvm::Value*)>& body);
  // ceil(extent / tile) as i32, for an extent (i64) whose block count fits (the runtime checks).
  llvm::Value* blocks_for(llvm::Value* extent_i64, int tile);
  // ceil(extent / BK) as i32.
  llvm::Value* k_tiles_for(llvm::Value* k_extent_i64);

  int bm() const { return tile_.bm; }
  int bn() const { return tile_.bn; }

 private:
  void load_stage(const GemmOperand& op, int which, llvm::Value* slot, llvm::Value* mn0, llvm::Value* kt);

  KernelBuilder& kb_;
  TileConfig tile_;
  DType dtype_;
  bool transform_;
  Layout layouts_[2];
  std::unique_ptr<Mainloop> mainloop_;
  std::unique_ptr<WgmmaPipeline> pipeline_;
};

// Shared-memory geometry of one operand tile (rows x row_bytes, 16-byte chunks swizzled).
struct SmemTile {
  int rows;
  int row_bytes;
  int bytes() const { return rows * row_bytes; }
  // Byte offset of element (row, col) within the tile; col*elem_bytes % 16 may be non-zero.
  llvm::Value* offset(KernelBuilder& kb, llvm::Value* row, llvm::Value* col, int elem_bytes) const;
};

// Copies one `bytes`-wide piece (8, 4 or 2; narrower than the 16-byte cp.async the producer
// uses for aligned rows) of an operand row from global `src` to shared `dst` (i32 byte offset),
// or zeros when `valid` is false (src is then the operand's base, readable). 8 or 4 bytes:
// cp.async, and returns nothing; 2 bytes: loads the element and returns the shared store that
// finishes the copy (callers issue several loads before their stores). In mainloops.cpp.
std::function<void()> copy_narrow_piece(KernelBuilder& kb, llvm::Value* dst_offset, llvm::Value* src,
                                        llvm::Value* valid, int bytes);
// Element pieces loaded before their stores, per thread and producer loop iteration (4 made
// ptxas spill in lse_forward's default tile).
constexpr int kNarrowBatch = 2;

// A tensor-core or SIMT inner loop over one staged BK slice, plus the write-out of its
// accumulators to the staged tile.
class Mainloop {
 public:
  virtual ~Mainloop() = default;
  virtual void init() = 0;
  // a_base / b_base: shared-memory byte offsets (i32) of the current A and B slices.
  virtual void consume(llvm::Value* a_base, llvm::Value* b_base) = 0;
  virtual void store(const std::function<llvm::Value*(llvm::Value*, llvm::Value*)>& staged) = 0;
};

}  // namespace lfce

namespace lfce {

// What a mainloop needs to know of one operand's shared-memory tile.
struct OperandTile {
  SmemTile smem;
  Layout layout;
  // Byte offset of logical element (mn, k) within the tile.
  llvm::Value* offset(KernelBuilder& kb, llvm::Value* mn, llvm::Value* k, int elem_bytes) const {
    return layout == Layout::KMajor ? smem.offset(kb, mn, k, elem_bytes) : smem.offset(kb, k, mn, elem_bytes);
  }
};

// mma.sync m16n8k16 + ldmatrix for bf16/fp16; FMA on CUDA cores for fp32.
std::unique_ptr<Mainloop> make_mainloop(KernelBuilder& kb, const TileConfig& tile, DType dtype,
                                        const OperandTile& a, const OperandTile& b);

// The sm_90a pipeline for wgmma tiles: producer warpgroup 0 (one thread) issues TMA loads of
// the operand tiles from the kernel's tma_a / tma_b maps into a `stages`-deep ring; consumer
// warpgroups 1..C each run wgmma on BM/C rows and write their accumulators to the staged tile.
class WgmmaPipeline {
 public:
  virtual ~WgmmaPipeline() = default;
  // Every thread of the CTA calls it; ends with a CTA barrier (the staged tile is readable).
  virtual void compute_tile(llvm::Value* m0, llvm::Value* n0, llvm::Value* k_tiles,
                            const std::function<llvm::Value*(llvm::Value*, llvm::Value*)>& staged) = 0;
  // GemmSkeleton::run_specialised / fragment_position.
  virtual void run(const TileSchedule& schedule, const OperandTransform* transform, const ProducerWork* work) = 0;
  virtual FragmentPosition fragment_position() = 0;
};
// Emits the mbarrier initialisation at the current insertion point (the kernel's start).
std::unique_ptr<WgmmaPipeline> make_wgmma_pipeline(KernelBuilder& kb, const TileConfig& tile, DType dtype, Layout a,
                                                   Layout b);
// Shared-memory bytes of the pipeline (ring, overlapping staged fp32 tile, mbarriers).
int wgmma_smem_bytes(const TileConfig& tile, DType dtype);

}  // namespace lfce
