// dz of one logit from its row's constants: dlogits_backward's math, shared with eager mode's
// eager_dz (which forms the same dz from stored exponentials). Per row m: the upstream gradient
// g (0 for ignored tokens and rows past N; 1 in eager mode, applied later), divided for mean
// by the valid count, times dz_scale for fp16; with label smoothing eps or class weights w the
// P/T/U form dz_v = P·p_v − T·[v = y] − U·w_v (templates/kernels/dlogits_backward.cpp's header); with
// the lse rows' gradients (lse_grad) its extra terms. The kernels that call it take the
// parameters it reads by name: targets, ignore_index, lse, valid_count, grad_loss (recompute
// mode), class_weight (with class weights), grad_lse (with lse_grad).
#pragma once

#include "compiler/kernel_builder.h"
#include "compiler/kernel_spec.h"
#include "templates/template_util.h"

namespace lfce {

// Whether dz takes the P/T/U form: the target terms' or the lse rows' gradients need it.
inline bool dz_row_terms(const KernelSpec& spec) { return has_target_terms(spec) || spec.lse_grad; }

// Row m's constants: g, LSE and the target (row 0's LSE and target for rows past N, whose g is 0);
// with target terms also P, T and U (nullptr without label smoothing), g being a.
// With lse_grad also q (the entropy's −g_H·p_v·u_v, or nullptr) and `zero` (the row is past N:
// dz is 0), since g (the cross-entropy's scale) is 0 for an ignored token whose LSE has a gradient.
struct RowConstants {
  llvm::Value *g, *lse, *target;
  llvm::Value *p = nullptr, *t = nullptr, *u = nullptr, *q = nullptr, *zero = nullptr;
};
// U of a row whose cross-entropy scale is a, or nullptr without label smoothing.
inline llvm::Value* smoothing_u(KernelBuilder& kb, const KernelSpec& spec, llvm::Value* a) {
  const float eps = spec.label_smoothing;
  return eps != 0.f ? kb.ir().CreateFMul(a, kb.cf(eps / static_cast<float>(spec.vocab))) : nullptr;
}
inline RowConstants row_constants(KernelBuilder& kb, const KernelSpec& spec, llvm::Value* m, llvm::Value* n) {
  auto& ir = kb.ir();
  using llvm::Value;
  const bool row_terms = dz_row_terms(spec);
  const float eps = spec.label_smoothing;
  // grad_loss is a parameter in recompute mode only (eager mode's upstream gradient is 1).
  Value* grad_loss = spec.mode == Mode::Recompute ? kb.arg("grad_loss") : nullptr;
  Value* in_rows = ir.CreateICmpSLT(m, n);
  Value* safe_m = ir.CreateSelect(in_rows, m, kb.c64(0));
  Value* target = load_target(kb, spec, kb.arg("targets"), safe_m, kb.arg("ignore_index"));
  Value* counted = ir.CreateAnd(in_rows, ir.CreateICmpNE(target, kb.arg("ignore_index")));
  Value* upstream = kb.cf(1.f);
  if (spec.mode == Mode::Recompute) {
    Value* index = spec.reduction == Reduction::None ? safe_m : kb.c64(0);
    upstream = kb.load(kb.f32(), kb.gep(grad_loss, kb.f32(), index));
  }
  // Token scaling: the token's detached p(target), stored by lse_combine after the N LSEs.
  if (spec.token_scaling)
    upstream = ir.CreateFMul(upstream, kb.load(kb.f32(), lse_row_at(kb, kb.arg("lse"), lse_row_scale(spec), n, safe_m)));
  if (row_terms) {
    // a and b (equal without class weights), then T, U and P.
    Value* a = per_valid_token(kb, spec, upstream, kb.arg("valid_count"), spec.class_weight ? 1 : 0);
    Value* b = spec.class_weight ? per_valid_token(kb, spec, upstream, kb.arg("valid_count")) : a;
    Value* scale = dz_scale(kb, spec, grad_loss, kb.arg("valid_count"));  // fp16 (no class weights)
    a = ir.CreateSelect(counted, ir.CreateFMul(a, scale), kb.cf(0.f));
    b = spec.class_weight ? ir.CreateSelect(counted, ir.CreateFMul(b, scale), kb.cf(0.f)) : a;
    Value* lse = kb.load(kb.f32(), kb.gep(kb.arg("lse"), kb.f32(), safe_m));
    Value* t_coef = eps != 0.f ? ir.CreateFMul(a, kb.cf(1.f - eps)) : a;
    if (spec.class_weight) {
      Value* in_range = ir.CreateAnd(ir.CreateICmpSGE(target, kb.c64(0)), ir.CreateICmpSLT(target, kb.c64(spec.vocab)));
      Value* w_y = load_class_weight(kb, spec, ir.CreateSelect(in_range, target, kb.c64(0)));
      t_coef = ir.CreateFMul(t_coef, w_y);
    }
    Value* p_coef = t_coef;
    if (eps != 0.f) {
      // a·eps·W / V: W / V = 1 without class weights.
      Value* share = kb.cf(eps);
      if (spec.class_weight)
        share = ir.CreateFMul(kb.load(kb.f32(), kb.gep(kb.arg("valid_count"), kb.f32(), kb.c64(2))),
                              kb.cf(eps / static_cast<float>(spec.vocab)));
      p_coef = ir.CreateFAdd(p_coef, ir.CreateFMul(a, share));
    }
    if (spec.z_loss_scale != 0.f)
      p_coef = ir.CreateFAdd(p_coef, ir.CreateFMul(b, ir.CreateFMul(kb.cf(2.f * spec.z_loss_scale), lse)));
    RowConstants row{a, lse, target, p_coef, t_coef, smoothing_u(kb, spec, a)};
    if (spec.lse_grad) {
      // The lse rows' upstream gradients (0 past N).
      auto upstream_of = [&](int lse_row) {
        Value* g = kb.load(kb.f32(), lse_row_at(kb, kb.arg("grad_lse"), lse_row, n, safe_m));
        return ir.CreateSelect(in_rows, g, kb.cf(0.f));
      };
      row.p = ir.CreateFAdd(row.p, upstream_of(0));
      if (spec.entropy) {
        Value* g_h = upstream_of(lse_row_entropy(spec));
        Value* h = kb.load(kb.f32(), lse_row_at(kb, kb.arg("lse"), lse_row_entropy(spec), n, safe_m));
        row.p = ir.CreateFAdd(row.p, ir.CreateFMul(g_h, ir.CreateFSub(lse, h)));
        row.q = g_h;
      }
      if (spec.logprob) {
        Value* in_range = ir.CreateAnd(ir.CreateICmpSGE(target, kb.c64(0)), ir.CreateICmpSLT(target, kb.c64(spec.vocab)));
        Value* g_lp = ir.CreateSelect(ir.CreateAnd(counted, in_range), upstream_of(lse_row_logprob(spec)), kb.cf(0.f));
        row.p = ir.CreateFSub(row.p, g_lp);
        row.t = ir.CreateFSub(row.t, g_lp);
      }
      row.zero = ir.CreateNot(in_rows);
    }
    return row;
  }
  upstream = per_valid_token(kb, spec, upstream, kb.arg("valid_count"));
  upstream = ir.CreateFMul(upstream, dz_scale(kb, spec, grad_loss, kb.arg("valid_count")));
  return RowConstants{ir.CreateSelect(counted, upstream, kb.cf(0.f)),
                      kb.load(kb.f32(), kb.gep(kb.arg("lse"), kb.f32(), safe_m)), target};
}

// dz (fp32, not rounded) of an element whose softmax value is p and softmax logit u (read only
// for the entropy's gradient), at the row's target where `hit`, from the row's constants; times
// `slope` (du / dz: softcap and temperature; nullptr for 1); 0 for a row whose g is 0 (ignored,
// padding) even where p is not finite. column_weight: w_v where the row has U and class weights
// (else nullptr: w_v = 1).
inline llvm::Value* dz_of_softmax(KernelBuilder& kb, const KernelSpec& spec, const RowConstants& row, llvm::Value* p,
                                  llvm::Value* u, llvm::Value* hit, llvm::Value* column_weight, llvm::Value* slope) {
  auto& ir = kb.ir();
  llvm::Value* dz = nullptr;
  if (dz_row_terms(spec)) {
    dz = ir.CreateFSub(ir.CreateFMul(row.p, p), ir.CreateSelect(hit, row.t, kb.cf(0.f)));
    if (row.u) dz = ir.CreateFSub(dz, column_weight ? ir.CreateFMul(row.u, column_weight) : row.u);
    if (row.q) dz = ir.CreateFSub(dz, ir.CreateFMul(row.q, ir.CreateFMul(p, u)));
  } else {
    if (llvm::Value* factor = z_loss_factor(kb, spec, row.lse)) p = ir.CreateFMul(p, factor);
    dz = ir.CreateFMul(row.g, ir.CreateFSub(p, ir.CreateSelect(hit, kb.cf(1.f), kb.cf(0.f))));
  }
  if (slope) dz = ir.CreateFMul(dz, slope);
  // g = 0 (ignored or padding rows) gives an exact 0 even where z or LSE is not finite.
  return ir.CreateSelect(row.zero ? row.zero : ir.CreateFCmpOEQ(row.g, kb.cf(0.f)), kb.cf(0.f), dz);
}

}  // namespace lfce
