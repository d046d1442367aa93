// lse_forward: logits tiles z = x·Wᵀ (+ b) over K = H (with a softcap c, c·tanh(z / c); with a
// temperature T, that / T: template_util.h's capped_logit), reduced in the epilogue to each
// row's running (max, Σ exp) and the target logit. The logits never reach global memory.
//
// Grid (row groups G, splits S; SplitForwardGrid in templates/gemm/tile_scheduler.h, which the
// runtime sizes it with): CTA (g, s) takes the row blocks g, g + G, g + 2G, ... in turn
// and, for each, the s-th contiguous share of the vocabulary tiles: the grid fills the GPU
// even when N/BM is small, and when it is large only G row blocks of x (not all of x) are
// being read at once, so that they stay in L2 while the S shares of W stream past them.
// Output: per-(split, row) partial max and sum-exp ([splits, N] each), and target_logit[N]
// written by the one CTA whose tiles hold the target. With label smoothing also the partial
// Σ w_v·u_v of the split's columns ([splits, N]; w = 1 without class weights). With the
// entropy, the partial Σ e^(u − max)·(u − max) ([splits, N], template_util.h's merged_entropy);
// with the argmax, the index of the split's first largest u ([splits, N] i32).
// lse_combine finishes the rows.
#include "compiler/errors.h"
#include "templates/epilogue/fragment_epilogue.h"
#include "templates/epilogue/row_slots.h"
#include "templates/gemm/gemm_skeleton.h"
#include "templates/gemm/tile_scheduler.h"
#include "templates/template_util.h"
#include "templates/templates.h"

