// The sm_90a GEMM pipeline: TMA + wgmma, warp-specialised.
//
// Shared memory, from the (1024-byte aligned) base:
//   ring   stages x [A tile | B tile], each in TMA's 128-byte-swizzled layout: a K-major tile is
//          rows of 64 elements (128 bytes), 8-row atoms of 1024 bytes one after the other; an
//          MN-major tile is one box per 64 rows of M (or N), each box BK rows of 128 bytes.
//   staged the fp32 tile BM x (BN+1), overlapping the ring (written only after the last wgmma
//          of the tile has read it);
//   bars   full[stages], empty[stages] and (ping-pong) order[2] mbarriers (8 bytes each), after
//          the larger of the two.
//
// Roles: warpgroup 0 is the producer; its thread 0 waits for a free slot (empty barrier),
// arms the full barrier with the slot's byte count and issues the TMA loads. Warpgroups 1..C
// are consumers: each waits for a full slot, issues BK/16 wgmma.m64nBNk16 per m64 block of its
// rows (TileConfig::consumer_rows), keeps one wgmma group in flight, and releases the previous
// slot (one arrival per warp).
// Phases: the k-th slice the CTA ever loads (a counter kept across tiles) uses slot k % stages
// and completes phase (k / stages) of its full barrier.
//
// Clusters (TileConfig::cluster = 2, run() only): the pair of CTAs computes two tiles adjacent
// along M that share their B tile; each CTA's producer loads its own A tile and half of B,
// multicast into both CTAs' rings at the same offsets, completing bytes on both CTAs' full
// barriers (each arms its own with the whole stage). A slot is refilled only once the consumers
// of both CTAs have released it: every consumer warp arrives on the empty barrier of each CTA.
// Along N (TileConfig::cluster_n) the pair's tiles are adjacent along N and share their A tile,
// of which each CTA loads its half and multicasts it; B is each CTA's own.
//
// Ping-pong (TileConfig::pingpong, run() only): each consumer warpgroup computes whole BM x BN
// tiles (one or two m64 blocks), the first consumer the schedule's tiles 0, 2, 4, ..., the second 1, 3, 5, .... The ring
// still fills in schedule order, so the second's mainloop starts as the first's ends, and each
// epilogue runs beside the other consumer's wgmma. A consumer's cursor skips the other's slices;
// a slot is released by the four warps of the consumer that read it. A consumer starts a tile's
// mainloop only after the other has waited for the last slice of the tile before (order
// barriers): a full barrier is then at most one phase behind the slice a consumer waits for,
// which a parity wait needs (the skipped slices would otherwise let it pass a phase early).
//
// Operand transform (OperandTransform, run() only): the consumers load each k16 step's A fragment
// from the ring with ldmatrix (transposed for MN-major A), hand each 32-bit pair to the
// transform and issue the wgmma with A from registers. A slice's fragments are all loaded and
// transformed before its wgmmas are issued (one wgmma.fence covers their registers), while the
// previous slice's wgmma group still runs.
//
// Split along N (TileConfig::split_n, run() only): both consumers compute all BM rows (BM / 64
// m64 blocks), each of its half of the columns, reading the whole A tile and its half of B; the
// slot's release counts both consumers' warps as in the cooperative tile.
//
// Two forms. compute_tile(): every thread calls it per tile; the consumers write their
// accumulators to the staged tile, which overlaps the ring, so a CTA barrier separates tiles
// (grad_weight, grad_input). run(): warp-specialised for the whole kernel; the producer thread
// walks the template's tile schedule issuing loads, running ahead into the next tile while the
// consumers run the template's epilogue on their accumulators in registers (lse_forward,
// dlogits_backward): no staged tile, no CTA barrier, setmaxnreg once.
#include "compiler/errors.h"
#include "templates/gemm/gemm_skeleton.h"
#include "templates/gemm/tile_scheduler.h"

