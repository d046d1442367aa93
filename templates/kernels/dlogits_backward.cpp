// dlogits_backward: recomputes one vocabulary chunk's logits tile z = x·W[chunk]ᵀ (+ b) and
// writes dz = g_i · (softmax(z_i) − onehot(y_i)) = g_i · (exp(z − LSE_i) − [v = y_i]) to the
// chunk workspace (with the loss options: the softmax of the capped, scaled logits u, its
// values times 1 + 2s·LSE_i for the z-loss, dz times du/dz; template_util.h), stored transposed
// as dzᵀ [chunk, ld] (tokens contiguous) for the two GEMMs that consume it. The softmax is taken
// in fp32 registers; only dz is rounded to the dtype.
//
// g_i: 0 for ignored tokens; otherwise the upstream gradient (grad_loss[0] for mean/sum,
// grad_loss[i] for none; 1 in eager mode, where it is applied later), divided by the valid
// count for mean; for fp16 times dz_scale (template_util.h), which the consumers divide out.
// Rows i in [N, ld) are written as zeros: the consuming GEMMs read them.
//
// With label smoothing eps or class weights w (template_util.h, has_target_terms) the row's
// dz_v = P·p_v − T·[v = y] − U·w_v (times du/dz), with a the cross-entropy's scale (g, divided
// for mean by Σ w_y of the counted tokens) and b the z-loss's (g, divided for mean by their
// count): T = a·(1 − eps)·w_y, U = a·eps / V, P = T + a·eps·W / V + b·2s·LSE, W = Σ_v w_v (V
// without class weights; valid_count[2] with them).
//
// With the gradients of the lse rows (lse_grad: lfce_backward_args.grad_lse) the same form holds
// with P += g_lse + g_H·S − g_lp, T −= g_lp and one more term −g_H·p_v·u_v (the entropy's, S = LSE − H),
// for every token (ignored ones too: their LSE and entropy are outputs); g_lp only where the target
// is counted and in [0, V).
#include "templates/epilogue/dz_math.h"
#include "templates/epilogue/fragment_epilogue.h"
#include "templates/epilogue/row_slots.h"
#include "templates/gemm/gemm_skeleton.h"
#include "templates/gemm/tile_scheduler.h"
#include "templates/template_util.h"
#include "templates/templates.h"

namespace lfce {

using llvm::Value;

namespace {

// Declare the parameters: the kernel's own, by name (gemm_params adds the GEMM's tensor maps).
std::vector<Param> declare_params(const KernelSpec& spec) {
  std::vector<Param> params = {{"x", ParamType::GlobalPtr}, {"w", ParamType::GlobalPtr}, {"bias", ParamType::GlobalPtr},
                               {"targets", ParamType::GlobalPtr}, {"lse", ParamType::GlobalPtr},
                               {"grad_loss", ParamType::GlobalPtr}, {"valid_count", ParamType::GlobalPtr},
                               {"n", ParamType::I64}, {"ignore_index", ParamType::I64}, {"v_begin", ParamType::I64},
                               {"v_len", ParamType::I64}, {"ld", ParamType::I64}, {"dz", ParamType::GlobalPtr},
                               {"residual", ParamType::GlobalPtr}};
  if (spec.class_weight) params.push_back({"class_weight", ParamType::GlobalPtr});
  if (spec.lse_grad) params.push_back({"grad_lse", ParamType::GlobalPtr});
  add_shift_param(spec, params);
  return params;
}

// dz of one element, rounded to the dtype, and exact (fp32); hit: the element is the row's target.
struct Dz {
  Value *rounded, *exact, *hit;
};

// The dz math both epilogues share, and the chunk's arguments they read.
struct DzMath {
  KernelBuilder& kb;
  const KernelSpec& spec;
  llvm::Type* elem = elem_type(kb, spec.dtype);
  // The P/T/U form: the target terms' or the lse rows' gradients need it.
  const bool row_terms = has_target_terms(spec) || spec.lse_grad;
  const bool entropy_term = spec.lse_grad && spec.entropy;
  // U·w_v needs the column's class weight: per-column loads, as a bias.
  const bool column_weights = spec.class_weight && spec.label_smoothing != 0.f;
  // At the row's target (the largest |dz| of the row) what rounding dz loses is kept in
  // residual[m], which grad_input adds back times W[target]: token m's gradient gets its
  // dominant term unrounded (docs/design.md, Numerics). fp32 rounds nothing.
  const bool compensate = spec.dtype != DType::FP32;
  Value* n = kb.arg("n");
  Value* v_begin = kb.arg("v_begin");
  Value* v_len = kb.arg("v_len");
  Value* ld = kb.arg("ld");

