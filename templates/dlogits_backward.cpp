// dlogits_backward: recomputes one vocabulary chunk's logits tile z = x·W[chunk]ᵀ (+ b) and
// writes dz = g_i · (softmax(z_i) − onehot(y_i)) = g_i · (exp(z − LSE_i) − [v = y_i]) to the
// chunk workspace, stored transposed as dzᵀ [chunk, ld] (tokens contiguous) for the two GEMMs
// that consume it. The softmax is taken in fp32 registers; only dz is rounded to the dtype.
//
// g_i: 0 for ignored tokens; otherwise the upstream gradient (grad_loss[0] for mean/sum,
// grad_loss[i] for none; 1 in eager mode, where it is applied later), divided by the valid
// count for mean; for fp16 times dz_scale (template_util.h), which the consumers divide out.
// Rows i in [N, ld) are written as zeros: the consuming GEMMs read them.
#include "templates/gemm_skeleton.h"
#include "templates/template_util.h"
#include "templates/templates.h"

namespace lfce {

using llvm::Value;

KernelShape build_dlogits_backward(llvm::Module& module, const KernelSpec& spec) {
  const TileConfig& t = spec.tile;
  KernelBuilder kb(module, "dlogits_backward",
                   gemm_params(t, {{"x", ParamType::GlobalPtr}, {"w", ParamType::GlobalPtr}, {"bias", ParamType::GlobalPtr},
                    {"targets", ParamType::GlobalPtr}, {"lse", ParamType::GlobalPtr},
                    {"grad_loss", ParamType::GlobalPtr}, {"valid_count", ParamType::GlobalPtr},
                    {"n", ParamType::I64}, {"ignore_index", ParamType::I64}, {"v_begin", ParamType::I64},
                    {"v_len", ParamType::I64}, {"ld", ParamType::I64}, {"dz", ParamType::GlobalPtr}}),
                   t.threads());
  auto& ir = kb.ir();
  llvm::Type* elem = elem_type(kb, spec.dtype);
  GemmSkeleton gemm(kb, spec, Layout::KMajor, Layout::KMajor);
  const int extra = gemm.extra_offset();
  const int lse_off = extra, g_off = extra + 4 * t.bm, tgt_off = extra + 8 * t.bm;
  auto row_slot = [&](int base, Value* r, int bytes) {
    return kb.smem(ir.CreateAdd(kb.c32(base), ir.CreateMul(r, kb.c32(bytes))));
  };

  Value* n = kb.arg("n");
  Value* hidden = kb.c64(spec.hidden);
  const int row_align = hidden_row_align(spec.hidden, spec.dtype);  // rows of H elements
  Value* v_begin = kb.arg("v_begin");
  Value* v_len = kb.arg("v_len");
  Value* ld = kb.arg("ld");
  Value *m0, *n0;
  std::tie(m0, n0) = gemm.tile_origin();
  Value* tid = kb.tid();

  // Per-row constants of this tile: LSE, g and the target, read once.
  kb.if_then(ir.CreateICmpULT(tid, kb.c32(t.bm)), [&] {
    Value* m = ir.CreateAdd(m0, ir.CreateZExt(tid, kb.i64()));
    Value* in_rows = ir.CreateICmpSLT(m, n);
    Value* safe_m = ir.CreateSelect(in_rows, m, kb.c64(0));
    Value* target = load_target(kb, spec, kb.arg("targets"), safe_m);
    Value* counted = ir.CreateAnd(in_rows, ir.CreateICmpNE(target, kb.arg("ignore_index")));
    Value* upstream = kb.cf(1.f);
    if (spec.mode == Mode::Recompute) {
      Value* index = spec.reduction == Reduction::None ? safe_m : kb.c64(0);
      upstream = kb.load(kb.f32(), kb.gep(kb.arg("grad_loss"), kb.f32(), index));
    }
    if (spec.reduction == Reduction::Mean)
      upstream = ir.CreateFDiv(upstream, kb.load(kb.f32(), kb.arg("valid_count")));
    upstream = ir.CreateFMul(upstream, dz_scale(kb, spec, kb.arg("grad_loss"), kb.arg("valid_count")));
    kb.store(ir.CreateSelect(counted, upstream, kb.cf(0.f)), row_slot(g_off, tid, 4));
    kb.store(kb.load(kb.f32(), kb.gep(kb.arg("lse"), kb.f32(), safe_m)), row_slot(lse_off, tid, 4));
    kb.store(target, row_slot(tgt_off, tid, 8));
  });

  GemmOperand x{kb.arg("x"), hidden, Layout::KMajor, n, hidden, row_align};
  Value* w_chunk = kb.gep(kb.arg("w"), elem, ir.CreateMul(v_begin, hidden));
  GemmOperand w{w_chunk, hidden, Layout::KMajor, v_len, hidden, row_align};
  gemm.compute_tile(x, w, m0, n0, gemm.k_tiles_for(hidden));

  // Rows fastest: consecutive threads write consecutive tokens of one dzᵀ row.
  gemm.for_each_element(/*rows_fastest=*/true, [&](Value* r, Value* c) {
    Value* m = ir.CreateAdd(m0, ir.CreateZExt(r, kb.i64()));
    Value* v = ir.CreateAdd(n0, ir.CreateZExt(c, kb.i64()));
    kb.if_then(ir.CreateAnd(ir.CreateICmpSLT(m, ld), ir.CreateICmpSLT(v, v_len)), [&] {
      Value* g = kb.load(kb.f32(), row_slot(g_off, r, 4));
      Value* vocab_index = ir.CreateAdd(v_begin, v);
      Value* z = ir.CreateFAdd(kb.load(kb.f32(), gemm.staged(r, c)), load_bias(kb, spec, kb.arg("bias"), vocab_index));
      Value* p = kb.exp(ir.CreateFSub(z, kb.load(kb.f32(), row_slot(lse_off, r, 4))));
      Value* hit = ir.CreateICmpEQ(kb.load(kb.i64(), row_slot(tgt_off, r, 8)), vocab_index);
      Value* dz = ir.CreateFMul(g, ir.CreateFSub(p, ir.CreateSelect(hit, kb.cf(1.f), kb.cf(0.f))));
      // g = 0 (ignored or padding rows) gives an exact 0 even where z or LSE is not finite.
      dz = ir.CreateSelect(ir.CreateFCmpOEQ(g, kb.cf(0.f)), kb.cf(0.f), dz);
      Value* index = ir.CreateAdd(ir.CreateMul(v, ld), m);
      kb.store(kb.from_f32(dz, elem), kb.gep(kb.arg("dz"), elem, index));
    });
  });
  kb.finish();
  return {"dlogits_backward", t.threads(), gemm.smem_bytes(16 * t.bm)};
}

}  // namespace lfce