namespace lfce {

using llvm::Value;

namespace {

constexpr int kSwizzleRow = 128;   // bytes of one swizzled row
constexpr int kAtomBytes = 1024;   // 8 rows x 128 bytes: the swizzle pattern's period
constexpr int kBoxElems = TmaBox::kElements;  // 16-bit elements per 128-byte row
// The producer warpgroup keeps this many registers per thread while it issues loads: enough for
// the templates' values live across the mainloop (row-block and tile loop state).
constexpr int kProducerRegisters = 32;
constexpr int kRingFree = 1;  // named barrier: every consumer is done reading the ring

struct Geometry {
  int a_bytes, b_bytes, stage_bytes, ring_bytes, staged_bytes, bars_offset, bytes;
};

Geometry geometry(const TileConfig& t, DType dtype) {
  const int e = dtype_bytes(dtype);
  Geometry g{};
  g.a_bytes = t.bm * t.bk * e;
  g.b_bytes = t.bn * t.bk * e;
  g.stage_bytes = g.a_bytes + g.b_bytes;
  g.ring_bytes = t.stages * g.stage_bytes;
  g.staged_bytes = t.bm * (t.bn + 1) * 4;
  g.bars_offset = (std::max(g.ring_bytes, g.staged_bytes) + 15) / 16 * 16;
  g.bytes = g.bars_offset + 16 * t.stages + (t.pingpong ? 16 : 0);
  return g;
}

class TmaWgmmaPipeline final : public WgmmaPipeline {
 public:
  TmaWgmmaPipeline(KernelBuilder& kb, const TileConfig& t, DType dtype, Layout a, Layout b)
      : kb_(kb), t_(t), bf16_(dtype == DType::BF16), a_(a), b_(b), g_(geometry(t, dtype)) {
    auto& ir = kb_.ir();
    // .minnctapersm with .maxntid pins the register count at entry, without which ptxas may
    // ignore every setmaxnreg (C7508, "unable to determine register count at entry"; NVIDIA's
    // own generators add it for that). setmaxnreg is also ignored in relocatable code (C7504):
    // the kernel cache compiles these kernels whole (runtime/kernel_cache.h).
    kb_.set_min_ctas_per_sm(t_.ctas_per_sm());
    counter_ = kb_.local_array(kb_.i32(), 1, "slices_loaded");
    kb_.store(kb_.c32(0), kb_.at(counter_, kb_.i32(), 0));
    kb_.if_then(ir.CreateICmpEQ(kb_.tid(), kb_.c32(0)), [&] {
      for (int s = 0; s < t_.stages; ++s) {
        kb_.mbarrier_init(full(kb_.c32(s)), 1);                   // the producer's expect_tx arrival
        // One arrival per warp of each consumer reading the slot, in each CTA of the cluster.
        kb_.mbarrier_init(empty(kb_.c32(s)), 4 * (t_.pingpong ? 1 : t_.consumers) * t_.cluster);
      }
      // Ping-pong order: consumer c waits on order[c], which the other consumer arrives on;
      // the first consumer's first turn is given here.
      if (t_.pingpong)
        for (int c = 0; c < 2; ++c) kb_.mbarrier_init(order(c), 1);
      kb_.mbarrier_init_fence();
      if (t_.pingpong) kb_.mbarrier_arrive(order(0));
    });
    if (t_.cluster > 1)
      kb_.cluster_sync();  // the peers' barriers are initialised before any multicast or remote arrival
    else
      kb_.barrier();
  }

  void compute_tile(Value* m0, Value* n0, Value* k_tiles,
                    const std::function<Value*(Value*, Value*)>& staged) override {
    if (t_.cluster > 1 || t_.pingpong || t_.split_n)
      throw InternalError("the staged wgmma form has no clusters, ping-pong or split tiles (tile " + t_.text() + ")");
    auto& ir = kb_.ir();
    Value* counter_ptr = kb_.at(counter_, kb_.i32(), 0);
    Value* first = kb_.load(kb_.i32(), counter_ptr);
    // The previous tile's epilogue may still read the staged tile, which overlaps the ring: every
    // thread's generic reads and writes of it are ordered before the barrier, and the fence orders
    // them before the TMA (async proxy) writes that refill the ring after it.
    kb_.fence_proxy_async();
    kb_.barrier();
    Value* tid = kb_.tid();
    Value* warpgroup = ir.CreateLShr(tid, kb_.c32(7));
    // Registers move from the producer, which needs few, to the consumers' accumulators for
    // the mainloop, and back for the epilogue that every thread runs.
    const int shared = register_share(), producer = kProducerRegisters, consumer = consumer_registers();
    kb_.if_then_else(
        ir.CreateICmpEQ(warpgroup, kb_.c32(0)),
        [&] {
          kb_.set_max_registers(false, producer);
          kb_.if_then(ir.CreateICmpEQ(tid, kb_.c32(0)), [&] {
            Value* cursor = cursor_state("producer_cursor", first);
            produce(cursor, m0, n0, k_tiles);
          });
          // Lane 0 of warp 0 rejoins its warp before the .aligned setmaxnreg and bar.sync.
          kb_.warp_sync();
          kb_.named_barrier(kRingFree, t_.threads());  // the consumers' twin is in stage()
          kb_.set_max_registers(true, shared);
        },
        [&] {
          kb_.set_max_registers(true, consumer);
          Value* consumer_index = ir.CreateSub(warpgroup, kb_.c32(1));
          Value* cursor = cursor_state("consumer_cursor", first);
          stage(mainloop(consumer_index, cursor, k_tiles), staged);
          kb_.set_max_registers(false, shared);
        });
    kb_.store(ir.CreateAdd(first, k_tiles), counter_ptr);
    kb_.barrier();  // the staged tile is complete
  }