namespace lfce {

using llvm::Value;

namespace {

// Online-softmax merge of (m_b, s_b) into (m_a, s_a): the larger max and the sum rescaled to it.
// A max of -inf (no valid column seen yet) scales by 0 instead of exp(-inf + inf).
std::pair<Value*, Value*> merge(KernelBuilder& kb, Value* m_a, Value* s_a, Value* m_b, Value* s_b) {
  auto& ir = kb.ir();
  Value* m = kb.fmax(m_a, m_b);
  Value* safe = ir.CreateSelect(ir.CreateFCmpOEQ(m, neg_inf(kb)), kb.cf(0.f), m);
  Value* s = ir.CreateFAdd(ir.CreateFMul(s_a, kb.exp(ir.CreateFSub(m_a, safe))),
                           ir.CreateFMul(s_b, kb.exp(ir.CreateFSub(m_b, safe))));
  return {m, s};
}

// sm_90a: warp-specialised, the epilogue in registers. Each consumer thread keeps the running
// (max, Σ exp) of its two fragment rows over its own columns of every tile of the row block;
// the four lanes of a quad, which hold the same rows, merge theirs when the row block ends.
// The thread holding the target's column writes the target logit.
void lse_forward_specialised(KernelBuilder& kb, const KernelSpec& spec, GemmSkeleton& gemm, Value* row_blocks,
                             Value* tile_begin, Value* tile_end, Value* k_tiles,
                             const std::function<Value*(Value*)>& partial_index) {
  const TileConfig& t = spec.tile;
  if (t.m_blocks() != 1) throw InternalError("lse_forward keeps the statistics of one m64 block (tile " + t.text() + ")");
  auto& ir = kb.ir();
  Value* n = kb.arg("n");
  Value* vocab = kb.c64(spec.vocab);
  Value* stats = kb.local_array(kb.f32(), 4, "row_stats");     // max, sum of fragment row h at 2h, 2h + 1
  // Label smoothing (no class weights on this path): Σ u_v of this thread's columns, row h at h.
  const bool smoothing = spec.label_smoothing != 0.f;
  Value* logit_sums = smoothing ? kb.local_array(kb.f32(), 2, "row_logit_sums") : nullptr;
  // The entropy's t and the argmax of this thread's columns, row h at h.
  Value* entropy_sums = spec.entropy ? kb.local_array(kb.f32(), 2, "row_entropy_sums") : nullptr;
  Value* argmaxes = spec.argmax ? kb.local_array(kb.i32(), 2, "row_argmaxes") : nullptr;
  Value* targets = kb.local_array(kb.i64(), 2, "row_targets");
  gemm.run_specialised([&](bool consumer, const TileVisit& visit) {
    FragmentPosition pos{};
    if (consumer) pos = gemm.fragment_position();
    auto row_of = [&](Value* m0, int h) { return ir.CreateAdd(m0, ir.CreateZExt(pos.row[h], kb.i64())); };
    SplitForwardGrid::walk_row_blocks(kb, row_blocks, [&](Value* block) {
      Value* m0 = ir.CreateMul(ir.CreateZExt(block, kb.i64()), kb.c64(t.bm));
      if (consumer) {
        for (int h = 0; h < 2; ++h) {
          Value* m = row_of(m0, h);
          Value* in_rows = ir.CreateICmpSLT(m, n);
          Value* target = load_target(kb, spec, kb.arg("targets"), ir.CreateSelect(in_rows, m, kb.c64(0)), kb.c64(-1));
          kb.store(ir.CreateSelect(in_rows, target, kb.c64(-1)), kb.at(targets, kb.i64(), h));
          kb.store(neg_inf(kb), kb.at(stats, kb.f32(), 2 * h));
          kb.store(kb.cf(0.f), kb.at(stats, kb.f32(), 2 * h + 1));
          if (smoothing) kb.store(kb.cf(0.f), kb.at(logit_sums, kb.f32(), h));
          if (entropy_sums) kb.store(kb.cf(0.f), kb.at(entropy_sums, kb.f32(), h));
          if (argmaxes) kb.store(kb.c32(-1), kb.at(argmaxes, kb.i32(), h));
        }
      }
      kb.for_range(tile_begin, tile_end, kb.c32(1), [&](Value* tile) {
        Value* n0 = ir.CreateMul(ir.CreateZExt(tile, kb.i64()), kb.c64(t.bn));
        visit(m0, n0, k_tiles, [&](const Fragment& f) {
          const int cols = 2 * f.blocks();
          // Columns past the vocabulary are masked. (A second, unmasked copy of this epilogue for the
          // whole tiles spilled 8 bytes under the driver's JIT: H200, driver 580.)
            // Column q = 2j + e of this thread: vocabulary index, validity and bias.
            std::vector<Value*> valid(cols), bias(cols);
            for (int q = 0; q < cols; ++q) {
              Value* c = ir.CreateAdd(f.pos.col0, kb.c32(8 * (q / 2) + q % 2));
              Value* v = ir.CreateAdd(n0, ir.CreateZExt(c, kb.i64()));
              valid[q] = ir.CreateICmpSLT(v, vocab);
              bias[q] = load_bias(kb, spec, kb.arg("bias"), ir.CreateSelect(valid[q], v, kb.c64(0)));
            }
            for (int h = 0; h < 2; ++h) {
              std::vector<Value*> z(cols);
              for (int q = 0; q < cols; ++q) {
                z[q] = ir.CreateSelect(valid[q], capped_logit(kb, spec, add_bias(kb, spec, f.at(q / 2, h, q % 2), bias[q])),
                                       neg_inf(kb));
              }
              Value* old_max = kb.load(kb.f32(), kb.at(stats, kb.f32(), 2 * h));
              Value* old_sum = kb.load(kb.f32(), kb.at(stats, kb.f32(), 2 * h + 1));
              Value* tile_max = reduce_tree(z, [&](Value* a, Value* b) { return kb.fmax(a, b); });
              Value* new_max = kb.fmax(old_max, tile_max);
              Value* safe = ir.CreateSelect(ir.CreateFCmpOEQ(new_max, neg_inf(kb)), kb.cf(0.f), new_max);
              // e^(z − max) = 2^(z·log2 e − max·log2 e): one FMA before the SFU's ex2.
              Value* shift = ir.CreateFMul(safe, kb.cf(-KernelBuilder::kLog2e));
              std::vector<Value*> p(cols);
              for (int q = 0; q < cols; ++q) p[q] = kb.exp2(kb.fma(z[q], kb.cf(KernelBuilder::kLog2e), shift));
              Value* tile_sum = reduce_tree(p, [&](Value* a, Value* b) { return ir.CreateFAdd(a, b); });
              Value* sum = ir.CreateFAdd(ir.CreateFMul(old_sum, kb.exp(ir.CreateFSub(old_max, safe))), tile_sum);
              kb.store(new_max, kb.at(stats, kb.f32(), 2 * h));
              kb.store(sum, kb.at(stats, kb.f32(), 2 * h + 1));
              if (entropy_sums) {
                // This tile's Σ p·(z − max) at the new max, merged with the running one (rescaled to it).
                std::vector<Value*> pz(cols);
                for (int q = 0; q < cols; ++q)
                  pz[q] = ir.CreateFMul(p[q], ir.CreateSelect(valid[q], ir.CreateFSub(z[q], safe), kb.cf(0.f)));
                Value* slot = kb.at(entropy_sums, kb.f32(), h);
                Value* tile_t = reduce_tree(pz, [&](Value* a, Value* b) { return ir.CreateFAdd(a, b); });
                kb.store(merged_entropy(kb, safe, old_max, old_sum, kb.load(kb.f32(), slot), safe, tile_sum, tile_t),
                         slot);
              }
              if (argmaxes) {
                // The first of this thread's columns (8j + e, increasing with q) holding the tile's
                // largest value; it replaces the running argmax only where it is strictly larger.
                Value* first = kb.c32(0);
                for (int q = cols - 1; q >= 0; --q)
                  first = ir.CreateSelect(ir.CreateFCmpOEQ(z[q], tile_max), kb.c32(8 * (q / 2) + q % 2), first);
                Value* index = ir.CreateAdd(ir.CreateTrunc(n0, kb.i32()), ir.CreateAdd(f.pos.col0, first));
                Value* slot = kb.at(argmaxes, kb.i32(), h);
                kb.store(ir.CreateSelect(ir.CreateFCmpOGT(tile_max, old_max), index, kb.load(kb.i32(), slot)), slot);
              }
              if (smoothing) {
                std::vector<Value*> u(cols);
                for (int q = 0; q < cols; ++q) u[q] = ir.CreateSelect(valid[q], z[q], kb.cf(0.f));
                Value* slot = kb.at(logit_sums, kb.f32(), h);
                kb.store(ir.CreateFAdd(kb.load(kb.f32(), slot), reduce_tree(u, [&](Value* a, Value* b) { return ir.CreateFAdd(a, b); })),
                         slot);
              }

              // The target's column c = target - n0 is this thread's when (c % 8) / 2 = lane % 4.
              Value* target = kb.load(kb.i64(), kb.at(targets, kb.i64(), h));
              Value* c = ir.CreateSub(target, n0);
              Value* hit = ir.CreateAnd(ir.CreateAnd(ir.CreateICmpSGE(c, kb.c64(0)), ir.CreateICmpSLT(c, kb.c64(t.bn))),
                                        ir.CreateICmpSLT(target, vocab));
              Value* col = ir.CreateTrunc(ir.CreateAnd(c, kb.c64(0xFFFF)), kb.i32());
              hit = ir.CreateAnd(hit, ir.CreateICmpEQ(ir.CreateLShr(ir.CreateAnd(col, kb.c32(7)), kb.c32(1)), f.pos.quad_lane));
              kb.if_then(hit, [&] {
                Value* block = ir.CreateLShr(col, kb.c32(3));
                Value* odd = ir.CreateICmpNE(ir.CreateAnd(col, kb.c32(1)), kb.c32(0));
                Value* logit = kb.cf(0.f);
                for (int j = 0; j < f.blocks(); ++j)
                  logit = ir.CreateSelect(ir.CreateICmpEQ(block, kb.c32(j)),
                                          ir.CreateSelect(odd, f.at(j, h, 1), f.at(j, h, 0)), logit);
                logit = capped_logit(kb, spec, add_bias(kb, spec, logit, load_bias(kb, spec, kb.arg("bias"), target)));
                kb.store(logit, kb.gep(kb.arg("target_logit"), kb.f32(), row_of(m0, h)));
              });
            }
        });
      });
      if (consumer) {
        for (int h = 0; h < 2; ++h) {
          Value* m = kb.load(kb.f32(), kb.at(stats, kb.f32(), 2 * h));
          Value* s = kb.load(kb.f32(), kb.at(stats, kb.f32(), 2 * h + 1));
          Value* logit_sum = smoothing ? kb.load(kb.f32(), kb.at(logit_sums, kb.f32(), h)) : nullptr;
          Value* entropy_t = entropy_sums ? kb.load(kb.f32(), kb.at(entropy_sums, kb.f32(), h)) : nullptr;
          Value* argmax = argmaxes ? kb.load(kb.i32(), kb.at(argmaxes, kb.i32(), h)) : nullptr;
          // Merged over the quad: the entropy's t and the argmax from the same pre-merge (max, sum)
          // as the merge itself, so each step reads the quad's maxima before they change.
          for (int mask = 1; mask <= 2; mask *= 2) {
            Value* s_other = kb.shfl_xor(s, mask);
            Value* m_other = kb.shfl_xor(m, mask);
            if (logit_sum) logit_sum = ir.CreateFAdd(logit_sum, kb.shfl_xor(logit_sum, mask));
            if (entropy_t || argmax) {
              Value* merged_max = kb.fmax(m, m_other);
              Value* safe = ir.CreateSelect(ir.CreateFCmpOEQ(merged_max, neg_inf(kb)), kb.cf(0.f), merged_max);
              if (entropy_t)
                entropy_t = merged_entropy(kb, safe, m, s, entropy_t, m_other, s_other, kb.shfl_xor(entropy_t, mask));
              if (argmax) argmax = merged_argmax(kb, m, argmax, m_other, kb.shfl_xor_i32(argmax, mask));
            }
            std::tie(m, s) = merge(kb, m, s, m_other, s_other);
          }
          Value* row = row_of(m0, h);
          kb.if_then(ir.CreateAnd(ir.CreateICmpEQ(pos.quad_lane, kb.c32(0)), ir.CreateICmpSLT(row, n)), [&] {
            kb.store(m, kb.gep(kb.arg("partial_max"), kb.f32(), partial_index(row)));
            kb.store(s, kb.gep(kb.arg("partial_sum"), kb.f32(), partial_index(row)));
            if (smoothing) kb.store(logit_sum, kb.gep(kb.arg("partial_logit_sum"), kb.f32(), partial_index(row)));
            if (entropy_t) kb.store(entropy_t, kb.gep(kb.arg("partial_entropy"), kb.f32(), partial_index(row)));
            if (argmax) kb.store(argmax, kb.gep(kb.arg("partial_argmax"), kb.i32(), partial_index(row)));
          });
        }
      }
    });
  });
}

// Declare the parameters: the kernel's own, by name (gemm_params adds the GEMM's tensor maps).
std::vector<Param> declare_params(const KernelSpec& spec) {
  std::vector<Param> params = {{"x", ParamType::GlobalPtr}, {"w", ParamType::GlobalPtr}, {"bias", ParamType::GlobalPtr},
                               {"targets", ParamType::GlobalPtr}, {"n", ParamType::I64},
                               {"partial_max", ParamType::GlobalPtr}, {"partial_sum", ParamType::GlobalPtr},
                               {"target_logit", ParamType::GlobalPtr}};
  if (spec.label_smoothing != 0.f) params.push_back({"partial_logit_sum", ParamType::GlobalPtr});
  if (spec.entropy) params.push_back({"partial_entropy", ParamType::GlobalPtr});
  if (spec.argmax) params.push_back({"partial_argmax", ParamType::GlobalPtr});
  if (spec.class_weight) params.push_back({"class_weight", ParamType::GlobalPtr});  // (only with label smoothing)
  add_shift_param(spec, params);
  return params;
}

// CTA (g, s)'s work: the row blocks it walks, its share of the vocabulary tiles
// [tile_begin, tile_end), the K tiles of each, and where its partial of row m goes.
struct CtaWork {
  Value *row_blocks, *split, *tile_begin, *tile_end, *k_tiles;
  std::function<Value*(Value*)> partial_index;
};

// Split the grid: the row blocks, this CTA's share of the vocabulary tiles and the K depth.
CtaWork split_grid(KernelBuilder& kb, const KernelSpec& spec, GemmSkeleton& gemm) {
  const TileConfig& t = spec.tile;
  auto& ir = kb.ir();
  Value* n = kb.arg("n");
  CtaWork work;
  work.row_blocks = ir.CreateTrunc(ir.CreateUDiv(ir.CreateAdd(n, kb.c64(t.bm - 1)), kb.c64(t.bm)), kb.i32());
  const int n_tiles = static_cast<int>((spec.vocab + t.bn - 1) / t.bn);
  const SplitForwardGrid::Share share = SplitForwardGrid::share(kb, n_tiles);
  Value* split = work.split = share.split;
  work.tile_begin = share.tile_begin;
  work.tile_end = share.tile_end;
  work.k_tiles = gemm.k_tiles_for(kb.c64(spec.hidden));
  work.partial_index = [&kb, split, n](Value* m) {
    auto& ir = kb.ir();
    return ir.CreateAdd(ir.CreateMul(ir.CreateZExt(split, kb.i64()), n), m);
  };
  return work;
}

// One row's statistics over one staged tile (each lane's columns merged over the warp).
struct TileRow {
  Value *zmax, *sum;
  Value *entropy_t = nullptr, *argmax = nullptr, *logit_sum = nullptr;  // where the spec has them
};

// Without wgmma (or with per-column loads): each row block's tiles staged through shared memory,
// one warp per row, the row statistics in shared-memory slots (row_slots.h).
struct StagedForward {
  KernelBuilder& kb;
  const KernelSpec& spec;
  GemmSkeleton& gemm;
  const CtaWork& work;
  // The slots' byte offsets.
  int max_off, sum_off, tgt_off, logit_sum_off, entropy_off, argmax_off;
  const bool smoothing = spec.label_smoothing != 0.f;
  Value* n = kb.arg("n");
  Value* vocab = kb.c64(spec.vocab);
  Value* hidden = kb.c64(spec.hidden);
  const int row_align = hidden_row_align(spec.hidden, spec.dtype);  // rows of H elements

