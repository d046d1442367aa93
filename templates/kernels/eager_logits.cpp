// eager_logits: the first of eager mode's three GEMMs. For a chunk of C tokens, the logits tile
// u = (x·Wᵀ + b) / T of every (token block, vocabulary tile) is reduced in the epilogue to each
// row's max over the tile's columns, M, and Σ_v e^(u_v − M) (the per-(tile, row) partials
// lse_combine merges into the LSE, [tiles, C] each, tile = vocabulary block of BN columns), the
// target logit u_y (fp32, by the thread that holds it), and the tile's
//   p̃ = e^(u − M)
// rounded to fp16 (fp32 for fp32 problems) and stored transposed into the dzᵀ workspace [V, ld] (tokens
// contiguous, the layout grad_weight and grad_input read). p̃ is in (0, 1], where fp16 keeps 11
// bits: its rounding is 8x finer than that of dz in bf16; u itself is never rounded. Once the LSE is
// known, eager_dz turns it into dz in place: p = p̃·e^(M − LSE).
//
// Rows in [C, ld) are written too (with whatever p̃ the zero-filled rows give): eager_dz zeroes
// them. The partials and the target logit are written for rows below C only.
//
// Two epilogues: on sm_90a without a bias, in registers over the wgmma fragment (persistent
// CTAs in grouped order, the quad of lanes holding a row reduces it by shuffles); otherwise over
// the staged fp32 tile (one warp per row for the statistics, then every element).
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
  std::vector<Param> params = {{"x", ParamType::GlobalPtr},           {"w", ParamType::GlobalPtr},
                               {"bias", ParamType::GlobalPtr},        {"targets", ParamType::GlobalPtr},
                               {"n", ParamType::I64},                 {"ld", ParamType::I64},
                               {"dz", ParamType::GlobalPtr},          {"partial_max", ParamType::GlobalPtr},
                               {"partial_sum", ParamType::GlobalPtr}, {"target_logit", ParamType::GlobalPtr}};
  add_shift_param(spec, params);
  return params;
}

// What both epilogues read: the chunk's arguments, p̃'s stored type, where the partials go.
struct EagerLogits {
  KernelBuilder& kb;
  const KernelSpec& spec;
  // p̃ is stored as fp16 for both 16-bit dtypes (fp32 for fp32): in (0, 1] fp16 keeps 11 bits of
  // it (bf16: 8), so its rounding, the one eager mode adds to recompute's, is 8x smaller than
  // dz's own; eager_dz reads it and writes dz in the dtype over it.
  llvm::Type* elem = eager_exponential_type(kb, spec.dtype);
  Value* n = kb.arg("n");
  Value* ld = kb.arg("ld");
  Value* vocab = kb.c64(spec.vocab);

  // The partials of row m of the vocabulary tile at n0: [tiles, C], tile = n0 / BN.
  Value* partial_at(const char* name, Value* n0, Value* m) const {
    auto& ir = kb.ir();
    Value* tile = ir.CreateUDiv(n0, kb.c64(spec.tile.bn));
    return kb.gep(kb.arg(name), kb.f32(), ir.CreateAdd(ir.CreateMul(tile, n), m));
  }
  // e^(u − M) = 2^(u·log2 e − M·log2 e): one FMA before the SFU's ex2 (-M·log2 e is per row).
  Value* exp_shifted(Value* u, Value* neg_scaled_max) const {
    return kb.exp2(kb.fma(u, kb.cf(KernelBuilder::kLog2e), neg_scaled_max));
  }
};

// sm_90a without a bias: the epilogue in registers over one tile's wgmma fragment; the quad of
// lanes holding a row reduces it by shuffles.
struct FragmentTile {
  const EagerLogits& e;
  const Fragment& f;
  Value *m0, *n0;
  const int rows = f.rows(), cols = 2 * f.blocks();
  // The logit map here is at most a temperature, u = z / T with T > 0: monotone and linear, so
  // the max is taken of z and 1 / T folded into the exponent's FMA (u is never formed).
  const float inverse_t = 1.f / e.spec.temperature;
  std::vector<Value*> valid{};              // column q (= 2j + e of this thread) below V
  std::vector<Value*> m{}, shift{}, max{};  // per fragment row: token, −M·log2 e, M
  std::vector<std::vector<Value*>> sums{};  // per fragment row: Σ p̃ in two chains