  void run(const TileSchedule& schedule, const OperandTransform* transform, const ProducerWork* work) override {
    auto& ir = kb_.ir();
    Value* tid = kb_.tid();
    Value* warpgroup = ir.CreateLShr(tid, kb_.c32(7));
    if (work) {
      if (work->registers % 8 != 0 || work->registers < 24 || work->registers > 128)
        throw InternalError("producer registers " + std::to_string(work->registers) + " (a multiple of 8 in 24..128)");
      producer_registers_ = work->registers;
    }
    kb_.if_then_else(
        ir.CreateICmpEQ(warpgroup, kb_.c32(0)),
        [&] {
          // The producer keeps few registers for the whole kernel; its other threads are done
          // (or do the template's ProducerWork::helpers).
          kb_.set_max_registers(false, producer_registers_);
          kb_.if_then(ir.CreateICmpEQ(tid, kb_.c32(0)), [&] {
            Value* cursor = cursor_state("producer_cursor", kb_.c32(0));
            schedule(false, [&](Value* m0, Value* n0, Value* k_tiles, const FragmentEpilogue&) {
              if (work && work->before_tile) work->before_tile(m0);
              produce(cursor, m0, n0, k_tiles);
            });
          });
          kb_.warp_sync();
          if (work && work->helpers) kb_.if_then(ir.CreateICmpUGE(tid, kb_.c32(32)), work->helpers);
        },
        [&] {
          kb_.set_max_registers(true, consumer_registers());
          Value* consumer_index = ir.CreateSub(warpgroup, kb_.c32(1));
          Value* cursor = cursor_state("consumer_cursor", kb_.c32(0));
          // Ping-pong: 0 on this consumer's tiles (the first consumer's turn comes first).
          Value* turn = nullptr;  // and the parity of the next order wait
          if (t_.pingpong) {
            turn = kb_.local_array(kb_.i32(), 2, "turn");
            kb_.store(consumer_index, kb_.at(turn, kb_.i32(), 0));
            kb_.store(kb_.c32(0), kb_.at(turn, kb_.i32(), 1));
          }
          schedule(true, [&](Value* m0, Value*, Value* k_tiles, const FragmentEpilogue& epilogue) {
            kb_.warp_sync();  // the previous epilogue may have branched per lane
            auto compute = [&] {
              Value* order_me = nullptr;
              if (t_.pingpong) {
                Value* parity = kb_.load(kb_.i32(), kb_.at(turn, kb_.i32(), 1));
                order_me = ir.CreateAdd(kb_.c32(order_offset()), ir.CreateMul(consumer_index, kb_.c32(8)));
                kb_.mbarrier_wait(order_me, parity);
                kb_.store(ir.CreateXor(parity, kb_.c32(1)), kb_.at(turn, kb_.i32(), 1));
              }
              std::vector<Value*> acc = transform ? mainloop_transformed(consumer_index, cursor, k_tiles, *transform, m0)
                                                  : mainloop(consumer_index, cursor, k_tiles);
              if (t_.pingpong) {  // every slice of this tile has landed: the other consumer's turn
                Value* order_other = ir.CreateSub(kb_.c32(2 * order_offset() + 8), order_me);
                kb_.if_then(ir.CreateICmpEQ(ir.CreateAnd(kb_.tid(), kb_.c32(127)), kb_.c32(0)),
                            [&] { kb_.mbarrier_arrive(order_other); });
                kb_.warp_sync();
              }
              // The position is recomputed from an opaque thread index after the mainloop, so that
              // what the epilogue derives from it (a column index per accumulator) is not hoisted
              // out of the tile loop and held in registers through the mainloop.
              epilogue(Fragment{position_of(kb_.opaque_i32(kb_.tid())), acc});
            };
            if (!t_.pingpong) {
              compute();
              return;
            }
            Value* mine = kb_.load(kb_.i32(), kb_.at(turn, kb_.i32(), 0));
            kb_.if_then_else(ir.CreateICmpEQ(mine, kb_.c32(0)), compute, [&] { skip(cursor, k_tiles); });
            kb_.store(ir.CreateXor(mine, kb_.c32(1)), kb_.at(turn, kb_.i32(), 0));
          });
        });
    if (t_.cluster > 1) {
      // No CTA exits while its peer may still arrive on its barriers (the last releases).
      kb_.warp_sync();
      kb_.cluster_sync();
    }
  }

  FragmentPosition fragment_position() override { return position_of(kb_.tid()); }

 private:
  FragmentPosition position_of(Value* tid) {
    auto& ir = kb_.ir();
    Value* lane = ir.CreateAnd(tid, kb_.c32(31));
    Value* warp_in_group = ir.CreateAnd(ir.CreateLShr(tid, kb_.c32(5)), kb_.c32(3));
    Value* row0 = ir.CreateAdd(ir.CreateMul(warp_in_group, kb_.c32(16)), ir.CreateLShr(lane, kb_.c32(2)));
    auto consumer = [&] { return ir.CreateSub(ir.CreateLShr(tid, kb_.c32(7)), kb_.c32(1)); };
    if (!t_.pingpong && !t_.split_n)  // consumer c owns rows [c·R, c·R + R) of the tile, R = consumer_rows()
      row0 = ir.CreateAdd(ir.CreateMul(consumer(), kb_.c32(t_.consumer_rows())), row0);
    Value* quad_lane = ir.CreateAnd(lane, kb_.c32(3));
    std::vector<Value*> rows;
    for (int i = 0; i < t_.m_blocks(); ++i)
      for (int h = 0; h < 2; ++h) rows.push_back(i + h == 0 ? row0 : ir.CreateAdd(row0, kb_.c32(64 * i + 8 * h)));
    Value* col0 = ir.CreateMul(quad_lane, kb_.c32(2));
    if (t_.split_n)  // a split consumer c owns columns [c·C, c·C + C), C = consumer_cols()
      col0 = ir.CreateAdd(col0, ir.CreateMul(consumer(), kb_.c32(t_.consumer_cols())));
    return {rows, col0, quad_lane};
  }

  // A per-thread (slot, phase, previous slot) cursor, starting at slice `first`.
  Value* cursor_state(const char* name, Value* first) {
    Value* state = kb_.local_array(kb_.i32(), 3, name);
    Cursor start = cursor_at(first);
    kb_.store(start.slot, kb_.at(state, kb_.i32(), 0));
    kb_.store(start.phase, kb_.at(state, kb_.i32(), 1));
    kb_.store(start.slot, kb_.at(state, kb_.i32(), 2));
    return state;
  }

