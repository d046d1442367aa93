// eager_dz: eager mode's fix-up between its first GEMM and the two gradient GEMMs. eager_logits
// left p̃ = e^(u − M) (fp16 for 16-bit dtypes, fp32 for fp32) in the dzᵀ workspace [V, ld] (M: the
// row's max over the vocabulary tile of
// `tile_n` columns that holds v, partial_max [tiles, C]); with the LSE from lse_combine,
//   p = p̃·e^(M − LSE),   dz = (dlogits_backward's formula of p, templates/epilogue/dz_math.h)
// is written over it in place, rounded to the dtype, with an upstream gradient of 1 (eager mode:
// the autograd backward scales the gradients), divided for mean by the valid count (token_count
// ran first), fp16's dz_scale, the temperature's 1 / T, the z-loss factor, class weights and
// token scaling as in recompute mode. Rows in [C, ld) become 0.
//
// The row's target element is formed from the fp32 target logit u_y (eager_logits), not from
// its rounded p̃: p_y = e^(u_y − LSE), and what rounding its dz loses goes to residual[m] for
// grad_input (docs/design.md, Numerics), as dlogits_backward does. Every other element is
// C_m·p̃ with one per-row constant C_m, one multiplication. Each element is stored once.
//
// One CTA per 256 tokens and vocabulary tile: grid (ceil(ld / 256), tiles), 256 threads (32 token
// groups x 8 row groups; EagerDzGrid in templates/gemm/tile_scheduler.h, which the runtime sizes
// the grid with). Each thread forms its 8 tokens' row constants once (the tile's M among
// them) and then walks the tile's rows, 8 at a time (4 for fp32), one vector of 8 tokens a row.
//
// With spec.eager_operand (the GEMMs turn p̃ into dz themselves, templates/gemm/eager_operand.h)
// nothing of the workspace is rewritten: each thread stores its 8 tokens' constants for one tile,
// coef [tiles, ld] (0 past C), and the tile-0 threads each token's target, target_col [ld] (-1:
// none in [0, V); an ignored token's is kept, its dz being 0), and its dz, target_dz [ld] in the
// dtype; the residuals as above. Grid (ceil(ld / 256), ceil(tiles / 8)): the 8 row groups of a CTA
// take 8 consecutive tiles.
#include "templates/epilogue/dz_math.h"
#include "templates/gemm/tile_scheduler.h"
#include "templates/template_util.h"
#include "templates/templates.h"