  RowConstants row_constants(Value* m) const { return lfce::row_constants(kb, spec, m, n); }
  // dz of logit z (bias included) of a row, rounded to the dtype. With a softcap or a temperature,
  // the softmax's input is the capped (and scaled) logit and the chain rule multiplies by its
  // slope. The z-loss scales the row's softmax by 1 + 2s·LSE (a per-row constant: LLVM computes
  // it once per row). column_weight: w_v where the row has U and class weights (else nullptr: w_v = 1).
  Dz dz_of(Value* z, const RowConstants& row, Value* hit, Value* column_weight) const {
    auto& ir = kb.ir();
    const CappedLogit capped = capped_logit_with_slope(kb, spec, z);
    z = capped.u;
    Value* p = kb.exp(ir.CreateFSub(z, row.lse));
    Value* dz = dz_of_softmax(kb, spec, row, p, z, hit, column_weight, capped.slope);
    Value* rounded = kb.from_f32(dz, elem);
    return Dz{rounded, dz, hit};
  }
  // The same dz, for the sm_90a epilogue without a bias: e^(z − LSE) = 2^(z·log2 e − LSE·log2 e)
  // as one FMA before the SFU's ex2 and g·(p·factor − [hit]) as one FMA, fp32, not rounded.
  // (The epilogue with a bias and the staged one keep dz_of above: their registers under the
  // driver's JIT were measured with it.)
  Value* lean_dz(Value* z, const RowConstants& row, Value* hit) const {
    auto& ir = kb.ir();
    const CappedLogit capped = capped_logit_with_slope(kb, spec, z);
    z = capped.u;
    Value* p = kb.exp2(kb.fma(z, kb.cf(KernelBuilder::kLog2e), ir.CreateFMul(row.lse, kb.cf(-KernelBuilder::kLog2e))));
    Value* dz = nullptr;
    if (row_terms) {
      // hit is a constant here: false for every element, true for the target's correction.
      Value* sub = ir.CreateSelect(hit, row.t, kb.cf(0.f));
      if (row.u) sub = ir.CreateFAdd(sub, row.u);  // w_v = 1: no class weights on this path with U
      Value* coef = row.q ? kb.fma(ir.CreateFNeg(row.q), z, row.p) : row.p;  // P − q·u
      dz = kb.fma(coef, p, ir.CreateFNeg(sub));
    } else {
      Value* g = row.g;
      if (Value* factor = z_loss_factor(kb, spec, row.lse)) g = ir.CreateFMul(g, factor);
      dz = kb.fma(g, p, ir.CreateFNeg(ir.CreateSelect(hit, row.g, kb.cf(0.f))));
    }
    if (capped.slope) dz = ir.CreateFMul(dz, capped.slope);
    return ir.CreateSelect(row.zero ? row.zero : ir.CreateFCmpOEQ(row.g, kb.cf(0.f)), kb.cf(0.f), dz);
  }
  // What rounding `exact` (fp32) to the dtype loses, stored for token m. Computed where it is
  // stored: outside that branch it costs registers in every element.
  void store_residual(Value* m, Value* exact) const {
    auto& ir = kb.ir();
    kb.store(ir.CreateFSub(exact, kb.to_f32(kb.from_f32(exact, elem))), kb.gep(kb.arg("residual"), kb.f32(), m));
  }
};

// A fragment's rows: their tokens m, their constants, and their targets' columns in this thread.
struct FragmentRows {
  std::vector<Value*> m, target_col;
  std::vector<RowConstants> row;
};

// Load row statistics (sm_90a): each fragment row's token and constants, and its target as this
// thread's column offset 8j + e (from col0), -1 unless it is in this tile's columns of the chunk
// and the row is a token (and, without per-column values, one of this thread's columns: offset
// % 8 < 2, the quad's other lanes hold the rest; the target's correction is made by its owner
// only): one 32-bit compare with a constant per element, instead of 64-bit vocabulary indices.
FragmentRows fragment_rows(const DzMath& d, const Fragment& f, Value* m0, Value* n0, bool per_column) {
  KernelBuilder& kb = d.kb;
  auto& ir = kb.ir();
  const int rows = f.rows();
  FragmentRows out{std::vector<Value*>(rows), std::vector<Value*>(rows), std::vector<RowConstants>(rows)};
  for (int h = 0; h < rows; ++h) {
    out.m[h] = f.row_at(kb, m0, h);
    out.row[h] = d.row_constants(out.m[h]);
    Value* first_col = ir.CreateAdd(n0, ir.CreateZExt(f.pos.col0, kb.i64()));  // within the chunk
    Value* rel = ir.CreateSub(out.row[h].target, ir.CreateAdd(d.v_begin, first_col));
    Value* in_tile =
        ir.CreateAnd(ir.CreateICmpSGE(rel, kb.c64(0)), ir.CreateICmpSLT(rel, ir.CreateSub(d.v_len, first_col)));
    // (8 · blocks: this thread's column range, BN, or BN / 2 in a split tile.)
    Value* mine = ir.CreateAnd(ir.CreateICmpSLT(out.m[h], d.n),
                               ir.CreateAnd(in_tile, ir.CreateICmpSLT(rel, kb.c64(8 * f.blocks()))));
    if (!per_column) mine = ir.CreateAnd(mine, ir.CreateICmpEQ(ir.CreateAnd(rel, kb.c64(6)), kb.c64(0)));
    out.target_col[h] = ir.CreateSelect(mine, ir.CreateTrunc(rel, kb.i32()), kb.c32(-1));
  }
  return out;
}

// Epilogue with per-column values (sm_90a; a bias, or the class weights of U·w_v): dz rounded per
// element, exchanged as 16-bit values, a branch per pair store and per target residual. (The
// straight-line form of store_lean hoisted every bias load to the top and spilled 40-64 bytes
// under the driver's JIT, H200, driver 580, with a branch per store or a warp sync every 4
// columns too.)
// dzᵀ has tokens contiguous, and this thread's two rows of an m64 block are 8 apart; the lane
// four away (lane ^ 4) holds the rows one below (upper = 1) or above. One shuffle per column and
// block gives each of the pair two adjacent tokens to store as one 4-byte pair: the lower lane
// rows (r, r + 1), the upper one (r + 8, r + 9), r even (ld is a multiple of 8, so a pair is
// wholly inside or outside [0, ld)). Half the stores of one element each.
void store_per_column(const DzMath& d, const Fragment& f, Value* n0, const FragmentRows& fr) {
  KernelBuilder& kb = d.kb;
  const KernelSpec& spec = d.spec;
  auto& ir = kb.ir();
  llvm::Type* elem = d.elem;
  const int rows = f.rows();
  Value* upper = ir.CreateICmpNE(ir.CreateAnd(f.pos.row[0], kb.c32(1)), kb.c32(0));
  std::vector<Value*> pair_row(rows / 2), pair_in_rows(rows / 2);
  for (int i = 0; i < rows / 2; ++i) {
    pair_row[i] = ir.CreateSelect(upper, ir.CreateSub(fr.m[2 * i + 1], kb.c64(1)), fr.m[2 * i]);
    pair_in_rows[i] = ir.CreateICmpSLT(pair_row[i], d.ld);
  }
  llvm::Type* bits = ir.getIntNTy(16);
  auto exchange = [&](Value* value) {  // a 16-bit value from lane ^ 4, through an f32 shuffle
    Value* wide = ir.CreateBitCast(ir.CreateZExt(ir.CreateBitCast(value, bits), kb.i32()), kb.f32());
    Value* got = ir.CreateBitCast(kb.shfl_xor(wide, 4), kb.i32());
    return ir.CreateBitCast(ir.CreateTrunc(got, bits), elem);
  };
  // Column by column (q = 2j + e of this thread), all rows: few values live at once.
  for (int q = 0; q < 2 * f.blocks(); ++q) {
    Value* v = f.col_at(kb, n0, q / 2, q % 2);
    Value* in_cols = ir.CreateICmpSLT(v, d.v_len);
    Value* vocab_index = ir.CreateAdd(d.v_begin, v);
    Value* bias = load_bias(kb, spec, kb.arg("bias"), ir.CreateSelect(in_cols, vocab_index, d.v_begin));
    Value* column_weight =
        d.column_weights ? load_class_weight(kb, spec, ir.CreateSelect(in_cols, vocab_index, d.v_begin)) : nullptr;
    Value* column = kb.gep(kb.arg("dz"), elem, ir.CreateMul(v, d.ld));
    for (int i = 0; i < rows / 2; ++i) {
      Dz dz[2];
      for (int h = 0; h < 2; ++h)
        dz[h] = d.dz_of(add_bias(kb, spec, f.at(q / 2, 2 * i + h, q % 2), bias), fr.row[2 * i + h],
                        ir.CreateICmpEQ(fr.target_col[2 * i + h], kb.c32(8 * (q / 2) + q % 2)), column_weight);
      // The lower lane sends its second row, the upper one its first.
      Value* got = exchange(ir.CreateSelect(upper, dz[0].rounded, dz[1].rounded));
      Value* pair = llvm::PoisonValue::get(llvm::FixedVectorType::get(elem, 2));
      pair = ir.CreateInsertElement(pair, ir.CreateSelect(upper, got, dz[0].rounded), uint64_t{0});
      pair = ir.CreateInsertElement(pair, ir.CreateSelect(upper, dz[1].rounded, got), uint64_t{1});
      kb.if_then(ir.CreateAnd(pair_in_rows[i], in_cols), [&] { kb.store(pair, kb.gep(column, elem, pair_row[i])); });
      if (d.compensate)
        for (int h = 0; h < 2; ++h) kb.if_then(dz[h].hit, [&] { d.store_residual(fr.m[2 * i + h], dz[h].exact); });
    }
  }
}

// Epilogue without per-column values (sm_90a): the lean form, about 8 SASS instructions per
// element, stored transposed as packed pairs (fragment_epilogue.h). Every element is stored as
// g·p (the softmax term); the row's target element, at most one per row and in about one tile of
// V / BN, is corrected after the columns: its logit is kept by one select per element, and a
// branch per row stores g·(p − 1) over the pair's value and the residual. No per-element branch
// or second use of a per-element predicate.
void store_lean(const DzMath& d, const Fragment& f, Value* n0, const FragmentRows& fr) {
  KernelBuilder& kb = d.kb;
  auto& ir = kb.ir();
  llvm::Type* elem = d.elem;
  const int rows = f.rows();
  std::vector<Value*> target_z(rows, kb.cf(0.f));
  auto no_target = kb.ir().getFalse();
  store_transposed_pairs(kb, f, fr.m, n0, kb.arg("dz"), d.ld, d.v_len, elem, [&](int q, int r) {
    Value* z = f.at(q / 2, r, q % 2);
    target_z[r] = ir.CreateSelect(ir.CreateICmpEQ(fr.target_col[r], kb.c32(8 * (q / 2) + q % 2)), z, target_z[r]);
    return d.lean_dz(z, fr.row[r], no_target);
  });
  // The pair stores of every lane of the warp are ordered before the corrections.
  kb.warp_sync();
  for (int h = 0; h < rows; ++h)
    kb.if_then(ir.CreateICmpSGE(fr.target_col[h], kb.c32(0)), [&] {
      Value* dz = d.lean_dz(target_z[h], fr.row[h], kb.ir().getTrue());
      Value* v = ir.CreateAdd(ir.CreateAdd(n0, ir.CreateZExt(f.pos.col0, kb.i64())),
                              ir.CreateZExt(fr.target_col[h], kb.i64()));
      kb.store(kb.from_f32(dz, elem), kb.gep(kb.arg("dz"), elem, ir.CreateAdd(ir.CreateMul(v, d.ld), fr.m[h])));
      if (d.compensate) d.store_residual(fr.m[h], dz);
    });
}

// sm_90a: persistent CTAs take the tiles tile = ctaid.x, + nctaid.x, ... in grouped order,
// warp-specialised, and write dz straight from the accumulators (no staged tile, so the
// producer loads the next tile while the consumers finish this one).
void run_persistent(const DzMath& d, GemmSkeleton& gemm, Value* k_tiles) {
  const TileConfig& t = d.spec.tile;
  // The epilogue with per-column values (a bias, or the class weights of U·w_v), or the lean one.
  const bool per_column = d.spec.bias || d.column_weights;
  gemm.run_persistent(gemm.blocks_for(d.n, t.bm), gemm.blocks_for(d.v_len, t.bn), k_tiles,
                      [&](Value* m0, Value* n0, const Fragment& f) {
                        const FragmentRows rows = fragment_rows(d, f, m0, n0, per_column);
                        if (per_column)
                          store_per_column(d, f, n0, rows);
                        else
                          store_lean(d, f, n0, rows);
                      });
}

// The staged tile's per-row slots in shared memory (templates/epilogue/row_slots.h): the LSE, g
// and the target; P and T with row terms, q with the entropy's gradient.
struct StagedRows {
  KernelBuilder& kb;
  int lse, g, target, p, t, q;  // byte offsets of the slots