  int order_offset() const { return g_.bars_offset + 16 * t_.stages; }
  Value* order(int c) { return kb_.c32(order_offset() + 8 * c); }
  Value* full(Value* slot) { return kb_.ir().CreateAdd(kb_.c32(g_.bars_offset), kb_.ir().CreateMul(slot, kb_.c32(8))); }
  Value* empty(Value* slot) {
    return kb_.ir().CreateAdd(kb_.c32(g_.bars_offset + 8 * t_.stages), kb_.ir().CreateMul(slot, kb_.c32(8)));
  }
  // Registers per thread when all warpgroups share the register file equally (what ptxas
  // allocates under .maxntid), and the consumers' share once the producer has given up all
  // but kProducerRegisters: both multiples of 8, as setmaxnreg needs.
  int register_share() const { return std::min(255, 65536 / (t_.threads() * t_.ctas_per_sm())) / 8 * 8; }
  int consumer_registers() const {
    const int pool = register_share() * t_.threads() - producer_registers_ * 128;
    return std::min(240, pool / (128 * t_.consumers) / 8 * 8);
  }
  // max(k_tiles, 1), in both roles (produce and mainloop): a tile with no K (never asked for today) then loads one
  // slice of TMA's out-of-bounds zeros, the same zero result. A mainloop that may run zero
  // times leaves the zero-initialised accumulators flowing to the epilogue, and ptxas then
  // serialises every wgmma of the kernel (C7515: seen in grad_weight / grad_input, whose K is
  // a run-time size).
  Value* at_least_one(Value* k_tiles) {
    auto& ir = kb_.ir();
    return ir.CreateSelect(ir.CreateICmpSLT(k_tiles, kb_.c32(1)), kb_.c32(1), k_tiles);
  }
  Value* slot_of(Value* k) { return kb_.ir().CreateURem(k, kb_.c32(t_.stages)); }
  Value* parity_of(Value* k) { return kb_.ir().CreateAnd(kb_.ir().CreateUDiv(k, kb_.c32(t_.stages)), kb_.c32(1)); }
  Value* a_base(Value* slot) { return kb_.ir().CreateMul(slot, kb_.c32(g_.stage_bytes)); }
  Value* b_base(Value* slot) { return kb_.ir().CreateAdd(a_base(slot), kb_.c32(g_.a_bytes)); }

  // Loads operand `which`'s tile rows [mn0, mn0 + rows) x K slice kt into `dst`, in the boxes of
  // tma_box (templates/gemm/tile_scheduler.h), the ones the runtime's tensor map has. With `rank` (i32,
  // a CTA of the cluster: the operand the cluster shares), only that CTA's 1/cluster share of the
  // rows, multicast to every CTA.
  void load(Value* map, Layout layout, int which, Value* dst, Value* mn0, Value* kt, Value* bar, Value* rank) {
    auto& ir = kb_.ir();
    const TmaBox box = tma_box(t_, layout, which);
    if ((box.parts > 1) != (rank != nullptr)) throw InternalError("a TMA share without its cluster rank");
    Value* mn = ir.CreateTrunc(mn0, kb_.i32());
    Value* k = ir.CreateMul(kt, kb_.c32(t_.bk));
    Value* mask = ir.getInt16((1u << t_.cluster) - 1);
    auto copy = [&](Value* to, Value* c0, Value* c1) {
      if (rank)
        kb_.tma_load_2d_multicast(to, map, c0, c1, bar, mask);
      else
        kb_.tma_load_2d(to, map, c0, c1, bar);
    };
    if (layout == Layout::KMajor) {  // one box {BK, rows / parts}: 128-byte rows, whole atoms
      Value* first = rank ? ir.CreateMul(rank, kb_.c32(box.outer)) : kb_.c32(0);
      copy(ir.CreateAdd(dst, ir.CreateMul(first, kb_.c32(kSwizzleRow))), k, ir.CreateAdd(mn, first));
      return;
    }
    // Boxes {64, BK}, one per 64 rows of M or N; this CTA's share of them.
    Value* first_box = rank ? ir.CreateMul(rank, kb_.c32(box.boxes)) : kb_.c32(0);
    for (int j = 0; j < box.boxes; ++j) {
      Value* at = ir.CreateAdd(first_box, kb_.c32(j));
      copy(ir.CreateAdd(dst, ir.CreateMul(at, kb_.c32(t_.bk * kSwizzleRow))),
           ir.CreateAdd(mn, ir.CreateMul(at, kb_.c32(kBoxElems))), k);
    }
  }

  // Issues the loads of one tile's k_tiles slices, from the slice `state` points at on.
  void produce(Value* state, Value* m0, Value* n0, Value* k_tiles) {
    auto& ir = kb_.ir();
    // Opaque: with a small constant K (H = 512: 8 slices) LLVM unrolled this loop whole, and the
    // addresses it computed ahead did not fit the producer's 32 registers (ptxas spilled 116
    // bytes; the driver's JIT 48: H200, commit baaf8ed).
    k_tiles = kb_.opaque_i32(at_least_one(k_tiles));
    Value* map_a = kb_.tensor_map("tma_a");
    Value* map_b = kb_.tensor_map("tma_b");
    // The shared operand (B; A along N): this CTA's share, multicast.
    Value* rank = t_.cluster > 1 ? kb_.cluster_rank() : nullptr;
    Value* rank_a = t_.cluster_n ? rank : nullptr;
    Value* rank_b = t_.cluster_n ? nullptr : rank;
    kb_.for_range(kb_.c32(0), k_tiles, kb_.c32(1), [&](Value* kt) {
      Cursor c = load_cursor(state);
      // A fresh barrier counts as having completed the phase before its first: phase ^ 1
      // passes at once for each slot's first use.
      kb_.mbarrier_wait(empty(c.slot), ir.CreateXor(c.phase, kb_.c32(1)));
      kb_.mbarrier_arrive_expect_tx(full(c.slot), g_.stage_bytes);  // out-of-bounds zeros count too
      load(map_a, a_, 0, a_base(c.slot), m0, kt, full(c.slot), rank_a);
      load(map_b, b_, 1, b_base(c.slot), n0, kt, full(c.slot), rank_b);
      Cursor next = advance(c);
      kb_.store(next.slot, kb_.at(state, kb_.i32(), 0));
      kb_.store(next.phase, kb_.at(state, kb_.i32(), 1));
    });
  }