  // Mask the columns past the vocabulary.
  void mask_columns() {
    KernelBuilder& kb = e.kb;
    Value* left = columns_left(kb, f, e.vocab, n0);
    valid.resize(cols);
    for (int q = 0; q < cols; ++q) valid[q] = kb.ir().CreateICmpSLT(kb.c32(8 * (q / 2) + q % 2), left);
  }
  Value* logit(int q, int r) const {  // z of column q, row r; -inf past V
    return e.kb.ir().CreateSelect(valid[q], f.at(q / 2, r, q % 2), neg_inf(e.kb));
  }
  Value* to_u(Value* z) const { return e.spec.temperature == 1.f ? z : e.kb.ir().CreateFMul(z, e.kb.cf(inverse_t)); }
  // Row maxima: each row's M over the tile's columns.
  void row_maxima() {
    KernelBuilder& kb = e.kb;
    auto& ir = kb.ir();
    m.resize(rows);
    shift.resize(rows);
    max.resize(rows);
    for (int r = 0; r < rows; ++r) {
      m[r] = f.row_at(kb, m0, r);
      // The tile's row max over the quad's columns (every tile has a column below V), in four
      // chains: a tree would hold a temporary per pair beside the logits, which stay live.
      std::vector<Value*> chains(4, neg_inf(kb));
      for (int q = 0; q < cols; ++q) chains[q % 4] = kb.fmax(chains[q % 4], logit(q, r));
      max[r] = to_u(quad_reduce(kb, reduce_tree(chains, [&](Value* a, Value* b) { return kb.fmax(a, b); }),
                                [&](Value* a, Value* b) { return kb.fmax(a, b); }));
      shift[r] = ir.CreateFMul(max[r], kb.cf(-KernelBuilder::kLog2e));
    }
  }
  // Store p̃ = e^(u − M) transposed, column by column; each row's sum in two independent chains
  // (a fixed order).
  void store_exponentials() {
    KernelBuilder& kb = e.kb;
    auto& ir = kb.ir();
    // e^(u − M) = 2^(z·(log2 e / T) − M·log2 e).
    Value* exponent_scale = kb.cf(KernelBuilder::kLog2e * inverse_t);
    sums.assign(rows, std::vector<Value*>(2, kb.cf(0.f)));
    store_transposed_pairs(kb, f, m, n0, kb.arg("dz"), e.ld, e.vocab, e.elem, [&](int q, int r) {
      Value* p = kb.exp2(kb.fma(logit(q, r), exponent_scale, shift[r]));  // 0 past V (z = -inf)
      sums[r][q % 2] = ir.CreateFAdd(sums[r][q % 2], p);
      return p;
    });
  }
  // Store the row statistics: the partials (max, sum) by the quad's first lane, and the row's
  // target logit by the thread holding its column.
  void store_row_statistics() {
    KernelBuilder& kb = e.kb;
    auto& ir = kb.ir();
    Value* n = e.n;
    for (int r = 0; r < rows; ++r) {
      Value* sum = quad_reduce(kb, reduce_tree(sums[r], [&](Value* a, Value* b) { return ir.CreateFAdd(a, b); }),
                               [&](Value* a, Value* b) { return ir.CreateFAdd(a, b); });
      kb.if_then(ir.CreateAnd(ir.CreateICmpEQ(f.pos.quad_lane, kb.c32(0)), ir.CreateICmpSLT(m[r], n)), [&] {
        kb.store(max[r], e.partial_at("partial_max", n0, m[r]));
        kb.store(sum, e.partial_at("partial_sum", n0, m[r]));
      });
      // The row's target logit, by the thread holding its column: offset 8j + e from col0 with
      // (offset % 8) < 2 (in 32 bits once the target is known to be in [0, V), V < 2^31).
      Value* in_rows = ir.CreateICmpSLT(m[r], n);
      Value* target = load_target(kb, e.spec, kb.arg("targets"), ir.CreateSelect(in_rows, m[r], kb.c64(0)), kb.c64(-1));
      Value* in_vocab = ir.CreateAnd(ir.CreateICmpSGE(target, kb.c64(0)), ir.CreateICmpSLT(target, e.vocab));
      Value* rel =
          ir.CreateSub(ir.CreateSub(ir.CreateTrunc(target, kb.i32()), ir.CreateTrunc(n0, kb.i32())), f.pos.col0);
      Value* mine =
          ir.CreateAnd(ir.CreateAnd(in_rows, in_vocab),
                       ir.CreateAnd(ir.CreateICmpSGE(rel, kb.c32(0)), ir.CreateICmpSLT(rel, kb.c32(8 * f.blocks()))));
      mine = ir.CreateAnd(mine, ir.CreateICmpEQ(ir.CreateAnd(rel, kb.c32(6)), kb.c32(0)));
      kb.if_then(mine, [&] {
        Value* u = kb.cf(0.f);
        for (int q = 0; q < cols; ++q)
          u = ir.CreateSelect(ir.CreateICmpEQ(rel, kb.c32(8 * (q / 2) + q % 2)), logit(q, r), u);
        kb.store(to_u(u), kb.gep(kb.arg("target_logit"), kb.f32(), m[r]));
      });
    }
  }
};

