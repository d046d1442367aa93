// eager_dz: eager mode's fix-up between its first GEMM and the two gradient GEMMs. eager_logits
// left p̃ = e^(u − M) (fp16 for 16-bit dtypes, fp32 for fp32) in the dzᵀ workspace [V, ld] (M: the
// row's max over the vocabulary tile of
// `tile_n` columns that holds v, partial_max [tiles, C]); with the LSE from lse_combine,
//   p = p̃·e^(M − LSE),   dz = (dlogits_backward's formula of p, templates/dz_math.h)
// is written over it in place, rounded to the dtype, with an upstream gradient of 1 (eager mode:
// the autograd backward scales the gradients), divided for mean by the valid count (token_count
// ran first), fp16's dz_scale, the temperature's 1 / T, the z-loss factor, class weights and
// token scaling as in recompute mode. Rows in [C, ld) become 0.
//
// The row's target element is formed from the fp32 target logit u_y (eager_logits), not from
// its rounded p̃: p_y = e^(u_y − LSE), and what rounding its dz loses goes to residual[m] for
// grad_input (docs/design.md, Numerics), as dlogits_backward does. Every other element is
// C_m·p̃ with one per-row constant C_m, one multiplication.
//
// Each thread takes 8 tokens (one 16-byte vector of 16-bit elements) of 8 consecutive rows of
// one vocabulary tile: grid (ceil(ld / 256), ceil(V / 64)), 256 threads (32 token groups x 8
// row groups).
#include "templates/dz_math.h"
#include "templates/template_util.h"
#include "templates/templates.h"