  StagedForward(KernelBuilder& kb, const KernelSpec& spec, GemmSkeleton& gemm, const RowSlots& rows,
                const CtaWork& work)
      : kb(kb),
        spec(spec),
        gemm(gemm),
        work(work),
        max_off(gemm.extra_offset() + rows.max * spec.tile.bm),
        sum_off(gemm.extra_offset() + rows.sum * spec.tile.bm),
        tgt_off(gemm.extra_offset() + rows.target * spec.tile.bm),
        logit_sum_off(gemm.extra_offset() + rows.logit_sum * spec.tile.bm),
        entropy_off(gemm.extra_offset() + rows.entropy * spec.tile.bm),
        argmax_off(gemm.extra_offset() + rows.argmax * spec.tile.bm) {}
  Value* row_slot(int base, Value* r, int bytes) const { return row_slot_at(kb, base, r, bytes); }

  // The row blocks of this CTA, one after another.
  void run() {
    const TileConfig& t = spec.tile;
    auto& ir = kb.ir();
    SplitForwardGrid::walk_row_blocks(kb, work.row_blocks, [&](Value* block) {
      Value* m0 = ir.CreateMul(ir.CreateZExt(block, kb.i64()), kb.c64(t.bm));
      kb.barrier();  // the previous row block's statistics have been written out
      Value* rows = ir.CreateTrunc(
          ir.CreateSelect(ir.CreateICmpSLT(ir.CreateSub(n, m0), kb.c64(t.bm)), ir.CreateSub(n, m0), kb.c64(t.bm)),
          kb.i32());
      Value* tid = kb.tid();
      reset_rows(m0, rows, tid);
      GemmOperand x{kb.arg("x"), hidden, Layout::KMajor, n, hidden, row_align};
      GemmOperand w{kb.arg("w"), hidden, Layout::KMajor, vocab, hidden, row_align};
      Value* lane = ir.CreateAnd(tid, kb.c32(31));
      Value* warp = ir.CreateLShr(tid, kb.c32(5));
      const int warps = t.threads() / 32;
      kb.for_range(work.tile_begin, work.tile_end, kb.c32(1), [&](Value* tile) {
        Value* n0 = ir.CreateMul(ir.CreateZExt(tile, kb.i64()), kb.c64(t.bn));
        gemm.compute_tile(x, w, m0, n0, work.k_tiles);
        // Epilogue: one warp per row, each lane BN/32 columns.
        kb.for_range(warp, rows, kb.c32(warps), [&](Value* r) {
          const TileRow row = reduce_row(n0, lane, r);
          kb.if_then(ir.CreateICmpEQ(lane, kb.c32(0)), [&] { merge_row(row, m0, n0, r); });
        });
      });
      kb.barrier();  // row statistics were last written by each row's warp
      store_partials(m0, rows, tid);
    });
  }

