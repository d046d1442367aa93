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

inline llvm::Value* neg_inf(KernelBuilder& kb) {
  return llvm::ConstantFP::getInfinity(kb.f32(), /*Negative=*/true);
}

}  // namespace lfce
