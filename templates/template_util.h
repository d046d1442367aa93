// Small pieces several templates share: element types and per-row target loads.
#pragma once

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

// targets[row] (i64 index) as i64, whatever the stored index type.
inline llvm::Value* load_target(KernelBuilder& kb, const KernelSpec& spec, llvm::Value* targets,
                                llvm::Value* row) {
  llvm::Type* t = spec.targets == IndexType::I64 ? kb.i64() : kb.i32();
  llvm::Value* v = kb.load(t, kb.gep(targets, t, row));
  return spec.targets == IndexType::I64 ? v : kb.ir().CreateSExt(v, kb.i64());
}

// bias[v] as f32, or 0 when the spec has no bias.
inline llvm::Value* load_bias(KernelBuilder& kb, const KernelSpec& spec, llvm::Value* bias, llvm::Value* v) {
  if (!spec.bias) return kb.cf(0.f);
  llvm::Type* e = elem_type(kb, spec.dtype);
  return kb.to_f32(kb.load(e, kb.gep(bias, e, v)));
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
inline llvm::Value* dz_scale(KernelBuilder& kb, const KernelSpec& spec, llvm::Value* grad_loss,
                             llvm::Value* valid_count) {
  if (spec.dtype != DType::FP16 || spec.reduction == Reduction::None) return kb.cf(1.f);
  auto& ir = kb.ir();
  llvm::Value* g = spec.mode == Mode::Recompute ? kb.load(kb.f32(), grad_loss) : kb.cf(1.f);
  if (spec.reduction == Reduction::Mean) g = ir.CreateFDiv(g, kb.load(kb.f32(), valid_count));
  // 2^floor(log2 |g|) from the exponent bits; scale = 2^14 / that, exact. A zero, subnormal,
  // infinite or NaN g (no valid token, a zero upstream gradient) keeps scale 1.
  llvm::Value* exponent_bits = ir.CreateAnd(ir.CreateBitCast(g, kb.i32()), kb.c32(0x7f800000));
  llvm::Value* normal = ir.CreateAnd(ir.CreateICmpNE(exponent_bits, kb.c32(0)),
                                     ir.CreateICmpNE(exponent_bits, kb.c32(0x7f800000)));
  llvm::Value* scale = ir.CreateFDiv(kb.cf(16384.f), ir.CreateBitCast(exponent_bits, kb.f32()));
  llvm::Value* finite = ir.CreateFCmpONE(scale, llvm::ConstantFP::getInfinity(kb.f32()));
  llvm::Value* usable = ir.CreateAnd(normal, ir.CreateAnd(finite, ir.CreateFCmpOGT(scale, kb.cf(0.f))));
  return ir.CreateSelect(usable, scale, kb.cf(1.f));
}

inline llvm::Value* neg_inf(KernelBuilder& kb) {
  return llvm::ConstantFP::getInfinity(kb.f32(), /*Negative=*/true);
}

}  // namespace lfce