// Epilogue in registers (sm_90a without a bias): persistent CTAs take the tiles in grouped order.
void run_persistent(const EagerLogits& e, GemmSkeleton& gemm, Value* grid_m, Value* grid_n, Value* k_tiles) {
  gemm.run_persistent(grid_m, grid_n, k_tiles, [&](Value* m0, Value* n0, const Fragment& f) {
    FragmentTile tile{e, f, m0, n0};
    tile.mask_columns();
    tile.row_maxima();
    tile.store_exponentials();
    tile.store_row_statistics();
  });
}

// The staged form of one tile: the fp32 tile in shared memory, then one warp per row for its
// statistics (each lane BN / 32 columns) and every element for p̃.
struct StagedTile {
  const EagerLogits& e;
  GemmSkeleton& gemm;
  const GemmOperand &x, &w;
  Value *k_tiles, *lane, *warp;
  int max_off;  // the row maxima's slot (templates/epilogue/row_slots.h)

  Value* max_slot(Value* r) const { return row_slot_at(e.kb, max_off, r, 4); }
  Value* logit_at(Value* r, Value* c, Value* v) const {
    KernelBuilder& kb = e.kb;
    return capped_logit(
        kb, e.spec, kb.ir().CreateFAdd(kb.load(kb.f32(), gemm.staged(r, c)), load_bias(kb, e.spec, kb.arg("bias"), v)));
  }
  // Mainloop, the row statistics, then p̃.
  void run(Value* m0, Value* n0) const {
    gemm.compute_tile(x, w, m0, n0, k_tiles);
    row_statistics(m0, n0);
    e.kb.barrier();  // the row maxima are in shared memory
    store_exponentials(m0, n0);
    e.kb.barrier();  // the next tile's statistics overwrite the row maxima
  }
  // Row statistics, one warp per row: M into the row's slot; for rows below C the partials and,
  // where the tile holds it, the target logit.
  void row_statistics(Value* m0, Value* n0) const {
    KernelBuilder& kb = e.kb;
    const KernelSpec& spec = e.spec;
    const TileConfig& t = spec.tile;
    auto& ir = kb.ir();
    Value* n = e.n;
    Value* vocab = e.vocab;
    const int warps = t.threads() / 32;
    kb.for_range(warp, kb.c32(t.bm), kb.c32(warps), [&](Value* r) {
      Value* m = ir.CreateAdd(m0, ir.CreateZExt(r, kb.i64()));
      std::vector<Value*> u(t.bn / 32), valid(t.bn / 32);
      for (int q = 0; q < t.bn / 32; ++q) {
        Value* c = ir.CreateAdd(lane, kb.c32(32 * q));
        Value* v = ir.CreateAdd(n0, ir.CreateZExt(c, kb.i64()));
        valid[q] = ir.CreateICmpSLT(v, vocab);
        u[q] = ir.CreateSelect(valid[q], logit_at(r, c, ir.CreateSelect(valid[q], v, kb.c64(0))), neg_inf(kb));
      }
      Value* max = kb.warp_max(reduce_tree(u, [&](Value* a, Value* b) { return kb.fmax(a, b); }));
      Value* shift = ir.CreateFMul(max, kb.cf(-KernelBuilder::kLog2e));
      std::vector<Value*> p(t.bn / 32);
      for (int q = 0; q < t.bn / 32; ++q) p[q] = e.exp_shifted(u[q], shift);
      Value* sum = kb.warp_sum(reduce_tree(p, [&](Value* a, Value* b) { return ir.CreateFAdd(a, b); }));
      kb.if_then(ir.CreateICmpEQ(lane, kb.c32(0)), [&] {
        kb.store(max, max_slot(r));
        kb.if_then(ir.CreateICmpSLT(m, n), [&] {
          kb.store(max, e.partial_at("partial_max", n0, m));
          kb.store(sum, e.partial_at("partial_sum", n0, m));
          Value* target = load_target(kb, spec, kb.arg("targets"), m, kb.c64(-1));
          Value* in_tile = ir.CreateAnd(ir.CreateAnd(ir.CreateICmpSGE(target, n0),
                                                     ir.CreateICmpSLT(target, ir.CreateAdd(n0, kb.c64(t.bn)))),
                                        ir.CreateICmpSLT(target, vocab));
          kb.if_then(in_tile, [&] {
            Value* c = ir.CreateTrunc(ir.CreateSub(target, n0), kb.i32());
            kb.store(logit_at(r, c, target), kb.gep(kb.arg("target_logit"), kb.f32(), m));
          });
        });
      });
    });
  }
  // Store p̃ of every element, rows fastest: consecutive threads write consecutive tokens of one
  // dzᵀ row.
  void store_exponentials(Value* m0, Value* n0) const {
    KernelBuilder& kb = e.kb;
    auto& ir = kb.ir();
    gemm.for_each_element(/*rows_fastest=*/true, [&](Value* r, Value* c) {
      Value* m = ir.CreateAdd(m0, ir.CreateZExt(r, kb.i64()));
      Value* v = ir.CreateAdd(n0, ir.CreateZExt(c, kb.i64()));
      kb.if_then(ir.CreateAnd(ir.CreateICmpSLT(m, e.ld), ir.CreateICmpSLT(v, e.vocab)), [&] {
        Value* shift = ir.CreateFMul(kb.load(kb.f32(), max_slot(r)), kb.cf(-KernelBuilder::kLog2e));
        Value* p = e.exp_shifted(logit_at(r, c, v), shift);
        kb.store(kb.from_f32(p, e.elem), kb.gep(kb.arg("dz"), e.elem, ir.CreateAdd(ir.CreateMul(v, e.ld), m)));
      });
    });
  }
};