  // Reset the row block's statistics and load its targets (-1 past the last row).
  void reset_rows(Value* m0, Value* rows, Value* tid) {
    auto& ir = kb.ir();
    kb.if_then(ir.CreateICmpULT(tid, kb.c32(spec.tile.bm)), [&] {
      kb.store(neg_inf(kb), row_slot(max_off, tid, 4));
      kb.store(kb.cf(0.f), row_slot(sum_off, tid, 4));
      if (smoothing) kb.store(kb.cf(0.f), row_slot(logit_sum_off, tid, 4));
      if (spec.entropy) kb.store(kb.cf(0.f), row_slot(entropy_off, tid, 4));
      if (spec.argmax) kb.store(kb.c32(-1), row_slot(argmax_off, tid, 4));
      Value* target = kb.c64(-1);
      kb.if_then_else(
          ir.CreateICmpSLT(tid, rows),
          [&] { kb.store(load_target(kb, spec, kb.arg("targets"), ir.CreateAdd(m0, ir.CreateZExt(tid, kb.i64())), kb.c64(-1)),
                                   row_slot(tgt_off, tid, 8)); },
          [&] { kb.store(target, row_slot(tgt_off, tid, 8)); });
    });
  }

  // Row r's statistics over the staged tile at n0: max, Σ exp, and the entropy's, argmax's and
  // label smoothing's where the spec has them.
  TileRow reduce_row(Value* n0, Value* lane, Value* r) {
    const TileConfig& t = spec.tile;
    auto& ir = kb.ir();
    std::vector<Value*> z(t.bn / 32), valid(t.bn / 32);
    Value* zmax = neg_inf(kb);
    for (int q = 0; q < t.bn / 32; ++q) {
      Value* c = ir.CreateAdd(lane, kb.c32(32 * q));
      Value* v = ir.CreateAdd(n0, ir.CreateZExt(c, kb.i64()));
      valid[q] = ir.CreateICmpSLT(v, vocab);
      Value* logit = ir.CreateFAdd(kb.load(kb.f32(), gemm.staged(r, c)),
                                   load_bias(kb, spec, kb.arg("bias"), ir.CreateSelect(valid[q], v, kb.c64(0))));
      z[q] = ir.CreateSelect(valid[q], capped_logit(kb, spec, logit), neg_inf(kb));
      zmax = kb.fmax(zmax, z[q]);
    }
    zmax = kb.warp_max(zmax);
    Value* sum = kb.cf(0.f);
    for (int q = 0; q < t.bn / 32; ++q)
      sum = ir.CreateFAdd(sum, ir.CreateSelect(valid[q], kb.exp(ir.CreateFSub(z[q], zmax)), kb.cf(0.f)));
    sum = kb.warp_sum(sum);
    TileRow row{zmax, sum};
    // The entropy's Σ p·(z − max) at the tile's max; the first column holding it (lane + 32q
    // increases with q; the warp keeps the lowest of equal maxima).
    if (spec.entropy) {
      Value* entropy_t = kb.cf(0.f);
      for (int q = 0; q < t.bn / 32; ++q) {
        Value* shift = ir.CreateFSub(z[q], zmax);
        entropy_t =
            ir.CreateFAdd(entropy_t, ir.CreateSelect(valid[q], ir.CreateFMul(kb.exp(shift), shift), kb.cf(0.f)));
      }
      row.entropy_t = kb.warp_sum(entropy_t);
    }
    if (spec.argmax) {
      Value* lane_max = neg_inf(kb);
      for (int q = 0; q < t.bn / 32; ++q) lane_max = kb.fmax(lane_max, z[q]);
      // (A constant per column, the lane added once: fewer live values beside the mainloop's.)
      Value* first = kb.c32(t.bn);
      for (int q = t.bn / 32 - 1; q >= 0; --q)
        first = ir.CreateSelect(ir.CreateFCmpOEQ(z[q], lane_max), kb.c32(32 * q), first);
      Value* argmax = ir.CreateSelect(ir.CreateICmpEQ(first, kb.c32(t.bn)), kb.c32(-1), ir.CreateAdd(lane, first));
      for (int mask = 16; mask >= 1; mask /= 2) {
        Value* other_max = kb.shfl_xor(lane_max, mask);
        argmax = merged_argmax(kb, lane_max, argmax, other_max, kb.shfl_xor_i32(argmax, mask));
        lane_max = kb.fmax(lane_max, other_max);
      }
      row.argmax = ir.CreateAdd(argmax, ir.CreateTrunc(n0, kb.i32()));
    }
    // Label smoothing: Σ w_v·u_v of the row's columns here (w = 1 without class weights).
    if (smoothing) {
      Value* logit_sum = kb.cf(0.f);
      for (int q = 0; q < t.bn / 32; ++q) {
        Value* v = ir.CreateAdd(n0, ir.CreateZExt(ir.CreateAdd(lane, kb.c32(32 * q)), kb.i64()));
        Value* weight = load_class_weight(kb, spec, ir.CreateSelect(valid[q], v, kb.c64(0)));
        logit_sum = ir.CreateFAdd(logit_sum, ir.CreateSelect(valid[q], ir.CreateFMul(weight, z[q]), kb.cf(0.f)));
      }
      row.logit_sum = kb.warp_sum(logit_sum);
    }
    return row;
  }

