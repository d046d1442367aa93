// Eager mode's fix-up inside grad_weight (KernelSpec::eager_fixup): eager_dz's pass over the
// [V, ld] workspace, done by the producer warpgroup's three spare warps of every grad_weight CTA
// while its consumers compute, instead of by a kernel of its own between them. eager_dz has then
// stored only its constants (its eager_operand form: coef [tiles, ld], target_col [ld],
// target_dz [ld], the residuals), and the warps write, in place,
//   dz[v, m] = target_dz[m]                      where v = target_col[m],
//              coef[v / tile_n, m] · p̃[v, m]      otherwise, rounded to the dtype,
// the same operations as eager_dz's own pass, so the same bits.
//
// Work items: (row block b of grad_weight's BM rows, 256 tokens j), item b · groups + j with
// groups = ceil(ld / 256). Each warp takes the next item from a counter (ready[0]) until none is
// left, so whatever CTAs are resident do them all, in row-block order: no CTA waits on a CTA that
// has not started. A lane holds its 8 tokens' coef (the block lies in one eager_logits tile:
// Plan::eager_fixup, tile_n a multiple of BM) and walks the block's rows, 8 loaded before any is
// stored, then places its tokens' targets that fall in the block (its own stores before them). The
// warp's lanes meet (bar.warp.sync) and lane 0 adds 1 to ready[1 + b], releasing their writes.
// Before the TMA thread loads any slice of a tile of row block b, it waits (acquire) until
// ready[1 + b] = groups, then fences the generic proxy's writes it saw before its TMA (async
// proxy) reads.
//
// `ready` (i32 [1 + grid_m]) is zeroed before the launch (runtime/launch.cpp). Item indices are
// i32: Plan::eager_fixup keeps grid_m · groups below 2^31.
#pragma once

#include <vector>

#include "compiler/kernel_builder.h"
#include "compiler/kernel_spec.h"
#include "templates/gemm/eager_operand.h"
#include "templates/gemm/gemm_skeleton.h"
#include "templates/template_util.h"