namespace lfce {

using llvm::Value;

KernelShape build_eager_dz(llvm::Module& module, const KernelSpec& normalised) {
  // The mode is not part of the spec (always eager: upstream gradient 1, no grad_loss).
  KernelSpec spec = normalised;
  spec.mode = Mode::Eager;
  constexpr int kThreads = 256, kTokens = 8, kRows = 8;
  std::vector<Param> params = {{"dz", ParamType::GlobalPtr},           {"partial_max", ParamType::GlobalPtr},
                               {"lse", ParamType::GlobalPtr},          {"target_logit", ParamType::GlobalPtr},
                               {"targets", ParamType::GlobalPtr},      {"valid_count", ParamType::GlobalPtr},
                               {"residual", ParamType::GlobalPtr},     {"n", ParamType::I64},
                               {"ld", ParamType::I64},                 {"ignore_index", ParamType::I64},
                               {"vocab", ParamType::I64},              {"tile_n", ParamType::I64}};
  if (spec.class_weight) params.push_back({"class_weight", ParamType::GlobalPtr});
  add_shift_param(spec, params);
  KernelBuilder kb(module, "eager_dz", params, kThreads);
  auto& ir = kb.ir();
  llvm::Type* elem = elem_type(kb, spec.dtype);
  llvm::Type* stored_type = eager_exponential_type(kb, spec.dtype);  // p̃: fp16 (16-bit dtypes) or fp32
  llvm::Type* stored_vec = llvm::FixedVectorType::get(stored_type, kTokens);
  llvm::Type* vec = llvm::FixedVectorType::get(elem, kTokens);
  Value* n = kb.arg("n");
  Value* ld = kb.arg("ld");
  Value* tid = kb.tid();
  Value* m0 = ir.CreateMul(ir.CreateAdd(ir.CreateMul(ir.CreateZExt(kb.ctaid(0), kb.i64()), kb.c64(32)),
                                        ir.CreateZExt(ir.CreateAnd(tid, kb.c32(31)), kb.i64())),
                           kb.c64(kTokens));
  Value* v0 = ir.CreateAdd(ir.CreateMul(ir.CreateZExt(kb.ctaid(1), kb.i64()), kb.c64(64)),
                           ir.CreateZExt(ir.CreateMul(ir.CreateLShr(tid, kb.c32(5)), kb.c32(kRows)), kb.i64()));
  Value* vocab = kb.arg("vocab");
  // ld is a multiple of 8: a token group is wholly inside or outside [0, ld).
  kb.if_then(ir.CreateAnd(ir.CreateICmpSLT(m0, ld), ir.CreateICmpSLT(v0, vocab)), [&] {
    // The rows' vocabulary tile (tile_n is a multiple of 8, so all 8 rows share it).
    Value* tile = ir.CreateUDiv(v0, kb.arg("tile_n"));
    // du / dz: 1 / T with a temperature (no softcap reaches this path: the spec cannot have one).
    Value* slope = spec.temperature != 1.f ? kb.cf(1.f / spec.temperature) : nullptr;
    std::vector<RowConstants> row(kTokens);
    std::vector<Value*> coef(kTokens), m(kTokens);
    for (int j = 0; j < kTokens; ++j) {
      m[j] = ir.CreateAdd(m0, kb.c64(j));
      row[j] = row_constants(kb, spec, m[j], n);
      Value* safe_m = ir.CreateSelect(ir.CreateICmpSLT(m[j], n), m[j], kb.c64(0));
      Value* max = kb.load(kb.f32(), kb.gep(kb.arg("partial_max"), kb.f32(), ir.CreateAdd(ir.CreateMul(tile, n), safe_m)));
      // p = p̃·e^(M − LSE); every non-target element is coef·p̃, 0 where g is 0.
      Value* scale = kb.exp(ir.CreateFSub(max, row[j].lse));
      Value* c = dz_row_terms(spec) ? row[j].p : row[j].g;
      if (!dz_row_terms(spec))
        if (Value* factor = z_loss_factor(kb, spec, row[j].lse)) c = ir.CreateFMul(c, factor);
      c = ir.CreateFMul(c, scale);
      if (slope) c = ir.CreateFMul(c, slope);
      coef[j] = ir.CreateSelect(ir.CreateFCmpOEQ(row[j].g, kb.cf(0.f)), kb.cf(0.f), c);
    }
    for (int i = 0; i < kRows; ++i) {
      Value* v = ir.CreateAdd(v0, kb.c64(i));
      kb.if_then(ir.CreateICmpSLT(v, vocab), [&] {
        Value* ptr = kb.gep(kb.arg("dz"), elem, ir.CreateAdd(ir.CreateMul(v, ld), m0));
        Value* stored = kb.load(stored_vec, ptr);  // (the same bytes as dz's vector: written in place)
        Value* out = llvm::PoisonValue::get(vec);
        for (int j = 0; j < kTokens; ++j) {
          Value* p = kb.to_f32(ir.CreateExtractElement(stored, uint64_t(j)));
          out = ir.CreateInsertElement(out, kb.from_f32(ir.CreateFMul(coef[j], p), elem), uint64_t(j));
        }
        kb.store(out, ptr);
      });
    }
    // The targets among these rows: dz from the fp32 target logit (the vector stores above are
    // this thread's own, earlier in program order), and the residual of its rounding.
    for (int j = 0; j < kTokens; ++j) {
      Value* rel = ir.CreateSub(row[j].target, v0);
      Value* hit = ir.CreateAnd(ir.CreateICmpSLT(m[j], n),
                                ir.CreateAnd(ir.CreateICmpSGE(rel, kb.c64(0)),
                                             ir.CreateAnd(ir.CreateICmpSLT(rel, kb.c64(kRows)),
                                                          ir.CreateICmpSLT(row[j].target, vocab))));
      kb.if_then(hit, [&] {
        Value* u = kb.load(kb.f32(), kb.gep(kb.arg("target_logit"), kb.f32(), m[j]));
        Value* p = kb.exp(ir.CreateFSub(u, row[j].lse));
        // (An ignored token's target may be in range: its dz and residual are 0, as in recompute.)
        Value* exact = dz_of_softmax(kb, spec, row[j], p, u, ir.getTrue(), nullptr, slope);
        Value* rounded = kb.from_f32(exact, elem);
        kb.store(rounded, kb.gep(kb.arg("dz"), elem, ir.CreateAdd(ir.CreateMul(row[j].target, ld), m[j])));
        if (spec.dtype != DType::FP32)
          kb.store(ir.CreateFSub(exact, kb.to_f32(rounded)), kb.gep(kb.arg("residual"), kb.f32(), m[j]));
      });
    }
  });
  kb.finish();
  return {"eager_dz", kThreads, 0};
}

}  // namespace lfce
