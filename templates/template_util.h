// Small pieces several templates share: element types and per-row target loads.
#pragma once

#include <utility>

#include "compiler/kernel_builder.h"
#include "compiler/kernel_spec.h"

namespace lfce {

inline llvm::Type* elem_type(KernelBuilder& kb, DType dtype) {
  switch (dtype) {
    case DType::BF16: return kb.ir().getBFloatTy();
    case DType::FP16: return kb.ir().getHalfTy();
    case DType::FP32: return kb.f32();
  }
  return nullptr;
}

// A persistent thread's first index (i64) and its stride: every thread of the grid, one apart.
inline std::pair<llvm::Value*, llvm::Value*> grid_stride(KernelBuilder& kb, int threads) {
  auto& ir = kb.ir();
  llvm::Value* first = ir.CreateAdd(ir.CreateMul(ir.CreateZExt(kb.ctaid(0), kb.i64()), kb.c64(threads)),
                                    ir.CreateZExt(kb.tid(), kb.i64()));
  return {first, ir.CreateMul(ir.CreateZExt(kb.nctaid(0), kb.i64()), kb.c64(threads))};
}

// How eager_logits stores p̃ = e^(u − tile max) in the dzᵀ workspace for eager_dz: fp16 for the
// 16-bit dtypes (p̃ is in (0, 1], where fp16 has 11 bits to bf16's 8), fp32 for fp32.
inline llvm::Type* eager_exponential_type(KernelBuilder& kb, DType dtype) {
  return dtype == DType::FP32 ? kb.f32() : kb.ir().getHalfTy();
}

// A non-target element of eager's dz from its stored exponential p̃ and its row constant: coef·p̃ in
// fp32, rounded once to `elem`. eager_dz's pass and grad_weight's fix-up (templates/epilogue/eager_fixup.h)
// both form it here, so they write the same bits.
inline llvm::Value* eager_dz_element(KernelBuilder& kb, llvm::Value* coef, llvm::Value* stored, llvm::Type* elem) {
  return kb.from_f32(kb.ir().CreateFMul(coef, kb.to_f32(stored)), elem);
}

// The run-time argument load_target reads with a causal shift, sequence_length, after the
// template's own parameters (the runtime binds it by name: runtime/kernel_args.h).
inline void add_shift_param(const KernelSpec& spec, std::vector<Param>& params) {
  if (spec.shift) params.push_back({"sequence_length", ParamType::I64});
}

// Row `row`'s target (an in-range row) as i64, whatever the stored index type: targets[row], or
// with the spec's causal shift targets[row + 1], and `absent` (a value the caller treats as no
// target) for the last row of each sequence, where row + 1 is a multiple of the kernel's
// `sequence_length` T. That test is a 32-bit remainder (rows < 2^31): a 64-bit one is a
// subroutine call in SASS. The load stays in bounds (row itself at a sequence's end).
inline llvm::Value* load_target(KernelBuilder& kb, const KernelSpec& spec, llvm::Value* targets, llvm::Value* row,
                                llvm::Value* absent) {
  auto& ir = kb.ir();
  llvm::Type* t = spec.targets == IndexType::I64 ? kb.i64() : kb.i32();
  llvm::Value* end = nullptr;
  if (spec.shift) {
    llvm::Value* next = ir.CreateAdd(row, kb.c64(1));
    llvm::Value* length = ir.CreateTrunc(kb.arg("sequence_length"), kb.i32());
    end = ir.CreateICmpEQ(ir.CreateURem(ir.CreateTrunc(next, kb.i32()), length), kb.c32(0));
    row = ir.CreateSelect(end, row, next);
  }
  llvm::Value* v = kb.load(t, kb.gep(targets, t, row));
  if (spec.targets != IndexType::I64) v = ir.CreateSExt(v, kb.i64());
  return end ? ir.CreateSelect(end, absent, v) : v;
}

// bias[v] as f32, or 0 when the spec has no bias.
inline llvm::Value* load_bias(KernelBuilder& kb, const KernelSpec& spec, llvm::Value* bias, llvm::Value* v) {
  if (!spec.bias) return kb.cf(0.f);
  llvm::Type* e = elem_type(kb, spec.dtype);
  return kb.to_f32(kb.load(e, kb.gep(bias, e, v)));
}

// z + b, or z itself without a bias (adding 0.0 is not a no-op in IEEE arithmetic, so LLVM keeps it).
inline llvm::Value* add_bias(KernelBuilder& kb, const KernelSpec& spec, llvm::Value* z, llvm::Value* bias) {
  return spec.bias ? kb.ir().CreateFAdd(z, bias) : z;
}

// The logit the softmax sees: c·tanh(z / c) with the spec's softcap c (Gemma 2), then divided by
// the temperature T (the cap applies to the model's own logit, as Gemma 2 defines it; sampling
// and RL recipes divide what the model returns); z itself (no code) with neither.
// tanh(x) = sign(x)·(1 − 2 / (e^{2|x|} + 1)): ex2.approx and div.full, no subroutine call
// (which would serialise a wgmma kernel), absolute error a few fp32 ulps; tanh.approx.f32's
// 2^-11 relative error would show in the loss. T enters as one multiplication by c / T (by 1 / T
// without a cap).
struct CappedLogit {
  llvm::Value* u;      // the softmax's logit
  llvm::Value* slope;  // du / dz, or nullptr (1, no code) with neither a cap nor a temperature
};
// u and du / dz = (1 − tanh²(z / c)) / T. The cap's slope is s·(2 − s) with s = 2 / (e^{2|x|} + 1)
// (= (1 − |tanh|)(1 + |tanh|)), from the same s as tanh: 1 − tanh² taken from the rounded tanh
// would lose the slope's relative precision where |tanh| nears 1 (large |z| / c).
inline CappedLogit capped_logit_with_slope(KernelBuilder& kb, const KernelSpec& spec, llvm::Value* z) {
  auto& ir = kb.ir();
  const float inverse_t = 1.f / spec.temperature;
  if (spec.softcap == 0.f) {
    if (spec.temperature == 1.f) return {z, nullptr};
    return {ir.CreateFMul(z, kb.cf(inverse_t)), kb.cf(inverse_t)};
  }
  llvm::Value* x = ir.CreateFMul(z, kb.cf(1.f / spec.softcap));
  llvm::Value* ax = ir.CreateIntrinsic(llvm::Intrinsic::fabs, {kb.f32()}, {x});
  llvm::Value* e = kb.exp(ir.CreateFMul(ax, kb.cf(2.f)));
  llvm::Value* s = kb.div_full(kb.cf(2.f), ir.CreateFAdd(e, kb.cf(1.f)));
  llvm::Value* t = ir.CreateIntrinsic(llvm::Intrinsic::copysign, {kb.f32()}, {ir.CreateFSub(kb.cf(1.f), s), x});
  llvm::Value* u = ir.CreateFMul(t, kb.cf(spec.temperature == 1.f ? spec.softcap : spec.softcap * inverse_t));
  llvm::Value* slope = ir.CreateFMul(s, ir.CreateFSub(kb.cf(2.f), s));
  return {u, spec.temperature == 1.f ? slope : ir.CreateFMul(slope, kb.cf(inverse_t))};
}
inline llvm::Value* capped_logit(KernelBuilder& kb, const KernelSpec& spec, llvm::Value* z) {
  return capped_logit_with_slope(kb, spec, z).u;
}

// The z-loss (PaLM; Liger-Kernel's lse_square_scale) of a token whose LSE is `lse`: s·LSE², or
// nullptr (no code) when the spec's z_loss_scale s is 0. LSE is the one of the logits the
// softmax sees (after softcap and temperature).
inline llvm::Value* z_loss_term(KernelBuilder& kb, const KernelSpec& spec, llvm::Value* lse) {
  if (spec.z_loss_scale == 0.f) return nullptr;
  auto& ir = kb.ir();
  return ir.CreateFMul(kb.cf(spec.z_loss_scale), ir.CreateFMul(lse, lse));
}
// Its gradient joins the softmax's: d(s·LSE²)/du_v = 2s·LSE·p_v, so dz = g·(p·(1 + 2s·LSE) −
// onehot) (times the slope). The row's factor 1 + 2s·LSE, or nullptr (no code) without z-loss.
inline llvm::Value* z_loss_factor(KernelBuilder& kb, const KernelSpec& spec, llvm::Value* lse) {
  if (spec.z_loss_scale == 0.f) return nullptr;
  auto& ir = kb.ir();
  return ir.CreateFAdd(kb.cf(1.f), ir.CreateFMul(kb.cf(2.f * spec.z_loss_scale), lse));
}

// Label smoothing eps and class weights w (PyTorch's cross_entropy): a counted token's
// cross-entropy term is (1 − eps)·w_y·(LSE − u_y) + eps / V · Σ_v w_v·(LSE − u_v) (w = 1 without
// class weights), so dz_v = P·p_v − T·[v = y] − U·w_v with the row constants of
// dlogits_backward. True when the spec has either option.
inline bool has_target_terms(const KernelSpec& spec) { return spec.label_smoothing != 0.f || spec.class_weight; }
// class_weight[v] (fp32, the kernel's parameter "class_weight"), or 1 without class weights.
inline llvm::Value* load_class_weight(KernelBuilder& kb, const KernelSpec& spec, llvm::Value* v) {
  if (!spec.class_weight) return kb.cf(1.f);
  return kb.load(kb.f32(), kb.gep(kb.arg("class_weight"), kb.f32(), v));
}

// The entropy's online statistic beside the softmax's (max m, s = Σ e^(u − m)): t = Σ e^(u − m)·(u − m),
// so that H = ln s − t / s (no cancellation between LSE and Σ p·u). Two sets' t at their merged
// max (`safe`: that max, or 0 where it is −inf): each rescaled by e^(m_i − safe) and shifted by
// (m_i − safe)·s_i; a set with s = 0 (no logits, m = −inf) adds 0.
inline llvm::Value* merged_entropy(KernelBuilder& kb, llvm::Value* safe, llvm::Value* m_a, llvm::Value* s_a,
                                   llvm::Value* t_a, llvm::Value* m_b, llvm::Value* s_b, llvm::Value* t_b) {
  auto& ir = kb.ir();
  auto term = [&](llvm::Value* m, llvm::Value* s, llvm::Value* t) {
    llvm::Value* shift = ir.CreateFSub(m, safe);
    llvm::Value* value = ir.CreateFMul(kb.exp(shift), kb.fma(shift, s, t));
    return ir.CreateSelect(ir.CreateFCmpOGT(s, kb.cf(0.f)), value, kb.cf(0.f));
  };
  return ir.CreateFAdd(term(m_a, s_a, t_a), term(m_b, s_b, t_b));
}
// The argmax of two sets whose maxima are m_a and m_b at indices i_a and i_b (i32): the larger
// one's, the lower index of equal ones (so every merge order gives the first maximum).
inline llvm::Value* merged_argmax(KernelBuilder& kb, llvm::Value* m_a, llvm::Value* i_a, llvm::Value* m_b,
                                  llvm::Value* i_b) {
  auto& ir = kb.ir();
  llvm::Value* lower = ir.CreateSelect(ir.CreateICmpSLT(i_a, i_b), i_a, i_b);
  return ir.CreateSelect(ir.CreateFCmpOGT(m_b, m_a), i_b, ir.CreateSelect(ir.CreateFCmpOGT(m_a, m_b), i_a, lower));
}

// The rows of the forward's lse buffer (lfce.h): the N LSEs, then, where the spec has them, the
// token scales, the entropies and the logprobs, N each. The row index of each, and its element m.
inline int lse_row_scale(const KernelSpec&) { return 1; }
inline int lse_row_entropy(const KernelSpec& spec) { return 1 + (spec.token_scaling ? 1 : 0); }
inline int lse_row_logprob(const KernelSpec& spec) { return lse_row_entropy(spec) + (spec.entropy ? 1 : 0); }
inline llvm::Value* lse_row_at(KernelBuilder& kb, llvm::Value* lse, int row, llvm::Value* n, llvm::Value* m) {
  auto& ir = kb.ir();
  llvm::Value* index = row == 0 ? m : ir.CreateAdd(row == 1 ? n : ir.CreateMul(n, kb.c64(row)), m);
  return kb.gep(lse, kb.f32(), index);
}

// The power of two that dz is multiplied by before it is rounded to the dtype, and divided by
// (exactly) in the fp32 epilogues of the kernels that consume it (grad_weight, grad_input,
// grad_bias). fp16's smallest normal is 6.1e-5: with mean reduction dz = g·p with g = 1/N
// and p ~ 1/V, so at N = 8192 most of dz would flush to zero. The scale brings the scalar
// part of g, G = grad_loss[0] / count (mean) or grad_loss[0] (sum; 1 in eager mode), to
// [2^14, 2^15): |dz·scale| ≤ |G·scale| < 2^15 stays below fp16's 65504. Every kernel derives
// it from the same two device values, so no host synchronisation is needed. bf16 has fp32's
// exponent range and fp32 is never rounded: both use 1. Reduction "none" has a per-token g
// whose largest value is unknown here: 1 as well.
// g divided by the valid count for mean reduction, with div.full.f32 (2 ulp): the IEEE division
// is a subroutine call in SASS, and a call anywhere in a kernel makes the driver's JIT
// serialise its wgmma instructions (H200, driver 580). Every kernel computes it the same way.
// index: which of valid_count's denominators (0 the count; 1 the targets' summed class weights).
inline llvm::Value* per_valid_token(KernelBuilder& kb, const KernelSpec& spec, llvm::Value* g,
                                    llvm::Value* valid_count, int index = 0) {
  if (spec.reduction != Reduction::Mean) return g;
  llvm::Value* count = index == 0 ? valid_count : kb.gep(valid_count, kb.f32(), kb.c64(index));
  return kb.div_full(g, kb.load(kb.f32(), count));
}

// dz_scale and its reciprocal (both exact powers of two, from the same bits), or 1 and 1.
inline std::pair<llvm::Value*, llvm::Value*> dz_scale_pair(KernelBuilder& kb, const KernelSpec& spec,
                                                           llvm::Value* grad_loss, llvm::Value* valid_count) {
  if (spec.dtype != DType::FP16 || spec.reduction == Reduction::None) return {kb.cf(1.f), kb.cf(1.f)};
  auto& ir = kb.ir();
  llvm::Value* g = spec.mode == Mode::Recompute ? kb.load(kb.f32(), grad_loss) : kb.cf(1.f);
  g = per_valid_token(kb, spec, g, valid_count);
  // 2^floor(log2 |g|) from the exponent bits; scale = 2^14 / that = 2^14 · 2^-e, exact (a
  // product of powers of two, built from exponent bits: no division). A zero, subnormal,
  // infinite or NaN g (no valid token, a zero upstream gradient), or one whose scale or
  // unscale would leave fp32's normal range, keeps scale 1.
  llvm::Value* exponent_bits = ir.CreateAnd(ir.CreateBitCast(g, kb.i32()), kb.c32(0x7f800000));
  llvm::Value* biased = ir.CreateLShr(exponent_bits, kb.c32(23));  // e + 127
  // 2^(14 - e): biased exponent 127 + 14 - e = 268 - biased; 2^(e - 14): biased - 14.
  llvm::Value* scale_biased = ir.CreateSub(kb.c32(268), biased);
  llvm::Value* unscale_biased = ir.CreateSub(biased, kb.c32(14));
  auto in_range = [&](llvm::Value* b) {
    return ir.CreateAnd(ir.CreateICmpSGE(b, kb.c32(1)), ir.CreateICmpSLE(b, kb.c32(254)));
  };
  llvm::Value* normal = ir.CreateAnd(ir.CreateICmpNE(exponent_bits, kb.c32(0)),
                                     ir.CreateICmpNE(exponent_bits, kb.c32(0x7f800000)));
  llvm::Value* usable = ir.CreateAnd(normal, ir.CreateAnd(in_range(scale_biased), in_range(unscale_biased)));
  auto power = [&](llvm::Value* b) { return ir.CreateBitCast(ir.CreateShl(b, kb.c32(23)), kb.f32()); };
  return {ir.CreateSelect(usable, power(scale_biased), kb.cf(1.f)),
          ir.CreateSelect(usable, power(unscale_biased), kb.cf(1.f))};
}

inline llvm::Value* dz_scale(KernelBuilder& kb, const KernelSpec& spec, llvm::Value* grad_loss,
                             llvm::Value* valid_count) {
  return dz_scale_pair(kb, spec, grad_loss, valid_count).first;
}
// What the consumers of dz multiply by to divide dz_scale out, exactly.
inline llvm::Value* dz_unscale(KernelBuilder& kb, const KernelSpec& spec, llvm::Value* grad_loss,
                               llvm::Value* valid_count) {
  return dz_scale_pair(kb, spec, grad_loss, valid_count).second;
}

// Two adjacent fp32 values (a fragment's columns 2i and 2i + 1) rounded to `elem` and stored
// as one vector: `ptr` (to the first) must be aligned to twice the element size.
inline void store_pair(KernelBuilder& kb, llvm::Value* a, llvm::Value* b, llvm::Type* elem, llvm::Value* ptr) {
  auto& ir = kb.ir();
  llvm::Value* pair = llvm::PoisonValue::get(llvm::FixedVectorType::get(elem, 2));
  pair = ir.CreateInsertElement(pair, kb.from_f32(a, elem), uint64_t{0});
  pair = ir.CreateInsertElement(pair, kb.from_f32(b, elem), uint64_t{1});
  kb.store(pair, ptr);
}
// The two fp32 values at `ptr` (8-byte aligned), loaded as one vector.
inline std::pair<llvm::Value*, llvm::Value*> load_pair_f32(KernelBuilder& kb, llvm::Value* ptr) {
  auto& ir = kb.ir();
  llvm::Value* pair = kb.load(llvm::FixedVectorType::get(kb.f32(), 2), ptr);
  return {ir.CreateExtractElement(pair, uint64_t{0}), ir.CreateExtractElement(pair, uint64_t{1})};
}

inline llvm::Value* neg_inf(KernelBuilder& kb) {
  return llvm::ConstantFP::getInfinity(kb.f32(), /*Negative=*/true);
}

}  // namespace lfce