  // A shared-memory matrix descriptor (128-byte swizzle) for the tile at byte offset `start`.
  Value* descriptor(Value* start, int leading_bytes, int stride_bytes) {
    auto& ir = kb_.ir();
    Value* addr = ir.CreateZExt(kb_.smem_addr(start), kb_.i64());
    Value* d = ir.CreateLShr(ir.CreateAnd(addr, kb_.c64(0x3FFFF)), kb_.c64(4));
    uint64_t fixed = (uint64_t(leading_bytes >> 4) << 16) | (uint64_t(stride_bytes >> 4) << 32) | (uint64_t{1} << 62);
    return ir.CreateOr(d, kb_.c64(static_cast<int64_t>(fixed)));
  }

  // The descriptor of an operand tile at `base` (its first k16 step), and the amount k16 step
  // `ks` adds to it: the start address field counts 16-byte units, and every address of the
  // ring stays below 2^18, so adding to the low field never carries into the next.
  Value* operand_descriptor(Layout layout, Value* base) {
    if (layout == Layout::KMajor) return descriptor(base, 16, kAtomBytes);  // rows of 128 bytes
    // MN-major: box j holds rows [64j, 64j + 64). Leading byte offset: from one 64-element
    // column of M/N to the next (the next box); stride: the next 8 k.
    return descriptor(base, t_.bk * kSwizzleRow, kAtomBytes);
  }
  int64_t k_step(Layout layout, int ks) const {
    // K-major: k16 = 32 bytes along the 128-byte row; MN-major: two 8-row atoms.
    return (layout == Layout::KMajor ? ks * 32 : ks * 2 * kAtomBytes) >> 4;
  }

  // (slot, phase) of the next slice: slot = k % stages and phase = (k / stages) & 1, advanced
  // by one per slice instead of divided out each time.
  struct Cursor {
    Value* slot;
    Value* phase;
  };
  Cursor cursor_at(Value* k) { return {slot_of(k), parity_of(k)}; }
  Cursor advance(const Cursor& c) {
    auto& ir = kb_.ir();
    Value* next = ir.CreateAdd(c.slot, kb_.c32(1));
    Value* wrap = ir.CreateICmpEQ(next, kb_.c32(t_.stages));
    return {ir.CreateSelect(wrap, kb_.c32(0), next), ir.CreateSelect(wrap, ir.CreateXor(c.phase, kb_.c32(1)), c.phase)};
  }