namespace lfce {

using llvm::Value;

KernelShape build_eager_dz(llvm::Module& module, const KernelSpec& normalised) {
  // The mode is not part of the spec (always eager: upstream gradient 1, no grad_loss).
  KernelSpec spec = normalised;
  spec.mode = Mode::Eager;
  constexpr int kThreads = EagerDzGrid::kThreads, kTokens = EagerDzGrid::kTokens, kRowGroups = EagerDzGrid::kRowGroups;
  // Rows a thread loads before it stores them: 128 bytes of p̃ in flight (fp32's are twice as wide).
  const int kRows = spec.dtype == DType::FP32 ? 4 : 8;
  std::vector<Param> params = {{"dz", ParamType::GlobalPtr},           {"partial_max", ParamType::GlobalPtr},
                               {"lse", ParamType::GlobalPtr},          {"target_logit", ParamType::GlobalPtr},
                               {"targets", ParamType::GlobalPtr},      {"valid_count", ParamType::GlobalPtr},
                               {"residual", ParamType::GlobalPtr},     {"n", ParamType::I64},
                               {"ld", ParamType::I64},                 {"ignore_index", ParamType::I64},
                               {"vocab", ParamType::I64},              {"tile_n", ParamType::I64},
                               {"coef", ParamType::GlobalPtr},         {"target_col", ParamType::GlobalPtr},
                               {"target_dz", ParamType::GlobalPtr}};
  if (spec.class_weight) params.push_back({"class_weight", ParamType::GlobalPtr});
  add_shift_param(spec, params);
  KernelBuilder kb(module, "eager_dz", params, kThreads);
  kb.set_min_ctas_per_sm(2);
  auto& ir = kb.ir();
  llvm::Type* elem = elem_type(kb, spec.dtype);
  llvm::Type* stored_type = eager_exponential_type(kb, spec.dtype);  // p̃: fp16 (16-bit dtypes) or fp32
  llvm::Type* stored_vec = llvm::FixedVectorType::get(stored_type, kTokens);
  llvm::Type* vec = llvm::FixedVectorType::get(elem, kTokens);
  Value* n = kb.arg("n");
  Value* ld = kb.arg("ld");
  Value* vocab = kb.arg("vocab");
  Value* tile_n = kb.arg("tile_n");
  Value* tid = kb.tid();
  const bool coef_only = spec.eager_operand;
  const EagerDzGrid grid(coef_only);
  Value* m0 = grid.first_token(kb, tid);
  Value* tile = grid.tile(kb, tid);
  Value* tile_begin = ir.CreateMul(tile, tile_n);
  Value* tile_end = ir.CreateSelect(ir.CreateICmpSLT(ir.CreateAdd(tile_begin, tile_n), vocab),
                                    ir.CreateAdd(tile_begin, tile_n), vocab);
  // This thread's first row in the tile; it steps by the CTA's 8 x kRows rows.
  Value* first_row = ir.CreateZExt(ir.CreateMul(ir.CreateLShr(tid, kb.c32(5)), kb.c32(kRows)), kb.i64());
  // ld is a multiple of 8: a token group is wholly inside or outside [0, ld).
  kb.if_then(ir.CreateAnd(ir.CreateICmpSLT(m0, ld), ir.CreateICmpSLT(tile_begin, vocab)), [&] {
    // du / dz: 1 / T with a temperature (no softcap reaches this path: the spec cannot have one).
    Value* slope = spec.temperature != 1.f ? kb.cf(1.f / spec.temperature) : nullptr;
    // Per token: the coefficient of its non-target elements in this tile and, where its target is
    // in the tile, the target's dz (from the fp32 target logit, not its rounded p̃:
    // p_y = e^(u_y − LSE)) and the residual of its rounding for grad_input (docs/design.md,
    // Numerics), as dlogits_backward does. Only coef, the target's row in the tile (-1: none) and
    // its value stay live into the row loop.
    std::vector<Value*> coef(kTokens), target_row(kTokens), target_dz(kTokens), target_col(kTokens);
    for (int j = 0; j < kTokens; ++j) {
      Value* m = ir.CreateAdd(m0, kb.c64(j));
      const RowConstants row = row_constants(kb, spec, m, n);
      Value* safe_m = ir.CreateSelect(ir.CreateICmpSLT(m, n), m, kb.c64(0));
      Value* max = kb.load(kb.f32(), kb.gep(kb.arg("partial_max"), kb.f32(), ir.CreateAdd(ir.CreateMul(tile, n), safe_m)));
      // p = p̃·e^(M − LSE); every non-target element is coef·p̃, 0 where g is 0.
      Value* scale = kb.exp(ir.CreateFSub(max, row.lse));
      Value* c = dz_row_terms(spec) ? row.p : row.g;
      if (!dz_row_terms(spec))
        if (Value* factor = z_loss_factor(kb, spec, row.lse)) c = ir.CreateFMul(c, factor);
      c = ir.CreateFMul(c, scale);
      if (slope) c = ir.CreateFMul(c, slope);
      coef[j] = ir.CreateSelect(ir.CreateFCmpOEQ(row.g, kb.cf(0.f)), kb.cf(0.f), c);
      Value* hit = ir.CreateAnd(ir.CreateICmpSLT(m, n), ir.CreateAnd(ir.CreateICmpSGE(row.target, tile_begin),
                                                                     ir.CreateICmpSLT(row.target, tile_end)));
      target_row[j] = ir.CreateSelect(hit, ir.CreateTrunc(ir.CreateSub(row.target, tile_begin), kb.i32()), kb.c32(-1));
      if (coef_only) {
        Value* in_vocab = ir.CreateAnd(ir.CreateICmpSLT(m, n), ir.CreateAnd(ir.CreateICmpSGE(row.target, kb.c64(0)),
                                                                         ir.CreateICmpSLT(row.target, vocab)));
        target_col[j] = ir.CreateSelect(in_vocab, ir.CreateTrunc(row.target, kb.i32()), kb.c32(-1));
      }
      // (An ignored token's target may be in range: its dz and residual are 0, as in recompute.
      // A token whose target is elsewhere computes a value it does not use: no branch.)
      Value* u = kb.load(kb.f32(), kb.gep(kb.arg("target_logit"), kb.f32(), safe_m));
      Value* exact = dz_of_softmax(kb, spec, row, kb.exp(ir.CreateFSub(u, row.lse)), u, ir.getTrue(), nullptr, slope);
      target_dz[j] = kb.from_f32(exact, elem);
      // One thread of the CTA's row groups stores the residual (each holds the same value; with
      // coef_only each row group is another tile).
      if (spec.dtype != DType::FP32)
        kb.if_then(coef_only ? hit : ir.CreateAnd(hit, ir.CreateICmpULT(tid, kb.c32(32))), [&] {
          kb.store(ir.CreateFSub(exact, kb.to_f32(target_dz[j])), kb.gep(kb.arg("residual"), kb.f32(), m));
        });
    }
    auto store_constants = [&] {
      Value* coefs = llvm::PoisonValue::get(llvm::FixedVectorType::get(kb.f32(), kTokens));
      Value* cols = llvm::PoisonValue::get(llvm::FixedVectorType::get(kb.i32(), kTokens));
      Value* dzs = llvm::PoisonValue::get(vec);
      for (int j = 0; j < kTokens; ++j) {
        coefs = ir.CreateInsertElement(coefs, coef[j], uint64_t(j));
        dzs = ir.CreateInsertElement(dzs, target_dz[j], uint64_t(j));
      }
      kb.store(coefs, kb.gep(kb.arg("coef"), kb.f32(), ir.CreateAdd(ir.CreateMul(tile, ld), m0)));
      kb.if_then(ir.CreateICmpEQ(tile, kb.c64(0)), [&] {
        for (int j = 0; j < kTokens; ++j) cols = ir.CreateInsertElement(cols, target_col[j], uint64_t(j));
        kb.store(cols, kb.gep(kb.arg("target_col"), kb.i32(), m0));
        kb.store(dzs, kb.gep(kb.arg("target_dz"), elem, m0));
      });
    };
    if (coef_only) {
      store_constants();
      return;
    }
    Value* row_step = kb.c64(kRowGroups * kRows);
    kb.for_range(ir.CreateAdd(tile_begin, first_row), tile_end, row_step, [&](Value* v0) {
      // Every row's vector is loaded before any is stored (a row past the tile reads its last
      // row instead and stores nothing): kRows loads in flight a thread, where a load after each
      // store (which may alias it, for all LLVM can tell) would leave one.
      std::vector<Value*> ptrs(kRows), stored(kRows);
      Value* last_row = ir.CreateSub(tile_end, kb.c64(1));
      for (int i = 0; i < kRows; ++i) {
        Value* v = ir.CreateAdd(v0, kb.c64(i));
        Value* safe_v = ir.CreateSelect(ir.CreateICmpSLT(v, tile_end), v, last_row);
        ptrs[i] = kb.gep(kb.arg("dz"), elem, ir.CreateAdd(ir.CreateMul(safe_v, ld), m0));
        stored[i] = kb.load(stored_vec, ptrs[i]);  // (the same bytes as dz's vector: written in place)
      }
      Value* offset = ir.CreateTrunc(ir.CreateSub(v0, tile_begin), kb.i32());
      for (int i = 0; i < kRows; ++i) {
        Value* out = llvm::PoisonValue::get(vec);
        for (int j = 0; j < kTokens; ++j) {
          Value* p = ir.CreateExtractElement(stored[i], uint64_t(j));
          Value* is_target = ir.CreateICmpEQ(target_row[j], ir.CreateAdd(offset, kb.c32(i)));
          out = ir.CreateInsertElement(
              out, ir.CreateSelect(is_target, target_dz[j], eager_dz_element(kb, coef[j], p, elem)), uint64_t(j));
        }
        kb.if_then(ir.CreateICmpSLT(ir.CreateAdd(v0, kb.c64(i)), tile_end), [&] { kb.store(out, ptrs[i]); });
      }
    });
  });
  kb.finish();
  return {"eager_dz", kThreads, 0, kb.signature()};
}

}  // namespace lfce
