// Eager mode's dz, formed where the gradient GEMMs read it (KernelSpec::eager_operand): grad_weight
// and grad_input take eager_logits' stored exponentials p̃ (fp16, the dzᵀ workspace [V, ld]) as
// operand A, and the pipeline's rewriting warps turn each slice of it into dz in shared memory
// before the wgmma reads it (OperandRewrite, templates/wgmma_pipeline.cpp), with the constants
// eager_dz stored in its eager_operand form:
//   dz[v, m] = target_dz[m]                          where v = target_col[m],
//              coef[v / tile_n, m] · p̃[v, m]          otherwise, rounded to the dtype (pairs
//                                                     converted together, each rounded alike),
// the same operations as eager_dz's own rewrite of the workspace, so the same bits, without its
// pass over the [V, ld] workspace (a read and a write of 2·V·ld bytes). In both GEMMs a slice's
// rows are vocabulary entries and its 16-byte chunks 8 consecutive tokens (A = dzᵀ is K-major in
// grad_weight, MN-major in grad_input), and a slice's rows lie in one eager_logits tile
// (Plan::eager_operand: tile_n a multiple of BK and of grad_weight's BM).
#pragma once

#include <optional>
#include <utility>
#include <vector>

#include <llvm/IR/IntrinsicsNVPTX.h>

#include "compiler/kernel_builder.h"
#include "compiler/kernel_spec.h"
#include "templates/gemm_skeleton.h"
#include "templates/template_util.h"

namespace lfce {

// The rewrite's kernel parameters, after the template's own.
inline void add_eager_operand_params(const KernelSpec& spec, std::vector<Param>& params) {
  if (!spec.eager_operand) return;
  params.push_back({"coef", ParamType::GlobalPtr});
  params.push_back({"target_col", ParamType::GlobalPtr});
  params.push_back({"target_dz", ParamType::GlobalPtr});
  params.push_back({"tile_n", ParamType::I64});
}

// `ld`: the workspace's token stride (i64, a multiple of 8). Only for a spec with eager_operand.
inline OperandRewrite eager_operand_rewrite(KernelBuilder& kb, const KernelSpec& spec, llvm::Value* ld) {
  using llvm::Value;
  constexpr int kTokens = 8;
  OperandRewrite rewrite;
  llvm::Type* elem = elem_type(kb, spec.dtype);
  llvm::Type* stored = eager_exponential_type(kb, spec.dtype);
  auto vector_of = [](llvm::Type* t) { return llvm::FixedVectorType::get(t, kTokens); };
  rewrite.column = [&kb, ld, elem, vector_of](Value* first, Value* row0) {
    auto& ir = kb.ir();
    // Tokens [first, first + 8): wholly inside [0, ld) or past it, where TMA's zeros meet the last
    // 8 tokens' constants (finite: their products are 0, and a replaced element lands in a row
    // of x or of the output that is not there). The address is selected, not the loaded values,
    // so that nothing waits for the loads before the slice's rows need them.
    Value* token = ir.CreateSelect(ir.CreateICmpSLT(first, ld), first, ir.CreateSub(ld, kb.c64(kTokens)));
    Value* tile = ir.CreateUDiv(row0, kb.arg("tile_n"));
    Value* coef = kb.load(vector_of(kb.f32()), kb.gep(kb.arg("coef"), kb.f32(), ir.CreateAdd(ir.CreateMul(tile, ld), token)));
    Value* col = kb.load(vector_of(kb.i32()), kb.gep(kb.arg("target_col"), kb.i32(), token));
    Value* dz = kb.load(vector_of(elem), kb.gep(kb.arg("target_dz"), elem, token));
    return std::vector<Value*>{coef, col, dz};
  };
  rewrite.chunk = [&kb, spec, stored, vector_of](const std::vector<Value*>& column, Value* chunk) {
    auto& ir = kb.ir();
    Value* p = ir.CreateBitCast(chunk, vector_of(stored));
    // Pairs converted together (cvt.rn.bf16x2.f32 / cvt.rn.f16x2.f32: the same rounding as one
    // at a time), element 2i in the low half.
    const auto pack = spec.dtype == DType::BF16 ? llvm::Intrinsic::nvvm_ff2bf16x2_rn : llvm::Intrinsic::nvvm_ff2f16x2_rn;
    Value* out = llvm::PoisonValue::get(llvm::FixedVectorType::get(kb.i32(), kTokens / 2));
    for (int i = 0; i < kTokens / 2; ++i) {
      Value* pair[2];
      for (int e = 0; e < 2; ++e) {
        const uint64_t j = 2 * i + e;
        pair[e] = ir.CreateFMul(ir.CreateExtractElement(column[0], j), kb.to_f32(ir.CreateExtractElement(p, j)));
      }
      Value* packed = ir.CreateIntrinsic(pack, {}, {pair[1], pair[0]});  // (high, low)
      out = ir.CreateInsertElement(out, ir.CreateBitCast(packed, kb.i32()), uint64_t(i));
    }
    return ir.CreateBitCast(out, chunk->getType());
  };
  rewrite.replace = [&kb](const std::vector<Value*>& column, int j) {
    auto& ir = kb.ir();
    Value* col = ir.CreateSExt(ir.CreateExtractElement(column[1], uint64_t(j)), kb.i64());
    Value* dz = ir.CreateBitCast(ir.CreateExtractElement(column[2], uint64_t(j)), ir.getInt16Ty());
    return std::pair<Value*, Value*>{col, dz};
  };
  return rewrite;
}

// What grad_weight and grad_input hand run_persistent: the rewrite where the spec has one.
inline std::optional<OperandRewrite> eager_operand(KernelBuilder& kb, const KernelSpec& spec, llvm::Value* ld) {
  if (!spec.eager_operand) return std::nullopt;
  return eager_operand_rewrite(kb, spec, ld);
}

}  // namespace lfce