  // What a consumer's mainloop keeps for one tile: its accumulators (in a local array between
  // slices, restored before and saved after each slice's wgmmas), its lane, and where its rows of A
  // and columns of B start in a slot.
  struct ConsumerTile {
    Value* array;
    std::vector<Value*> acc;
    Value *lane, *lane0;
    int block_bytes;  // of one m64 block of A
    Value *a_row_bytes, *b_col_bytes;
  };
  ConsumerTile consumer_tile(Value* consumer) {
    auto& ir = kb_.ir();
    const int count = t_.accumulators();
    ConsumerTile ct{kb_.local_array(kb_.f32(), count, "acc"), std::vector<Value*>(count, kb_.cf(0.f)), nullptr, nullptr, 0,
                    nullptr, nullptr};
    save(ct);
    Value* tid = kb_.tid();
    ct.lane = ir.CreateAnd(tid, kb_.c32(31));
    ct.lane0 = ir.CreateICmpEQ(ct.lane, kb_.c32(0));
    // m64 block b of A starts at 64b rows (K-major) or at box b (MN-major); consumer c's first
    // block is c · m_blocks (a ping-pong consumer's tile is all of A).
    ct.block_bytes = a_ == Layout::KMajor ? 64 * kSwizzleRow : t_.bk * kSwizzleRow;
    ct.a_row_bytes = t_.pingpong || t_.split_n ? kb_.c32(0) : ir.CreateMul(consumer, kb_.c32(t_.m_blocks() * ct.block_bytes));
    // A split consumer's B columns start at c · BN / 2: rows of 128 bytes (K-major, whole 8-row
    // atoms) or boxes of 64 (MN-major, whole boxes: validated).
    ct.b_col_bytes = nullptr;
    if (t_.split_n)
      ct.b_col_bytes = ir.CreateMul(consumer, kb_.c32(b_ == Layout::KMajor ? t_.consumer_cols() * kSwizzleRow
                                                                             : t_.consumer_cols() / kBoxElems * t_.bk * kSwizzleRow));
    return ct;
  }
  void save(const ConsumerTile& ct) {
    for (size_t i = 0; i < ct.acc.size(); ++i) kb_.store(ct.acc[i], kb_.at(ct.array, kb_.f32(), int(i)));
  }
  void restore(ConsumerTile& ct) {
    for (size_t i = 0; i < ct.acc.size(); ++i) ct.acc[i] = kb_.load(kb_.f32(), kb_.at(ct.array, kb_.f32(), int(i)));
  }
  Value* block_row_bytes(const ConsumerTile& ct, int i) {
    return i == 0 ? ct.a_row_bytes : kb_.ir().CreateAdd(ct.a_row_bytes, kb_.c32(i * ct.block_bytes));
  }
  Value* b_descriptor(const ConsumerTile& ct, Value* slot) {
    return operand_descriptor(b_, ct.b_col_bytes ? kb_.ir().CreateAdd(b_base(slot), ct.b_col_bytes) : b_base(slot));
  }
  // The end of slice kt, whose wgmmas are issued: commit them, wait for the previous slice's
  // group, release that slice's slot and move `state` on.
  void end_slice(ConsumerTile& ct, Value* state, const Cursor& c, Value* previous, Value* kt) {
    auto& ir = kb_.ir();
    kb_.wgmma_commit();
    ct.acc = kb_.wgmma_wait(1, ct.acc);  // slice kt - 1's wgmma group has finished reading its slot
    save(ct);
    kb_.if_then(ir.CreateAnd(ct.lane0, ir.CreateICmpSGT(kt, kb_.c32(0))), [&] { release(previous); });
    kb_.warp_sync();  // converged for the next wgmma.fence
    Cursor next = advance(c);
    kb_.store(next.slot, kb_.at(state, kb_.i32(), 0));
    kb_.store(next.phase, kb_.at(state, kb_.i32(), 1));
    kb_.store(c.slot, kb_.at(state, kb_.i32(), 2));
  }
  // After the tile's last slice: every group finished, the last slot released; the accumulators.
  std::vector<Value*> end_tile(ConsumerTile& ct, Value* state, Value* k_tiles) {
    auto& ir = kb_.ir();
    restore(ct);
    ct.acc = kb_.wgmma_wait(0, ct.acc);
    Value* last = kb_.load(kb_.i32(), kb_.at(state, kb_.i32(), 2));
    kb_.if_then(ir.CreateAnd(ct.lane0, ir.CreateICmpSGT(k_tiles, kb_.c32(0))), [&] { release(last); });
    kb_.warp_sync();
    return ct.acc;
  }
  Cursor load_cursor(Value* state) {
    return {kb_.load(kb_.i32(), kb_.at(state, kb_.i32(), 0)), kb_.load(kb_.i32(), kb_.at(state, kb_.i32(), 1))};
  }

  // One tile's mainloop in a consumer warpgroup, from the slice `state` points at on: returns
  // the finished accumulators, every slot of the tile released.
  std::vector<Value*> mainloop(Value* consumer, Value* state, Value* k_tiles) {
    auto& ir = kb_.ir();
    k_tiles = at_least_one(k_tiles);
    const int per_block = t_.consumer_cols() / 2;
    ConsumerTile ct = consumer_tile(consumer);
    // state: slot and phase of the current slice, and the slot of the previous one (released
    // once its wgmma group has finished).
    kb_.wgmma_fence();
    kb_.for_range(kb_.c32(0), k_tiles, kb_.c32(1), [&](Value* kt) {
      Cursor c = load_cursor(state);
      Value* previous = kb_.load(kb_.i32(), kb_.at(state, kb_.i32(), 2));
      kb_.mbarrier_wait(full(c.slot), c.phase);
      restore(ct);
      kb_.wgmma_fence();
      std::vector<Value*> desc_a(t_.m_blocks());
      for (int i = 0; i < t_.m_blocks(); ++i) desc_a[i] = operand_descriptor(a_, ir.CreateAdd(a_base(c.slot), block_row_bytes(ct, i)));
      Value* desc_b = b_descriptor(ct, c.slot);
      for (int ks = 0; ks < t_.bk / 16; ++ks)
        for (int i = 0; i < t_.m_blocks(); ++i) {  // the blocks share the k16 step's B
          std::vector<Value*> block(ct.acc.begin() + i * per_block, ct.acc.begin() + (i + 1) * per_block);
          block = kb_.wgmma_m64k16(bf16_, t_.consumer_cols(), ir.CreateAdd(desc_a[i], kb_.c64(k_step(a_, ks))),
                                   ir.CreateAdd(desc_b, kb_.c64(k_step(b_, ks))), block, a_ == Layout::MNMajor,
                                   b_ == Layout::MNMajor);
          std::copy(block.begin(), block.end(), ct.acc.begin() + i * per_block);
        }
      end_slice(ct, state, c, previous, kt);
    });
    return end_tile(ct, state, k_tiles);
  }