  // Merge the tile's statistics into row r's slots (online softmax), and write the target logit
  // where the tile holds the row's target.
  void merge_row(const TileRow& row, Value* m0, Value* n0, Value* r) {
    auto& ir = kb.ir();
    Value* old_max = kb.load(kb.f32(), row_slot(max_off, r, 4));
    Value* old_sum = kb.load(kb.f32(), row_slot(sum_off, r, 4));
    Value* new_max = kb.fmax(old_max, row.zmax);
    Value* merged = ir.CreateFAdd(ir.CreateFMul(old_sum, kb.exp(ir.CreateFSub(old_max, new_max))),
                                  ir.CreateFMul(row.sum, kb.exp(ir.CreateFSub(row.zmax, new_max))));
    kb.store(new_max, row_slot(max_off, r, 4));
    kb.store(merged, row_slot(sum_off, r, 4));
    if (spec.entropy) {
      Value* safe = ir.CreateSelect(ir.CreateFCmpOEQ(new_max, neg_inf(kb)), kb.cf(0.f), new_max);
      kb.store(merged_entropy(kb, safe, old_max, old_sum, kb.load(kb.f32(), row_slot(entropy_off, r, 4)), row.zmax,
                              row.sum, row.entropy_t),
               row_slot(entropy_off, r, 4));
    }
    if (spec.argmax)
      kb.store(ir.CreateSelect(ir.CreateFCmpOGT(row.zmax, old_max), row.argmax,
                               kb.load(kb.i32(), row_slot(argmax_off, r, 4))),
               row_slot(argmax_off, r, 4));
    if (smoothing)
      kb.store(ir.CreateFAdd(kb.load(kb.f32(), row_slot(logit_sum_off, r, 4)), row.logit_sum),
               row_slot(logit_sum_off, r, 4));
    Value* target = kb.load(kb.i64(), row_slot(tgt_off, r, 8));
    Value* in_tile = ir.CreateAnd(
        ir.CreateAnd(ir.CreateICmpSGE(target, n0), ir.CreateICmpSLT(target, ir.CreateAdd(n0, kb.c64(spec.tile.bn)))),
        ir.CreateICmpSLT(target, vocab));
    kb.if_then(in_tile, [&] {
      Value* c = ir.CreateTrunc(ir.CreateSub(target, n0), kb.i32());
      Value* logit = capped_logit(
          kb, spec, ir.CreateFAdd(kb.load(kb.f32(), gemm.staged(r, c)), load_bias(kb, spec, kb.arg("bias"), target)));
      Value* m = ir.CreateAdd(m0, ir.CreateZExt(r, kb.i64()));
      kb.store(logit, kb.gep(kb.arg("target_logit"), kb.f32(), m));
    });
  }