// The staged form: persistent CTAs over the tiles in grouped order with wgmma (sm_90a with a
// bias), else one tile per CTA.
void run_staged(const EagerLogits& e, GemmSkeleton& gemm, int max_off, Value* grid_m, Value* grid_n, Value* k_tiles) {
  KernelBuilder& kb = e.kb;
  const KernelSpec& spec = e.spec;
  const TileConfig& t = spec.tile;
  auto& ir = kb.ir();
  Value* hidden = kb.c64(spec.hidden);
  const int row_align = hidden_row_align(spec.hidden, spec.dtype);  // rows of H elements
  GemmOperand x{kb.arg("x"), hidden, Layout::KMajor, e.n, hidden, row_align};
  GemmOperand w{kb.arg("w"), hidden, Layout::KMajor, e.vocab, hidden, row_align};
  Value* tid = kb.tid();
  Value* lane = ir.CreateAnd(tid, kb.c32(31));
  Value* warp = ir.CreateLShr(tid, kb.c32(5));
  const StagedTile staged{e, gemm, x, w, k_tiles, lane, warp, max_off};
  if (t.wgmma()) {
    TileScheduler(t).walk(kb, grid_m, grid_n, [&](Value* m0, Value* n0) { staged.run(m0, n0); });
  } else {
    Value *m0, *n0;
    std::tie(m0, n0) = TileScheduler(t).origin(kb);
    staged.run(m0, n0);
  }
}

}  // namespace

KernelShape build_eager_logits(llvm::Module& module, const KernelSpec& spec) {
  const TileConfig& t = spec.tile;
  KernelBuilder kb(module, "eager_logits", gemm_params(t, declare_params(spec)), t.threads());
  GemmSkeleton gemm(kb, spec);
  const EagerLogits e{kb, spec};
  const RowSlots rows = row_slots(spec);  // the staged form's row maxima (templates/epilogue/row_slots.h)
  const int max_off = gemm.extra_offset() + rows.max * t.bm;
  const int smem_bytes = gemm.smem_bytes(rows.bytes * t.bm);
  Value* k_tiles = gemm.k_tiles_for(kb.c64(spec.hidden));
  Value* grid_m = gemm.blocks_for(e.n, t.bm);
  Value* grid_n = gemm.blocks_for(e.vocab, t.bn);
  if (gemm.specialised() && !spec.bias)
    run_persistent(e, gemm, grid_m, grid_n, k_tiles);
  else
    run_staged(e, gemm, max_off, grid_m, grid_n, k_tiles);
  kb.finish();
  return {"eager_logits", t.threads(), smem_bytes, kb.signature()};
}

}  // namespace lfce