  // mainloop() with A from registers through `transform` (the tile's origin m0 along M, i64). The
  // loop is unrolled twice: each slice's fragments are written while the previous slice's wgmma
  // group may still read its own, which must then be other registers (ptxas keeps a register an
  // in-flight wgmma reads only from being redefined by another instruction of the PTX, not the
  // same PTX register from being written again by the next trip around a loop). The next slice's
  // constants are loaded before this slice's wait.
  std::vector<Value*> mainloop_transformed(Value* consumer, Value* state, Value* k_tiles,
                                           const OperandTransform& transform, Value* m0) {
    auto& ir = kb_.ir();
    k_tiles = at_least_one(k_tiles);
    const int per_block = t_.consumer_cols() / 2, steps = t_.bk / 16;
    ConsumerTile ct = consumer_tile(consumer);
    Value* lane_bytes = fragment_lane_bytes(ct.lane);
    // The fragment's rows, and as col0 its first K column in a k16 step (not a split consumer's N offset).
    FragmentPosition pos = position_of(kb_.tid());
    pos.col0 = ir.CreateMul(pos.quad_lane, kb_.c32(2));
    const int rows = static_cast<int>(pos.row.size());
    auto k_of = [&](Value* kt) { return ir.CreateMul(ir.CreateZExt(kt, kb_.i64()), kb_.c64(t_.bk)); };
    // The constants of the slice about to be consumed, carried from the slice before.
    std::vector<Value*> first = transform.slice(m0, kb_.c64(0), pos);
    std::vector<Value*> carried(first.size());
    for (size_t i = 0; i < first.size(); ++i) {
      carried[i] = kb_.local_array(first[i]->getType(), 1, "operand_constants");
      kb_.store(first[i], kb_.at(carried[i], first[i]->getType(), 0));
    }
    Value* fixed = kb_.local_array(kb_.i32(), steps * rows * 2, "fixed_pairs");
    kb_.wgmma_fence();
    auto slice = [&](Value* kt) {
      Cursor c = load_cursor(state);
      Value* previous = kb_.load(kb_.i32(), kb_.at(state, kb_.i32(), 2));
      std::vector<Value*> constants(first.size());
      for (size_t i = 0; i < first.size(); ++i) constants[i] = kb_.load(first[i]->getType(), kb_.at(carried[i], first[i]->getType(), 0));
      Value* next_kt = ir.CreateAdd(kt, kb_.c32(1));
      next_kt = ir.CreateSelect(ir.CreateICmpSLT(next_kt, k_tiles), next_kt, kt);
      std::vector<Value*> upcoming = transform.slice(m0, k_of(next_kt), pos);
      for (size_t i = 0; i < first.size(); ++i) kb_.store(upcoming[i], kb_.at(carried[i], first[i]->getType(), 0));
      kb_.mbarrier_wait(full(c.slot), c.phase);
      // pairs[(ks · rows + h) · 2 + half], as OperandTransform::fix takes them.
      std::vector<Value*> pairs(steps * rows * 2);
      for (int ks = 0; ks < steps; ++ks)
        for (int i = 0; i < t_.m_blocks(); ++i) {
          Value* at = ir.CreateAdd(ir.CreateAdd(a_base(c.slot), block_row_bytes(ct, i)), fragment_step_bytes(lane_bytes, ks));
          std::array<Value*, 4> a = kb_.ldmatrix_x4(kb_.smem(at), a_ == Layout::MNMajor);
          for (int q = 0; q < 4; ++q) {
            const int h = 2 * i + q % 2, half = q / 2;
            pairs[(ks * rows + h) * 2 + half] = transform.pair(constants, a[q], h, ks, half);
          }
        }
      // The rare slices with elements `pair` got wrong, for the whole warp.
      for (size_t i = 0; i < pairs.size(); ++i) kb_.store(pairs[i], kb_.at(fixed, kb_.i32(), int(i)));
      kb_.if_then(kb_.vote_any(transform.may_fix(constants)), [&] {
        std::vector<Value*> in(pairs.size());
        for (size_t i = 0; i < in.size(); ++i) in[i] = kb_.load(kb_.i32(), kb_.at(fixed, kb_.i32(), int(i)));
        transform.fix(m0, k_of(kt), pos, in);
        for (size_t i = 0; i < in.size(); ++i) kb_.store(in[i], kb_.at(fixed, kb_.i32(), int(i)));
      });
      kb_.warp_sync();
      for (size_t i = 0; i < pairs.size(); ++i) pairs[i] = kb_.load(kb_.i32(), kb_.at(fixed, kb_.i32(), int(i)));
      restore(ct);
      kb_.wgmma_fence();
      Value* desc_b = b_descriptor(ct, c.slot);
      for (int ks = 0; ks < steps; ++ks)
        for (int i = 0; i < t_.m_blocks(); ++i) {
          std::array<Value*, 4> a;
          for (int q = 0; q < 4; ++q) a[q] = pairs[(ks * rows + 2 * i + q % 2) * 2 + q / 2];
          std::vector<Value*> block(ct.acc.begin() + i * per_block, ct.acc.begin() + (i + 1) * per_block);
          block = kb_.wgmma_m64k16_rs(bf16_, t_.consumer_cols(), a, ir.CreateAdd(desc_b, kb_.c64(k_step(b_, ks))), block,
                                      b_ == Layout::MNMajor);
          std::copy(block.begin(), block.end(), ct.acc.begin() + i * per_block);
        }
      end_slice(ct, state, c, previous, kt);
    };
    kb_.for_range(kb_.c32(0), k_tiles, kb_.c32(2), [&](Value* kt) {
      slice(kt);
      Value* odd = ir.CreateAdd(kt, kb_.c32(1));
      kb_.if_then(ir.CreateICmpSLT(odd, k_tiles), [&] { slice(odd); });
    });
    return end_tile(ct, state, k_tiles);
  }

