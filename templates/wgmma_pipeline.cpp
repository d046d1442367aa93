// The sm_90a GEMM pipeline: TMA + wgmma, warp-specialised.
//
// Shared memory, from the (1024-byte aligned) base:
//   ring   stages x [A tile | B tile], each in TMA's 128-byte-swizzled layout: a K-major tile is
//          rows of 64 elements (128 bytes), 8-row atoms of 1024 bytes one after the other; an
//          MN-major tile is one box per 64 rows of M (or N), each box BK rows of 128 bytes.
//   staged the fp32 tile BM x (BN+1), overlapping the ring (written only after the last wgmma
//          of the tile has read it);
//   bars   full[stages], empty[stages], (ping-pong) order[2] and ready[stages] mbarriers (8 bytes
//          each), after the larger of the two.
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
// Operand rewrite (OperandRewrite, run() only): warps 1-3 of the producer warpgroup wait for each
// slice's full barrier, rewrite its A tile in shared memory, fence it for the async proxy (the
// wgmma reads it there) and arrive on the slot's ready barrier, which the consumers wait for
// instead of the full one. The producer refills a slot only once the consumers have released
// it, so the rewriters are never more than one phase of a full barrier behind.
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
#include "templates/gemm_skeleton.h"

namespace lfce {

using llvm::Value;

namespace {

constexpr int kSwizzleRow = 128;   // bytes of one swizzled row
constexpr int kAtomBytes = 1024;   // 8 rows x 128 bytes: the swizzle pattern's period
constexpr int kBoxElems = 64;      // 16-bit elements per 128-byte row
// The producer warpgroup keeps this many registers per thread while it issues loads: enough for
// the templates' values live across the mainloop (row-block and tile loop state).
constexpr int kProducerRegisters = 32;
constexpr int kRingFree = 1;  // named barrier: every consumer is done reading the ring
constexpr int kRewriteWarps = 3;  // warps 1-3 of the producer warpgroup rewrite operand A
constexpr int kRewriteRows = 4;   // chunks a rewriting thread loads before it stores them

struct Geometry {
  int a_bytes, b_bytes, stage_bytes, ring_bytes, staged_bytes, bars_offset, bytes;
};

Geometry geometry(const TileConfig& t, DType dtype, bool rewrite) {
  const int e = dtype_bytes(dtype);
  Geometry g{};
  g.a_bytes = t.bm * t.bk * e;
  g.b_bytes = t.bn * t.bk * e;
  g.stage_bytes = g.a_bytes + g.b_bytes;
  g.ring_bytes = t.stages * g.stage_bytes;
  g.staged_bytes = t.bm * (t.bn + 1) * 4;
  g.bars_offset = (std::max(g.ring_bytes, g.staged_bytes) + 15) / 16 * 16;
  g.bytes = g.bars_offset + (rewrite ? 24 : 16) * t.stages + (t.pingpong ? 16 : 0);
  return g;
}

class TmaWgmmaPipeline final : public WgmmaPipeline {
 public:
  TmaWgmmaPipeline(KernelBuilder& kb, const TileConfig& t, DType dtype, Layout a, Layout b, bool rewrite)
      : kb_(kb), t_(t), bf16_(dtype == DType::BF16), a_(a), b_(b), rewrite_(rewrite), g_(geometry(t, dtype, rewrite)) {
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
      // With an operand rewrite: one arrival per rewriting warp.
      if (rewrite_)
        for (int s = 0; s < t_.stages; ++s) kb_.mbarrier_init(ready(kb_.c32(s)), kRewriteWarps);
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
    if (t_.cluster > 1 || t_.pingpong || t_.split_n || rewrite_)
      throw InternalError("the staged wgmma form has no clusters, ping-pong, split tiles or operand rewrite (tile " +
                          t_.text() + ")");
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
    const int shared = register_share(), producer = kProducerRegisters, consumer = consumer_registers(producer);
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

  void run(const TileSchedule& schedule, const OperandRewrite* rewrite) override {
    auto& ir = kb_.ir();
    Value* tid = kb_.tid();
    Value* warpgroup = ir.CreateLShr(tid, kb_.c32(7));
    if ((rewrite != nullptr) != rewrite_) throw InternalError("an operand rewrite that the pipeline was not built for");
    const int producer = rewrite ? rewrite->registers : kProducerRegisters;
    if (producer % 8 || producer < 24 || producer > register_share())
      throw InternalError("producer registers " + std::to_string(producer) + " are not a multiple of 8 in 24.." +
                          std::to_string(register_share()));
    kb_.if_then_else(
        ir.CreateICmpEQ(warpgroup, kb_.c32(0)),
        [&] {
          // The producer keeps few registers for the whole kernel (more with a rewrite, whose
          // warps 1-3 rewrite operand A); its other threads are done.
          kb_.set_max_registers(false, producer);
          Value* warp = ir.CreateLShr(tid, kb_.c32(5));
          kb_.if_then_else(
              ir.CreateICmpEQ(tid, kb_.c32(0)),
              [&] {
                Value* cursor = cursor_state("producer_cursor", kb_.c32(0));
                schedule(false, [&](Value* m0, Value* n0, Value* k_tiles, const FragmentEpilogue&) {
                  produce(cursor, m0, n0, k_tiles);
                });
              },
              [&] {
                if (rewrite) kb_.if_then(ir.CreateICmpUGE(warp, kb_.c32(1)), [&] { rewrite_all(schedule, *rewrite); });
              });
          kb_.warp_sync();
        },
        [&] {
          kb_.set_max_registers(true, consumer_registers(producer));
          Value* consumer_index = ir.CreateSub(warpgroup, kb_.c32(1));
          Value* cursor = cursor_state("consumer_cursor", kb_.c32(0));
          // Ping-pong: 0 on this consumer's tiles (the first consumer's turn comes first).
          Value* turn = nullptr;  // and the parity of the next order wait
          if (t_.pingpong) {
            turn = kb_.local_array(kb_.i32(), 2, "turn");
            kb_.store(consumer_index, kb_.at(turn, kb_.i32(), 0));
            kb_.store(kb_.c32(0), kb_.at(turn, kb_.i32(), 1));
          }
          schedule(true, [&](Value*, Value*, Value* k_tiles, const FragmentEpilogue& epilogue) {
            kb_.warp_sync();  // the previous epilogue may have branched per lane
            auto compute = [&] {
              Value* order_me = nullptr;
              if (t_.pingpong) {
                Value* parity = kb_.load(kb_.i32(), kb_.at(turn, kb_.i32(), 1));
                order_me = ir.CreateAdd(kb_.c32(order_offset()), ir.CreateMul(consumer_index, kb_.c32(8)));
                kb_.mbarrier_wait(order_me, parity);
                kb_.store(ir.CreateXor(parity, kb_.c32(1)), kb_.at(turn, kb_.i32(), 1));
              }
              std::vector<Value*> acc = mainloop(consumer_index, cursor, k_tiles);
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
  Value* ready(Value* slot) {
    const int offset = order_offset() + (t_.pingpong ? 16 : 0);
    return kb_.ir().CreateAdd(kb_.c32(offset), kb_.ir().CreateMul(slot, kb_.c32(8)));
  }
  Value* full(Value* slot) { return kb_.ir().CreateAdd(kb_.c32(g_.bars_offset), kb_.ir().CreateMul(slot, kb_.c32(8))); }
  Value* empty(Value* slot) {
    return kb_.ir().CreateAdd(kb_.c32(g_.bars_offset + 8 * t_.stages), kb_.ir().CreateMul(slot, kb_.c32(8)));
  }
  // Registers per thread when all warpgroups share the register file equally (what ptxas
  // allocates under .maxntid), and the consumers' share once the producer warpgroup has given
  // up all but `producer`: both multiples of 8, as setmaxnreg needs.
  int register_share() const { return std::min(255, 65536 / (t_.threads() * t_.ctas_per_sm())) / 8 * 8; }
  int consumer_registers(int producer) const {
    const int pool = register_share() * t_.threads() - producer * 128;
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

  // Loads operand tile rows [mn0, mn0 + rows) x K slice kt into `dst`. With `rank` (i32, a
  // CTA of the cluster), only that CTA's 1/cluster share of the rows, multicast to every CTA.
  void load(Value* map, Layout layout, int rows, Value* dst, Value* mn0, Value* kt, Value* bar,
            Value* rank = nullptr) {
    auto& ir = kb_.ir();
    Value* mn = ir.CreateTrunc(mn0, kb_.i32());
    Value* k = ir.CreateMul(kt, kb_.c32(t_.bk));
    const int parts = rank ? t_.cluster : 1;
    Value* mask = ir.getInt16((1u << t_.cluster) - 1);
    auto copy = [&](Value* to, Value* c0, Value* c1) {
      if (rank)
        kb_.tma_load_2d_multicast(to, map, c0, c1, bar, mask);
      else
        kb_.tma_load_2d(to, map, c0, c1, bar);
    };
    if (layout == Layout::KMajor) {  // one box {BK, rows / parts}: 128-byte rows, whole atoms
      Value* first = rank ? ir.CreateMul(rank, kb_.c32(rows / parts)) : kb_.c32(0);
      copy(ir.CreateAdd(dst, ir.CreateMul(first, kb_.c32(kSwizzleRow))), k, ir.CreateAdd(mn, first));
      return;
    }
    // Boxes {64, BK}, one per 64 rows of M or N; this CTA's share of them.
    const int boxes = rows / kBoxElems / parts;
    Value* first_box = rank ? ir.CreateMul(rank, kb_.c32(boxes)) : kb_.c32(0);
    for (int j = 0; j < boxes; ++j) {
      Value* box = ir.CreateAdd(first_box, kb_.c32(j));
      copy(ir.CreateAdd(dst, ir.CreateMul(box, kb_.c32(t_.bk * kSwizzleRow))),
           ir.CreateAdd(mn, ir.CreateMul(box, kb_.c32(kBoxElems))), k);
    }
  }

  // Issues the loads of one tile's k_tiles slices, from the slice `state` points at on.
  void produce(Value* state, Value* m0, Value* n0, Value* k_tiles) {
    auto& ir = kb_.ir();
    // Opaque: with a small constant K (H = 512: 8 slices) LLVM unrolled this loop whole, and the
    // addresses it computed ahead did not fit the producer's 32 registers (ptxas spilled 116
    // bytes; the driver's JIT 48: session 13 run 2).
    k_tiles = kb_.opaque_i32(at_least_one(k_tiles));
    Value* map_a = kb_.tensor_map("tma_a");
    Value* map_b = kb_.tensor_map("tma_b");
    Value* rank = t_.cluster > 1 ? kb_.cluster_rank() : nullptr;  // B: this CTA's share, multicast
    kb_.for_range(kb_.c32(0), k_tiles, kb_.c32(1), [&](Value* kt) {
      Cursor c{kb_.load(kb_.i32(), kb_.at(state, kb_.i32(), 0)), kb_.load(kb_.i32(), kb_.at(state, kb_.i32(), 1))};
      // A fresh barrier counts as having completed the phase before its first: phase ^ 1
      // passes at once for each slot's first use.
      kb_.mbarrier_wait(empty(c.slot), ir.CreateXor(c.phase, kb_.c32(1)));
      kb_.mbarrier_arrive_expect_tx(full(c.slot), g_.stage_bytes);  // out-of-bounds zeros count too
      load(map_a, a_, t_.bm, a_base(c.slot), m0, kt, full(c.slot));
      load(map_b, b_, t_.bn, b_base(c.slot), n0, kt, full(c.slot), rank);
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

  // One tile's mainloop in a consumer warpgroup, from the slice `state` points at on: returns
  // the finished accumulators, every slot of the tile released.
  std::vector<Value*> mainloop(Value* consumer, Value* state, Value* k_tiles) {
    auto& ir = kb_.ir();
    k_tiles = at_least_one(k_tiles);
    const int count = t_.accumulators(), per_block = t_.consumer_cols() / 2;
    Value* acc_array = kb_.local_array(kb_.f32(), count, "acc");
    std::vector<Value*> acc(count, kb_.cf(0.f));
    auto save = [&] {
      for (int i = 0; i < count; ++i) kb_.store(acc[i], kb_.at(acc_array, kb_.f32(), i));
    };
    auto restore = [&] {
      for (int i = 0; i < count; ++i) acc[i] = kb_.load(kb_.f32(), kb_.at(acc_array, kb_.f32(), i));
    };
    save();
    Value* tid = kb_.tid();
    Value* lane = ir.CreateAnd(tid, kb_.c32(31));
    Value* lane0 = ir.CreateICmpEQ(lane, kb_.c32(0));
    // m64 block b of A starts at 64b rows (K-major) or at box b (MN-major); consumer c's first
    // block is c · m_blocks (a ping-pong consumer's tile is all of A).
    const int block_bytes = a_ == Layout::KMajor ? 64 * kSwizzleRow : t_.bk * kSwizzleRow;
    Value* a_row_bytes = t_.pingpong || t_.split_n ? kb_.c32(0) : ir.CreateMul(consumer, kb_.c32(t_.m_blocks() * block_bytes));
    // A split consumer's B columns start at c · BN / 2: rows of 128 bytes (K-major, whole 8-row
    // atoms) or boxes of 64 (MN-major, whole boxes: validated).
    Value* b_col_bytes = nullptr;
    if (t_.split_n)
      b_col_bytes = ir.CreateMul(consumer, kb_.c32(b_ == Layout::KMajor ? t_.consumer_cols() * kSwizzleRow
                                                                          : t_.consumer_cols() / kBoxElems * t_.bk * kSwizzleRow));
    // state: slot and phase of the current slice, and the slot of the previous one (released
    // once its wgmma group has finished).
    kb_.wgmma_fence();
    kb_.for_range(kb_.c32(0), k_tiles, kb_.c32(1), [&](Value* kt) {
      Cursor c{kb_.load(kb_.i32(), kb_.at(state, kb_.i32(), 0)), kb_.load(kb_.i32(), kb_.at(state, kb_.i32(), 1))};
      Value* previous = kb_.load(kb_.i32(), kb_.at(state, kb_.i32(), 2));
      // With a rewrite the consumers see B's TMA data through the rewriters' wait on the full
      // barrier (acquire) and arrival on the ready one (release): cumulative.
      kb_.mbarrier_wait(rewrite_ ? ready(c.slot) : full(c.slot), c.phase);
      restore();
      kb_.wgmma_fence();
      std::vector<Value*> desc_a(t_.m_blocks());
      for (int i = 0; i < t_.m_blocks(); ++i) {
        Value* rows = i == 0 ? a_row_bytes : ir.CreateAdd(a_row_bytes, kb_.c32(i * block_bytes));
        desc_a[i] = operand_descriptor(a_, ir.CreateAdd(a_base(c.slot), rows));
      }
      Value* desc_b = operand_descriptor(b_, b_col_bytes ? ir.CreateAdd(b_base(c.slot), b_col_bytes) : b_base(c.slot));
      for (int ks = 0; ks < t_.bk / 16; ++ks)
        for (int i = 0; i < t_.m_blocks(); ++i) {  // the blocks share the k16 step's B
          std::vector<Value*> block(acc.begin() + i * per_block, acc.begin() + (i + 1) * per_block);
          block = kb_.wgmma_m64k16(bf16_, t_.consumer_cols(), ir.CreateAdd(desc_a[i], kb_.c64(k_step(a_, ks))),
                                   ir.CreateAdd(desc_b, kb_.c64(k_step(b_, ks))), block, a_ == Layout::MNMajor,
                                   b_ == Layout::MNMajor);
          std::copy(block.begin(), block.end(), acc.begin() + i * per_block);
        }
      kb_.wgmma_commit();
      acc = kb_.wgmma_wait(1, acc);  // slice kt - 1's wgmma group has finished reading its slot
      save();
      kb_.if_then(ir.CreateAnd(lane0, ir.CreateICmpSGT(kt, kb_.c32(0))), [&] { release(previous); });
      kb_.warp_sync();  // converged for the next wgmma.fence
      Cursor next = advance(c);
      kb_.store(next.slot, kb_.at(state, kb_.i32(), 0));
      kb_.store(next.phase, kb_.at(state, kb_.i32(), 1));
      kb_.store(c.slot, kb_.at(state, kb_.i32(), 2));
    });
    restore();
    acc = kb_.wgmma_wait(0, acc);
    Value* last = kb_.load(kb_.i32(), kb_.at(state, kb_.i32(), 2));
    kb_.if_then(ir.CreateAnd(lane0, ir.CreateICmpSGT(k_tiles, kb_.c32(0))), [&] { release(last); });
    kb_.warp_sync();
    return acc;
  }

  // Warps 1-3 of the producer warpgroup: every slice of every tile, in the producer's order.
  void rewrite_all(const TileSchedule& schedule, const OperandRewrite& rewrite) {
    auto& ir = kb_.ir();
    Value* thread = ir.CreateSub(kb_.tid(), kb_.c32(32));  // 0 .. 32·kRewriteWarps - 1
    Value* lane0 = ir.CreateICmpEQ(ir.CreateAnd(kb_.tid(), kb_.c32(31)), kb_.c32(0));
    Value* state = cursor_state("rewrite_cursor", kb_.c32(0));
    schedule(false, [&](Value* m0, Value*, Value* k_tiles, const FragmentEpilogue&) {
      k_tiles = kb_.opaque_i32(at_least_one(k_tiles));
      // The column state of the tile's first slice; each slice then loads the next one's (from
      // global memory) before it waits and rewrites, so that its latency overlaps the rewrite.
      std::vector<Value*> first = slice_of(rewrite, thread, kb_.c32(0), m0, kb_.c32(0)).state;
      std::vector<Value*> carried(first.size());
      for (size_t i = 0; i < first.size(); ++i) {
        carried[i] = kb_.local_array(first[i]->getType(), 1, "rewrite_state");
        kb_.store(first[i], kb_.at(carried[i], first[i]->getType(), 0));
      }
      kb_.for_range(kb_.c32(0), k_tiles, kb_.c32(1), [&](Value* kt) {
        Cursor c{kb_.load(kb_.i32(), kb_.at(state, kb_.i32(), 0)), kb_.load(kb_.i32(), kb_.at(state, kb_.i32(), 1))};
        // (The tile's last slice loads its own constants again: the next tile's origin is not
        // known here.)
        Value* next_kt = ir.CreateAdd(kt, kb_.c32(1));
        next_kt = ir.CreateSelect(ir.CreateICmpSLT(next_kt, k_tiles), next_kt, kt);
        std::vector<Value*> upcoming = slice_of(rewrite, thread, kb_.c32(0), m0, next_kt).state;
        Slice slice = slice_of(rewrite, thread, a_base(c.slot), m0, kt, false);
        for (size_t i = 0; i < first.size(); ++i) slice.state.push_back(kb_.load(first[i]->getType(), kb_.at(carried[i], first[i]->getType(), 0)));
        kb_.mbarrier_wait(full(c.slot), c.phase);
        rewrite_slice(rewrite, slice);
        for (size_t i = 0; i < first.size(); ++i) kb_.store(upcoming[i], kb_.at(carried[i], first[i]->getType(), 0));
        // The generic-proxy stores are ordered before the wgmma's async-proxy reads.
        kb_.fence_proxy_async();
        kb_.warp_sync();
        kb_.if_then(lane0, [&] { kb_.mbarrier_arrive(ready(c.slot)); });
        kb_.warp_sync();
        Cursor next = advance(c);
        kb_.store(next.slot, kb_.at(state, kb_.i32(), 0));
        kb_.store(next.phase, kb_.at(state, kb_.i32(), 1));
      });
    });
  }

  // One slice's A tile at `base`: rows of 128 bytes (64 elements, eight 16-byte chunks, chunk c
  // of row r stored at chunk c ^ (r % 8)); K-major: BM rows of K; MN-major: one box of BK rows
  // per 64 of M. Thread `thread` owns chunk column g (of 8 per box) and rows g', g' + step, ...
  struct Slice {
    Value *column_base, *chunk, *first_row, *row0;
    int rows, step;
    std::vector<Value*> state;
  };
  // `state`: with the column's state loaded (else left empty).
  Slice slice_of(const OperandRewrite& rewrite, Value* thread, Value* base, Value* m0, Value* kt, bool state = true) {
    auto& ir = kb_.ir();
    const bool k_major = a_ == Layout::KMajor;
    const int columns = k_major ? 8 : 8 * (t_.bm / kBoxElems), rows = k_major ? t_.bm : t_.bk;
    const int threads = 32 * kRewriteWarps;
    if (threads % columns != 0)
      throw InternalError("an A tile of " + std::to_string(columns) + " chunk columns (tile " + t_.text() +
                          ") does not divide among " + std::to_string(threads) + " rewriting threads");
    const int step = threads / columns;
    Value* column = ir.CreateURem(thread, kb_.c32(columns));
    Value* first_row = ir.CreateUDiv(thread, kb_.c32(columns));
    Value* chunk = ir.CreateAnd(column, kb_.c32(7));
    Value* column_base = k_major ? base : ir.CreateAdd(base, ir.CreateMul(ir.CreateLShr(column, kb_.c32(3)),
                                                                          kb_.c32(t_.bk * kSwizzleRow)));
    Value* k0 = ir.CreateMul(ir.CreateZExt(kt, kb_.i64()), kb_.c64(t_.bk));
    Value* first = ir.CreateAdd(k_major ? k0 : m0, ir.CreateMul(ir.CreateZExt(column, kb_.i64()), kb_.c64(8)));
    Value* row0 = k_major ? m0 : k0;
    return Slice{column_base, chunk, first_row, row0, rows, step,
                 state ? rewrite.column(first, row0) : std::vector<Value*>{}};
  }
  void rewrite_slice(const OperandRewrite& rewrite, const Slice& slice) {
    auto& ir = kb_.ir();
    const int rows = slice.rows, step = slice.step;
    Value *column_base = slice.column_base, *chunk = slice.chunk, *first_row = slice.first_row, *row0 = slice.row0;
    llvm::Type* vec = llvm::FixedVectorType::get(kb_.ir().getInt16Ty(), 8);
    auto address = [&](Value* r) {  // of row r's chunk in this column
      Value* swizzled = ir.CreateXor(chunk, ir.CreateAnd(r, kb_.c32(7)));
      return ir.CreateAdd(column_base, ir.CreateAdd(ir.CreateMul(r, kb_.c32(kSwizzleRow)), ir.CreateMul(swizzled, kb_.c32(16))));
    };
    kb_.for_range(first_row, kb_.c32(rows), kb_.c32(step * kRewriteRows), [&](Value* r0) {
      // Every chunk is loaded before any is stored; a row past the tile reloads the first and
      // stores nothing.
      std::vector<Value*> at(kRewriteRows), valid(kRewriteRows), loaded(kRewriteRows);
      for (int u = 0; u < kRewriteRows; ++u) {
        Value* r = ir.CreateAdd(r0, kb_.c32(step * u));
        valid[u] = ir.CreateICmpULT(r, kb_.c32(rows));
        r = ir.CreateSelect(valid[u], r, first_row);
        at[u] = kb_.smem(address(r));
        loaded[u] = kb_.load(vec, at[u]);
      }
      for (int u = 0; u < kRewriteRows; ++u) {
        Value* out = rewrite.chunk(slice.state, loaded[u]);
        kb_.if_then(valid[u], [&] { kb_.store(out, at[u]); });
      }
    });
    // The replaced elements, in the rows this thread rewrote (after their chunks' stores).
    for (int j = 0; j < 8; ++j) {
      auto [at_row, value] = rewrite.replace(slice.state, j);
      Value* r = ir.CreateSub(at_row, row0);
      Value* inside = ir.CreateAnd(ir.CreateICmpSGE(r, kb_.c64(0)), ir.CreateICmpSLT(r, kb_.c64(rows)));
      Value* r32 = ir.CreateTrunc(ir.CreateSelect(inside, r, kb_.c64(0)), kb_.i32());
      Value* mine = ir.CreateAnd(inside, ir.CreateICmpEQ(ir.CreateURem(r32, kb_.c32(step)), first_row));
      kb_.if_then(mine, [&] { kb_.store(value, kb_.smem(ir.CreateAdd(address(r32), kb_.c32(2 * j)))); });
    }
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
  TileConfig t_;
  bool bf16_;
  Layout a_, b_;
  bool rewrite_;  // ready barriers, which the consumers wait on (run() with an OperandRewrite)
  Geometry g_;
  Value* counter_ = nullptr;
};

}  // namespace

int wgmma_smem_bytes(const TileConfig& tile, DType dtype, bool rewrite) { return geometry(tile, dtype, rewrite).bytes; }

std::unique_ptr<WgmmaPipeline> make_wgmma_pipeline(KernelBuilder& kb, const TileConfig& tile, DType dtype, Layout a,
                                                   Layout b, bool rewrite) {
  return std::make_unique<TmaWgmmaPipeline>(kb, tile, dtype, a, b, rewrite);
}

}  // namespace lfce