  // Store the row block's statistics as this split's partials.
  void store_partials(Value* m0, Value* rows, Value* tid) {
    auto& ir = kb.ir();
    kb.if_then(ir.CreateICmpSLT(tid, rows), [&] {
      Value* m = ir.CreateAdd(m0, ir.CreateZExt(tid, kb.i64()));
      Value* index = work.partial_index(m);
      kb.store(kb.load(kb.f32(), row_slot(max_off, tid, 4)), kb.gep(kb.arg("partial_max"), kb.f32(), index));
      kb.store(kb.load(kb.f32(), row_slot(sum_off, tid, 4)), kb.gep(kb.arg("partial_sum"), kb.f32(), index));
      if (smoothing)
        kb.store(kb.load(kb.f32(), row_slot(logit_sum_off, tid, 4)), kb.gep(kb.arg("partial_logit_sum"), kb.f32(), index));
      if (spec.entropy)
        kb.store(kb.load(kb.f32(), row_slot(entropy_off, tid, 4)), kb.gep(kb.arg("partial_entropy"), kb.f32(), index));
      if (spec.argmax)
        kb.store(kb.load(kb.i32(), row_slot(argmax_off, tid, 4)), kb.gep(kb.arg("partial_argmax"), kb.i32(), index));
    });
  }
};

}  // namespace

KernelShape build_lse_forward(llvm::Module& module, const KernelSpec& spec) {
  const TileConfig& t = spec.tile;
  KernelBuilder kb(module, "lse_forward", gemm_params(t, declare_params(spec)), t.threads());
  GemmSkeleton gemm(kb, spec);
  // The per-row slots (templates/epilogue/row_slots.h); the entropy's and argmax's where the spec has them.
  // The row-statistics slots stay reserved on both paths (kKernelKinds counts them for both).
  const RowSlots rows = row_slots(spec);
  const int smem_bytes = gemm.smem_bytes(rows.bytes * t.bm);
  const CtaWork work = split_grid(kb, spec, gemm);
  // With a bias the staged form is used: the register epilogue's bias values beside the
  // accumulators made the driver's JIT spill (24 bytes at V = 5000, H = 512; H200, driver 580),
  // though ptxas 13.0 allocates it without spills. Class weights (per-column loads too) likewise.
  if (gemm.specialised() && !spec.bias && !spec.class_weight)
    lse_forward_specialised(kb, spec, gemm, work.row_blocks, work.tile_begin, work.tile_end, work.k_tiles,
                            work.partial_index);
  else
    StagedForward(kb, spec, gemm, rows, work).run();
  kb.finish();
  return {"lse_forward", t.threads(), smem_bytes, kb.signature()};
}

}  // namespace lfce