  // ldmatrix addresses of A fragments in the 128-byte-swizzled ring (chunk c of a 128-byte row r
  // is stored at chunk c ^ (r % 8)). Lane l = 8q + i of warp w of the warpgroup addresses row i
  // of matrix q: K-major A, row 16w + 8·(q % 2) + i (of M) and chunk 2·ks + q / 2 (of K);
  // MN-major A (rows of K within a box of 64 M), row 16·ks + 8·(q / 2) + i and chunk 2w + q % 2.
  // The part that does not depend on the k16 step ks: K-major, the row's bytes in the high bits
  // and the chunk (q / 2) ^ i, times 16, in the low 7, which the step XORs; MN-major, all of it.
  Value* fragment_lane_bytes(Value* lane) {
    auto& ir = kb_.ir();
    Value* warp = ir.CreateAnd(ir.CreateLShr(kb_.tid(), kb_.c32(5)), kb_.c32(3));
    Value* q = ir.CreateLShr(lane, kb_.c32(3));
    Value* i = ir.CreateAnd(lane, kb_.c32(7));
    Value* q_low = ir.CreateAnd(q, kb_.c32(1));
    Value* q_high = ir.CreateLShr(q, kb_.c32(1));
    Value *row, *chunk;
    if (a_ == Layout::KMajor) {
      row = ir.CreateAdd(ir.CreateAdd(ir.CreateMul(warp, kb_.c32(16)), ir.CreateMul(q_low, kb_.c32(8))), i);
      chunk = ir.CreateXor(q_high, i);
    } else {
      row = ir.CreateAdd(ir.CreateMul(q_high, kb_.c32(8)), i);
      chunk = ir.CreateXor(ir.CreateAdd(ir.CreateMul(warp, kb_.c32(2)), q_low), i);
    }
    return ir.CreateOr(ir.CreateMul(row, kb_.c32(kSwizzleRow)), ir.CreateMul(chunk, kb_.c32(16)));
  }
  // Step ks's address: K-major, chunk (2·ks + q / 2) ^ i = (q / 2 ^ i) ^ 2·ks; MN-major, 16 rows on.
  Value* fragment_step_bytes(Value* lane_bytes, int ks) {
    auto& ir = kb_.ir();
    if (ks == 0) return lane_bytes;
    if (a_ == Layout::KMajor) return ir.CreateXor(lane_bytes, kb_.c32(32 * ks));
    return ir.CreateAdd(lane_bytes, kb_.c32(16 * ks * kSwizzleRow));
  }

  // Moves a consumer's cursor past the other consumer's tile of k_tiles slices (ping-pong).
  void skip(Value* state, Value* k_tiles) {
    auto& ir = kb_.ir();
    Value* slot = kb_.load(kb_.i32(), kb_.at(state, kb_.i32(), 0));
    Value* phase = kb_.load(kb_.i32(), kb_.at(state, kb_.i32(), 1));
    Value* total = ir.CreateAdd(slot, at_least_one(k_tiles));
    kb_.store(slot_of(total), kb_.at(state, kb_.i32(), 0));
    kb_.store(ir.CreateXor(phase, parity_of(total)), kb_.at(state, kb_.i32(), 1));
  }

  // A consumer warp's release of `slot`: on its own CTA's empty barrier, and on each peer's,
  // whose producer multicasts into this CTA's ring too.
  void release(Value* slot) {
    if (t_.cluster == 1) {
      kb_.mbarrier_arrive(empty(slot));
      return;
    }
    for (int r = 0; r < t_.cluster; ++r) kb_.mbarrier_arrive_cluster(empty(slot), kb_.c32(r));
  }

  // Writes a consumer's accumulators to the staged tile.
  void stage(const std::vector<Value*>& acc, const std::function<Value*(Value*, Value*)>& staged) {
    auto& ir = kb_.ir();
    const int count = t_.accumulators(), per_block = t_.bn / 2;
    // Every consumer has finished reading the ring before any writes the overlapping staged tile.
    // The producer's threads join this barrier too (they are done by then): with all threads of
    // the CTA counted, compute-sanitizer's racecheck follows it (it reported every staged read
    // as a race after a barrier counting the consumers alone).
    kb_.named_barrier(kRingFree, t_.threads());
    // One base address and constant offsets (the staged tile is row-major, BN + 1 floats per
    // row; accumulator i is at fragment row (i % 4) / 2, n8 block i / 4, column i % 2): 128
    // separately computed addresses would be hoisted out of a template's tile loop and held in
    // registers through the mainloop. The base goes through an opaque move so that LICM cannot
    // hoist the 128 constant-offset addresses out of a template's tile loop either.
    FragmentPosition pos = fragment_position();
    Value* base = kb_.opaque(staged(pos.row[0], pos.col0));
    for (int a = 0; a < count; ++a) {
      const int block = a / per_block, i = a % per_block;  // m64 block, then as in one block
      const int offset = ((64 * block + ((i % 4) / 2) * 8) * (t_.bn + 1) + (i / 4) * 8 + i % 2) * 4;
      kb_.store(acc[a], ir.CreateConstGEP1_32(ir.getInt8Ty(), base, offset));
    }
  }

  KernelBuilder& kb_;
  int producer_registers_ = kProducerRegisters;  // run(): ProducerWork::registers where given
  TileConfig t_;
  bool bf16_;
  Layout a_, b_;
  Geometry g_;
  Value* counter_ = nullptr;
};

}  // namespace

int wgmma_smem_bytes(const TileConfig& tile, DType dtype) { return geometry(tile, dtype).bytes; }

std::unique_ptr<WgmmaPipeline> make_wgmma_pipeline(KernelBuilder& kb, const TileConfig& tile, DType dtype, Layout a,
                                                   Layout b) {
  return std::make_unique<TmaWgmmaPipeline>(kb, tile, dtype, a, b);
}

}  // namespace lfce