namespace lfce {

// eager_dz's constants (add_eager_constant_params), then the work counters.
inline void add_eager_fixup_params(const KernelSpec& spec, std::vector<Param>& params) {
  if (!spec.eager_fixup) return;
  add_eager_constant_params(params);
  params.push_back({"ready", ParamType::GlobalPtr});
}

// (The element types are 16-bit: 8 a 16-byte vector.)
// Registers of the producer warpgroup's threads with the fix-up: 8 rows of 8 tokens in flight a
// lane, their coefficients, addresses and the item's bounds. ptxas 13.0 spilled 68-172 bytes at 56,
// 64 and 72; at 88 nothing, and the consumers' 208 hold a 128 x 256 tile's accumulators unspilled.
constexpr int kEagerFixupRegisters = 88;

// The ProducerWork of grad_weight with spec.eager_fixup, over a (grid_m x ·) grid of BM-row blocks
// of the workspace `dz` ([v_len, ld], i64 sizes). Built where it dominates both roles' code.
inline ProducerWork eager_fixup_work(KernelBuilder& kb, const KernelSpec& spec, llvm::Value* dz, llvm::Value* grid_m,
                                     llvm::Value* ld, llvm::Value* v_len) {
  using llvm::Value;
  auto& ir = kb.ir();
  const int bm = spec.tile.bm;
  constexpr int kTokens = 8, kRows = 8, kItemTokens = 32 * kTokens;
  Value* groups = ir.CreateTrunc(ir.CreateUDiv(ir.CreateAdd(ld, kb.c64(kItemTokens - 1)), kb.c64(kItemTokens)), kb.i32());
  Value* ready = kb.arg("ready");
  ProducerWork work;
  work.registers = kEagerFixupRegisters;
  work.helpers = [&kb, spec, dz, grid_m, ld, v_len, groups, ready, bm] {
    auto& ir = kb.ir();
    llvm::Type* elem = elem_type(kb, spec.dtype);
    llvm::Type* stored_vec = llvm::FixedVectorType::get(eager_exponential_type(kb, spec.dtype), kTokens);
    llvm::Type* vec = llvm::FixedVectorType::get(elem, kTokens);
    Value* lane = ir.CreateAnd(kb.tid(), kb.c32(31));
    Value* total = ir.CreateMul(grid_m, groups);
    Value* item_slot = kb.local_array(kb.i32(), 1, "fixup_item");
    auto take = [&] {
      Value* claimed = kb.local_array(kb.i32(), 1, "fixup_claimed");
      kb.store(kb.c32(0), kb.at(claimed, kb.i32(), 0));
      kb.if_then(ir.CreateICmpEQ(lane, kb.c32(0)),
                 [&] { kb.store(kb.atomic_add_i32(ready, kb.c32(1)), kb.at(claimed, kb.i32(), 0)); });
      kb.warp_sync();
      kb.store(kb.shfl_idx_i32(kb.load(kb.i32(), kb.at(claimed, kb.i32(), 0)), 0), kb.at(item_slot, kb.i32(), 0));
    };
    take();
    kb.while_loop([&] { return ir.CreateICmpULT(kb.load(kb.i32(), kb.at(item_slot, kb.i32(), 0)), total); }, [&] {
      Value* item = kb.load(kb.i32(), kb.at(item_slot, kb.i32(), 0));
      Value* block = ir.CreateUDiv(item, groups);
      Value* group = ir.CreateURem(item, groups);
      Value* v0 = ir.CreateMul(ir.CreateZExt(block, kb.i64()), kb.c64(bm));
      Value* v1 = ir.CreateSelect(ir.CreateICmpSLT(ir.CreateAdd(v0, kb.c64(bm)), v_len), ir.CreateAdd(v0, kb.c64(bm)), v_len);
      Value* m = ir.CreateZExt(ir.CreateAdd(ir.CreateMul(group, kb.c32(kItemTokens)), ir.CreateMul(lane, kb.c32(kTokens))),
                               kb.i64());
      // ld is a multiple of 8: a lane's tokens are wholly inside or outside [0, ld).
      kb.if_then(ir.CreateICmpSLT(m, ld), [&] {
        Value* tile = eager_operand_detail::eager_tile(kb, v0);
        Value* coefs = kb.load(llvm::FixedVectorType::get(kb.f32(), kTokens),
                               kb.gep(kb.arg("coef"), kb.f32(), ir.CreateAdd(ir.CreateMul(tile, ld), m)));
        std::vector<Value*> coef(kTokens);
        for (int e = 0; e < kTokens; ++e) coef[e] = ir.CreateExtractElement(coefs, uint64_t(e));
        // Whole groups of kRows rows: each row's address one stride on from the previous, the
        // stores' chain recomputed from an opaque copy of the first (8 addresses kept from the loads
        // to the stores spilled in the producer's registers); then the block's last rows one by one.
        Value* stride = ir.CreateMul(ld, kb.c64(dtype_bytes(spec.dtype)));
        Value* first = ir.CreatePtrToInt(kb.gep(dz, elem, ir.CreateAdd(ir.CreateMul(v0, ld), m)), kb.i64());
        auto row_ptr = [&](Value* base, int i) {
          return ir.CreateIntToPtr(ir.CreateAdd(base, ir.CreateMul(stride, kb.c64(i))), dz->getType());
        };
        auto fix = [&](Value* p) {
          Value* out = llvm::PoisonValue::get(vec);
          for (int e = 0; e < kTokens; ++e)
            out = ir.CreateInsertElement(out, eager_dz_element(kb, coef[e], ir.CreateExtractElement(p, uint64_t(e)), elem),
                                         uint64_t(e));
          return out;
        };
        // Cache-streaming (evict-first) loads and stores: the rows are touched once here, and the
        // GEMM reads them back a wave or more later, while its own operands (x's tiles) stay in L2.
        // Plain ones cost llama3-8b at N = 16384 (x: 134 MB) 2.8%
        // (docs/measurements.md#eager-fixup).
        auto* i32x4 = llvm::FixedVectorType::get(kb.i32(), 4);
        auto load = [&](Value* ptr) { return ir.CreateBitCast(kb.load_streaming_v4(ptr), stored_vec); };
        auto store = [&](Value* v, Value* ptr) { kb.store_streaming_v4(ptr, ir.CreateBitCast(v, i32x4)); };
        Value* rows = ir.CreateSub(v1, v0);
        Value* whole = ir.CreateMul(ir.CreateSDiv(rows, kb.c64(kRows)), kb.c64(kRows));
        kb.for_range(kb.c64(0), whole, kb.c64(kRows), [&](Value* r0) {
          Value* base = ir.CreateAdd(first, ir.CreateMul(r0, stride));
          std::vector<Value*> p(kRows);
          for (int i = 0; i < kRows; ++i) p[i] = load(row_ptr(base, i));
          Value* again = kb.opaque_i64(base);
          for (int i = 0; i < kRows; ++i) store(fix(p[i]), row_ptr(again, i));
        });
        kb.for_range(whole, rows, kb.c64(1), [&](Value* r) {
          Value* ptr = row_ptr(ir.CreateAdd(first, ir.CreateMul(r, stride)), 0);
          store(fix(load(ptr)), ptr);
        });
        // The targets in this block, over what the rows above stored (this lane's own stores).
        Value* cols = kb.load(llvm::FixedVectorType::get(kb.i32(), kTokens), kb.gep(kb.arg("target_col"), kb.i32(), m));
        Value* dzs = kb.load(vec, kb.gep(kb.arg("target_dz"), elem, m));
        for (int e = 0; e < kTokens; ++e) {
          Value* col = ir.CreateSExt(ir.CreateExtractElement(cols, uint64_t(e)), kb.i64());
          kb.if_then(ir.CreateAnd(ir.CreateICmpSGE(col, v0), ir.CreateICmpSLT(col, v1)), [&] {
            kb.store(ir.CreateExtractElement(dzs, uint64_t(e)),
                     kb.gep(dz, elem, ir.CreateAdd(ir.CreateMul(col, ld), ir.CreateAdd(m, kb.c64(e)))));
          });
        }
      });
      kb.fence_proxy_async_all();  // (the readers are TMA loads: the async proxy)
      kb.warp_sync();
      kb.if_then(ir.CreateICmpEQ(lane, kb.c32(0)), [&] {
        kb.add_release_i32(kb.gep(ready, kb.i32(), ir.CreateAdd(ir.CreateZExt(block, kb.i64()), kb.c64(1))), kb.c32(1));
      });
      take();
    });
  };
  work.before_tile = [&kb, grid_m, groups, ready, bm](Value* m0) {
    auto& ir = kb.ir();
    Value* block = ir.CreateTrunc(ir.CreateUDiv(m0, kb.c64(bm)), kb.i32());
    // (A clustered tile wholly past M reads TMA's zeros: nothing to wait for.)
    kb.if_then(ir.CreateICmpULT(block, grid_m), [&] {
      Value* counter = kb.gep(ready, kb.i32(), ir.CreateAdd(ir.CreateZExt(block, kb.i64()), kb.c64(1)));
      kb.while_loop([&] { return ir.CreateICmpULT(kb.load_acquire_i32(counter), groups); }, [&] { kb.nanosleep(256); });
      kb.fence_proxy_async_all();
    });
  };
  return work;
}

}  // namespace lfce