  StagedRows(KernelBuilder& kb, const GemmSkeleton& gemm, const RowSlots& rows, int bm)
      : kb(kb),
        lse(gemm.extra_offset() + rows.lse * bm),
        g(gemm.extra_offset() + rows.g * bm),
        target(gemm.extra_offset() + rows.target * bm),
        p(gemm.extra_offset() + rows.p * bm),
        t(gemm.extra_offset() + rows.t * bm),
        q(gemm.extra_offset() + rows.q * bm) {}
  Value* slot(int base, Value* r, int bytes) const { return row_slot_at(kb, base, r, bytes); }
};

// Load row statistics (staged): the tile's per-row constants, read once into the row slots.
void store_row_constants(const DzMath& d, const StagedRows& slots, Value* m0, Value* tid) {
  KernelBuilder& kb = d.kb;
  auto& ir = kb.ir();
  kb.if_then(ir.CreateICmpULT(tid, kb.c32(d.spec.tile.bm)), [&] {
    RowConstants row = d.row_constants(ir.CreateAdd(m0, ir.CreateZExt(tid, kb.i64())));
    kb.store(row.g, slots.slot(slots.g, tid, 4));
    kb.store(row.lse, slots.slot(slots.lse, tid, 4));
    kb.store(row.target, slots.slot(slots.target, tid, 8));
    if (d.row_terms) {
      kb.store(row.p, slots.slot(slots.p, tid, 4));
      kb.store(row.t, slots.slot(slots.t, tid, 4));
    }
    if (d.entropy_term) kb.store(row.q, slots.slot(slots.q, tid, 4));
  });
}

// Mainloop (staged): the logits tile z = x·W[chunk]ᵀ into shared memory.
void compute_logits(const DzMath& d, GemmSkeleton& gemm, Value* m0, Value* n0, Value* k_tiles) {
  KernelBuilder& kb = d.kb;
  auto& ir = kb.ir();
  Value* hidden = kb.c64(d.spec.hidden);
  const int row_align = hidden_row_align(d.spec.hidden, d.spec.dtype);  // rows of H elements
  GemmOperand x{kb.arg("x"), hidden, Layout::KMajor, d.n, hidden, row_align};
  Value* w_chunk = kb.gep(kb.arg("w"), d.elem, ir.CreateMul(d.v_begin, hidden));
  GemmOperand w{w_chunk, hidden, Layout::KMajor, d.v_len, hidden, row_align};
  gemm.compute_tile(x, w, m0, n0, k_tiles);
}

// Epilogue: dz (staged): each element's dz from the staged logit and its row's slots, stored
// transposed (rows fastest: consecutive threads write consecutive tokens of one dzᵀ row), with
// the target's residual.
void store_staged_dz(const DzMath& d, GemmSkeleton& gemm, const StagedRows& slots, Value* m0, Value* n0) {
  KernelBuilder& kb = d.kb;
  const KernelSpec& spec = d.spec;
  auto& ir = kb.ir();
  gemm.for_each_element(/*rows_fastest=*/true, [&](Value* r, Value* c) {
    Value* m = ir.CreateAdd(m0, ir.CreateZExt(r, kb.i64()));
    Value* v = ir.CreateAdd(n0, ir.CreateZExt(c, kb.i64()));
    kb.if_then(ir.CreateAnd(ir.CreateICmpSLT(m, d.ld), ir.CreateICmpSLT(v, d.v_len)), [&] {
      RowConstants row{kb.load(kb.f32(), slots.slot(slots.g, r, 4)), kb.load(kb.f32(), slots.slot(slots.lse, r, 4)),
                       kb.load(kb.i64(), slots.slot(slots.target, r, 8))};
      if (d.row_terms) {
        row.p = kb.load(kb.f32(), slots.slot(slots.p, r, 4));
        row.t = kb.load(kb.f32(), slots.slot(slots.t, r, 4));
        row.u = smoothing_u(kb, spec, row.g);
      }
      if (d.entropy_term) row.q = kb.load(kb.f32(), slots.slot(slots.q, r, 4));
      if (spec.lse_grad) row.zero = ir.CreateICmpSGE(m, d.n);
      Value* vocab_index = ir.CreateAdd(d.v_begin, v);
      Value* z = ir.CreateFAdd(kb.load(kb.f32(), gemm.staged(r, c)), load_bias(kb, spec, kb.arg("bias"), vocab_index));
      Value* index = ir.CreateAdd(ir.CreateMul(v, d.ld), m);
      Value* column_weight = d.column_weights ? load_class_weight(kb, spec, vocab_index) : nullptr;
      Dz dz = d.dz_of(z, row, ir.CreateICmpEQ(row.target, vocab_index), column_weight);
      kb.store(dz.rounded, kb.gep(kb.arg("dz"), d.elem, index));
      if (d.compensate)
        kb.if_then(ir.CreateAnd(dz.hit, ir.CreateICmpSLT(m, d.n)), [&] { d.store_residual(m, dz.exact); });
    });
  });
}

// Without wgmma: one tile of the scheduler's walk, staged through shared memory.
void run_staged(const DzMath& d, GemmSkeleton& gemm, const RowSlots& rows, Value* k_tiles) {
  const StagedRows slots(d.kb, gemm, rows, d.spec.tile.bm);
  Value *m0, *n0;
  std::tie(m0, n0) = TileScheduler(d.spec.tile).origin(d.kb);
  Value* tid = d.kb.tid();
  store_row_constants(d, slots, m0, tid);
  compute_logits(d, gemm, m0, n0, k_tiles);
  store_staged_dz(d, gemm, slots, m0, n0);
}

}  // namespace

KernelShape build_dlogits_backward(llvm::Module& module, const KernelSpec& spec) {
  const TileConfig& t = spec.tile;
  KernelBuilder kb(module, "dlogits_backward", gemm_params(t, declare_params(spec)), t.threads());
  GemmSkeleton gemm(kb, spec);
  const RowSlots rows = row_slots(spec);
  const int smem_bytes = gemm.smem_bytes(rows.bytes * t.bm);
  const DzMath dz_math{kb, spec};
  Value* k_tiles = gemm.k_tiles_for(kb.c64(spec.hidden));
  if (gemm.specialised())
    run_persistent(dz_math, gemm, k_tiles);
  else
    run_staged(dz_math, gemm, rows, k_tiles);
  kb.finish();
  return {"dlogits_backward", t.threads(), smem_bytes, kb.signature()};
}

}  // namespace lfce
