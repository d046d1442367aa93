// lse_forward: logits tiles z = x·Wᵀ (+ b) over K = H, reduced in the epilogue to each row's
// running (max, Σ exp) and the target logit. The logits never reach global memory.
//
// Grid (row groups G, splits S): CTA (g, s) takes the row blocks g, g + G, g + 2G, ... in turn
// and, for each, the s-th contiguous share of the vocabulary tiles: the grid fills the GPU
// even when N/BM is small, and when it is large only G row blocks of x (not all of x) are
// being read at once, so that they stay in L2 while the S shares of W stream past them.
// Output: per-(split, row) partial max and sum-exp ([splits, N] each), and target_logit[N]
// written by the one CTA whose tiles hold the target. lse_combine finishes the rows.
#include "templates/gemm_skeleton.h"
#include "templates/template_util.h"
#include "templates/templates.h"

namespace lfce {

using llvm::Value;

KernelShape build_lse_forward(llvm::Module& module, const KernelSpec& spec) {
  const TileConfig& t = spec.tile;
  KernelBuilder kb(module, "lse_forward",
                   gemm_params(t, {{"x", ParamType::GlobalPtr}, {"w", ParamType::GlobalPtr}, {"bias", ParamType::GlobalPtr},
                    {"targets", ParamType::GlobalPtr}, {"n", ParamType::I64},
                    {"partial_max", ParamType::GlobalPtr}, {"partial_sum", ParamType::GlobalPtr},
                    {"target_logit", ParamType::GlobalPtr}}),
                   t.threads());
  auto& ir = kb.ir();
  GemmSkeleton gemm(kb, spec, Layout::KMajor, Layout::KMajor);
  const int extra = gemm.extra_offset();
  const int max_off = extra, sum_off = extra + 4 * t.bm, tgt_off = extra + 8 * t.bm;
  auto row_slot = [&](int base, Value* r, int bytes) {
    return kb.smem(ir.CreateAdd(kb.c32(base), ir.CreateMul(r, kb.c32(bytes))));
  };

  Value* n = kb.arg("n");
  Value* vocab = kb.c64(spec.vocab);
  Value* hidden = kb.c64(spec.hidden);
  const int row_align = hidden_row_align(spec.hidden, spec.dtype);  // rows of H elements
  Value* row_blocks = ir.CreateTrunc(ir.CreateUDiv(ir.CreateAdd(n, kb.c64(t.bm - 1)), kb.c64(t.bm)), kb.i32());
  kb.for_range(kb.ctaid(0), row_blocks, kb.nctaid(0), [&](Value* block) {
    Value* m0 = ir.CreateMul(ir.CreateZExt(block, kb.i64()), kb.c64(t.bm));
    kb.barrier();  // the previous row block's statistics have been written out
    Value* rows = ir.CreateTrunc(
        ir.CreateSelect(ir.CreateICmpSLT(ir.CreateSub(n, m0), kb.c64(t.bm)), ir.CreateSub(n, m0), kb.c64(t.bm)),
        kb.i32());
    Value* tid = kb.tid();
    kb.if_then(ir.CreateICmpULT(tid, kb.c32(t.bm)), [&] {
      kb.store(neg_inf(kb), row_slot(max_off, tid, 4));
      kb.store(kb.cf(0.f), row_slot(sum_off, tid, 4));
      Value* target = kb.c64(-1);
      kb.if_then_else(
          ir.CreateICmpSLT(tid, rows),
          [&] { kb.store(load_target(kb, spec, kb.arg("targets"), ir.CreateAdd(m0, ir.CreateZExt(tid, kb.i64()))), row_slot(tgt_off, tid, 8)); },
          [&] { kb.store(target, row_slot(tgt_off, tid, 8)); });
    });

    const int n_tiles = static_cast<int>((spec.vocab + t.bn - 1) / t.bn);
    Value* split = kb.ctaid(1);
    Value* splits = kb.nctaid(1);
    // In 64 bits: split · n_tiles can pass 2^31 for the largest vocabularies.
    auto share_end = [&](Value* s) {
      Value* end = ir.CreateUDiv(ir.CreateMul(ir.CreateZExt(s, kb.i64()), kb.c64(n_tiles)), ir.CreateZExt(splits, kb.i64()));
      return ir.CreateTrunc(end, kb.i32());
    };
    Value* tile_begin = share_end(split);
    Value* tile_end = share_end(ir.CreateAdd(split, kb.c32(1)));

    GemmOperand x{kb.arg("x"), hidden, Layout::KMajor, n, hidden, row_align};
    GemmOperand w{kb.arg("w"), hidden, Layout::KMajor, vocab, hidden, row_align};
    Value* k_tiles = gemm.k_tiles_for(hidden);
    Value* lane = ir.CreateAnd(tid, kb.c32(31));
    Value* warp = ir.CreateLShr(tid, kb.c32(5));
    const int warps = t.threads() / 32;

    kb.for_range(tile_begin, tile_end, kb.c32(1), [&](Value* tile) {
      Value* n0 = ir.CreateMul(ir.CreateZExt(tile, kb.i64()), kb.c64(t.bn));
      gemm.compute_tile(x, w, m0, n0, k_tiles);
      // Epilogue: one warp per row, each lane BN/32 columns.
      kb.for_range(warp, rows, kb.c32(warps), [&](Value* r) {
        std::vector<Value*> z(t.bn / 32), valid(t.bn / 32);
        Value* zmax = neg_inf(kb);
        for (int q = 0; q < t.bn / 32; ++q) {
          Value* c = ir.CreateAdd(lane, kb.c32(32 * q));
          Value* v = ir.CreateAdd(n0, ir.CreateZExt(c, kb.i64()));
          valid[q] = ir.CreateICmpSLT(v, vocab);
          Value* logit = ir.CreateFAdd(kb.load(kb.f32(), gemm.staged(r, c)),
                                       load_bias(kb, spec, kb.arg("bias"), ir.CreateSelect(valid[q], v, kb.c64(0))));
          z[q] = ir.CreateSelect(valid[q], logit, neg_inf(kb));
          zmax = kb.fmax(zmax, z[q]);
        }
        zmax = kb.warp_max(zmax);
        Value* sum = kb.cf(0.f);
        for (int q = 0; q < t.bn / 32; ++q)
          sum = ir.CreateFAdd(sum, ir.CreateSelect(valid[q], kb.exp(ir.CreateFSub(z[q], zmax)), kb.cf(0.f)));
        sum = kb.warp_sum(sum);
        kb.if_then(ir.CreateICmpEQ(lane, kb.c32(0)), [&] {
          // Online softmax merge of this tile into the row's running (max, sum).
          Value* old_max = kb.load(kb.f32(), row_slot(max_off, r, 4));
          Value* old_sum = kb.load(kb.f32(), row_slot(sum_off, r, 4));
          Value* new_max = kb.fmax(old_max, zmax);
          Value* merged = ir.CreateFAdd(ir.CreateFMul(old_sum, kb.exp(ir.CreateFSub(old_max, new_max))),
                                        ir.CreateFMul(sum, kb.exp(ir.CreateFSub(zmax, new_max))));
          kb.store(new_max, row_slot(max_off, r, 4));
          kb.store(merged, row_slot(sum_off, r, 4));
          Value* target = kb.load(kb.i64(), row_slot(tgt_off, r, 8));
          Value* in_tile = ir.CreateAnd(ir.CreateAnd(ir.CreateICmpSGE(target, n0),
                                                     ir.CreateICmpSLT(target, ir.CreateAdd(n0, kb.c64(t.bn)))),
                                        ir.CreateICmpSLT(target, vocab));
          kb.if_then(in_tile, [&] {
            Value* c = ir.CreateTrunc(ir.CreateSub(target, n0), kb.i32());
            Value* logit = ir.CreateFAdd(kb.load(kb.f32(), gemm.staged(r, c)), load_bias(kb, spec, kb.arg("bias"), target));
            Value* m = ir.CreateAdd(m0, ir.CreateZExt(r, kb.i64()));
            kb.store(logit, kb.gep(kb.arg("target_logit"), kb.f32(), m));
          });
        });
      });
    });
    kb.barrier();  // row statistics were last written by each row's warp
    kb.if_then(ir.CreateICmpSLT(tid, rows), [&] {
      Value* m = ir.CreateAdd(m0, ir.CreateZExt(tid, kb.i64()));
      Value* index = ir.CreateAdd(ir.CreateMul(ir.CreateZExt(split, kb.i64()), n), m);
      kb.store(kb.load(kb.f32(), row_slot(max_off, tid, 4)), kb.gep(kb.arg("partial_max"), kb.f32(), index));
      kb.store(kb.load(kb.f32(), row_slot(sum_off, tid, 4)), kb.gep(kb.arg("partial_sum"), kb.f32(), index));
    });
  });
  kb.finish();
  return {"lse_forward", t.threads(), gemm.smem_bytes(16 * t.bm)};
}

}  // namespace lfce
