// Eager mode's dz, formed where the gradient GEMMs read it (KernelSpec::eager_operand): grad_weight
// and grad_input take eager_logits' stored exponentials p̃ (fp16, the dzᵀ workspace [V, ld]) as
// operand A, and each consumer thread turns its A fragments into dz in registers on their way
// from shared memory to the wgmma (OperandTransform, templates/gemm/wgmma_pipeline.cpp), with the
// constants eager_dz stored in its eager_operand form:
//   dz[v, m] = target_dz[m]                          where v = target_col[m],
//              coef[v / tile_n, m] · p̃[v, m]          otherwise, rounded to the dtype (pairs
//                                                     converted together, each rounded alike),
// the same operations as eager_dz's own rewrite of the workspace, so the same bits, without its
// pass over the [V, ld] workspace (a read and a write of 2·V·ld bytes). grad_input's A is dz
// (tokens along M, vocabulary along K: a thread's two rows per m64 block are two tokens, whose
// constants change only where K enters the next eager_logits tile), grad_weight's dzᵀ
// (vocabulary along M, tokens along K: a slice's 16 columns per thread are 16 tokens, and the
// whole tile lies in one eager_logits tile, Plan::eager_operand: tile_n a multiple of BK and of
// grad_weight's BM). The vocabulary index is the chunk's (v - v_begin), as eager_dz's.
#pragma once

#include <optional>
#include <vector>

#include <llvm/IR/IntrinsicsNVPTX.h>

#include "compiler/errors.h"
#include "compiler/kernel_builder.h"
#include "compiler/kernel_spec.h"
#include "templates/gemm/gemm_skeleton.h"
#include "templates/template_util.h"

namespace lfce {

// eager_dz's constants in its eager_operand form, as kernel parameters (the transform's, and
// grad_weight's fix-up's), which runtime/launch.cpp offers by these names.
inline void add_eager_constant_params(std::vector<Param>& params) {
  params.push_back({"coef", ParamType::GlobalPtr});
  params.push_back({"target_col", ParamType::GlobalPtr});
  params.push_back({"target_dz", ParamType::GlobalPtr});
  params.push_back({"tile_n", ParamType::I64});
}

// The transform's kernel parameters, after the template's own.
inline void add_eager_operand_params(const KernelSpec& spec, std::vector<Param>& params) {
  if (spec.eager_operand) add_eager_constant_params(params);
}

namespace eager_operand_detail {

// coef · (the pair of stored exponentials `pair`, i32), rounded to the dtype as a pair (element 0
// in the low half): cvt.rn.bf16x2.f32 / cvt.rn.f16x2.f32, the same rounding as one at a time.
inline llvm::Value* scaled_pair(KernelBuilder& kb, const KernelSpec& spec, llvm::Value* pair, llvm::Value* coef0,
                                llvm::Value* coef1) {
  auto& ir = kb.ir();
  llvm::Value* p = ir.CreateBitCast(pair, llvm::FixedVectorType::get(eager_exponential_type(kb, spec.dtype), 2));
  llvm::Value* lo = ir.CreateFMul(coef0, kb.to_f32(ir.CreateExtractElement(p, uint64_t{0})));
  llvm::Value* hi = ir.CreateFMul(coef1, kb.to_f32(ir.CreateExtractElement(p, uint64_t{1})));
  const auto pack = spec.dtype == DType::BF16 ? llvm::Intrinsic::nvvm_ff2bf16x2_rn : llvm::Intrinsic::nvvm_ff2f16x2_rn;
  return ir.CreateBitCast(ir.CreateIntrinsic(pack, {}, {hi, lo}), kb.i32());  // (high, low)
}

// `pair` with its low (element 0) or high (element 1) element replaced by the low 16 bits of
// `value` (i32) where `hit`.
inline llvm::Value* replace_element(KernelBuilder& kb, llvm::Value* pair, llvm::Value* hit, llvm::Value* value,
                                    int element) {
  auto& ir = kb.ir();
  llvm::Value* kept = ir.CreateAnd(pair, kb.c32(element == 0 ? int32_t(0xFFFF0000u) : 0xFFFF));
  llvm::Value* low = ir.CreateAnd(value, kb.c32(0xFFFF));
  llvm::Value* placed = ir.CreateOr(kept, element == 0 ? low : ir.CreateShl(low, kb.c32(16)));
  return ir.CreateSelect(hit, placed, pair);
}

// v / tile_n as i64, divided in 32 bits (V < 2^31: Plan's chunk limit): a 64-bit division is a
// subroutine in SASS, which may make the driver's JIT serialise the wgmmas.
inline llvm::Value* eager_tile(KernelBuilder& kb, llvm::Value* v) {
  auto& ir = kb.ir();
  llvm::Value* tile = ir.CreateUDiv(ir.CreateTrunc(v, kb.i32()), ir.CreateTrunc(kb.arg("tile_n"), kb.i32()));
  return ir.CreateZExt(tile, kb.i64());
}

// Token `token` (i64, `width` consecutive ones read from it), or ld - width for a token at or
// past ld: rows or columns past ld, where TMA's zeros meet the last tokens' constants (finite,
// so their products are 0; a replaced element there lands in a row of the output or of x that
// does not exist). `token` is never negative.
inline llvm::Value* clamp_token(KernelBuilder& kb, llvm::Value* token, llvm::Value* ld, int width) {
  auto& ir = kb.ir();
  return ir.CreateSelect(ir.CreateICmpSLT(token, ld), token, ir.CreateSub(ld, kb.c64(width)));
}

}  // namespace eager_operand_detail

// `ld`: the workspace's token stride (i64, a multiple of 8). tokens_along_m: grad_input's A (dz),
// else grad_weight's (dzᵀ). Only for a spec with eager_operand. Every pair is coef · p̃ (`pair`);
// the slices where some row's target falls are fixed up for the whole warp (`fix`): a warp's
// 16 rows and 64 columns hold a target with probability about 1024 / V.
inline OperandTransform eager_operand_transform(KernelBuilder& kb, const KernelSpec& spec, llvm::Value* ld,
                                                bool tokens_along_m) {
  using llvm::Value;
  using namespace eager_operand_detail;
  if (spec.tile.bk != 64) throw InternalError("eager_operand needs BK = 64 (tile " + spec.tile.text() + ")");
  OperandTransform transform;
  llvm::Type* elem = elem_type(kb, spec.dtype);
  if (tokens_along_m) {
    // State per fragment row h of R: coef (f32), then its target's column (i32), then the slice's
    // first column (i32; the target is in the slice where the difference is in [0, 64), compared
    // in may_fix, a slice later, so that nothing waits for the load here).
    transform.slice = [&kb, ld](Value* m0, Value* k0, const FragmentPosition& pos) {
      auto& ir = kb.ir();
      const int rows = static_cast<int>(pos.row.size());
      std::vector<Value*> state(2 * rows + 1);
      Value* tile = eager_tile(kb, k0);
      for (int h = 0; h < rows; ++h) {
        Value* token = clamp_token(kb, ir.CreateAdd(m0, ir.CreateZExt(pos.row[h], kb.i64())), ld, 1);
        state[h] = kb.load(kb.f32(), kb.gep(kb.arg("coef"), kb.f32(), ir.CreateAdd(ir.CreateMul(tile, ld), token)));
        state[rows + h] = kb.load(kb.i32(), kb.gep(kb.arg("target_col"), kb.i32(), token));
      }
      state[2 * rows] = ir.CreateTrunc(k0, kb.i32());
      return state;
    };
    transform.pair = [&kb, spec](const std::vector<Value*>& state, Value* pair, int h, int, int) {
      return scaled_pair(kb, spec, pair, state[h], state[h]);
    };
    transform.may_fix = [&kb](const std::vector<Value*>& state) {
      auto& ir = kb.ir();
      const int rows = static_cast<int>(state.size()) / 2;
      Value* any = ir.getFalse();
      for (int h = 0; h < rows; ++h)
        any = ir.CreateOr(any, ir.CreateICmpULT(ir.CreateSub(state[rows + h], state[2 * rows]), kb.c32(64)));
      return any;
    };
    transform.fix = [&kb, ld, elem](Value* m0, Value* k0, const FragmentPosition& pos, std::vector<Value*>& pairs) {
      auto& ir = kb.ir();
      const int rows = static_cast<int>(pos.row.size());
      Value* first = ir.CreateAdd(ir.CreateTrunc(k0, kb.i32()), pos.col0);
      for (int h = 0; h < rows; ++h) {
        Value* token = clamp_token(kb, ir.CreateAdd(m0, ir.CreateZExt(pos.row[h], kb.i64())), ld, 1);
        Value* offset = ir.CreateSub(kb.load(kb.i32(), kb.gep(kb.arg("target_col"), kb.i32(), token)), first);
        Value* dz = ir.CreateBitCast(kb.load(elem, kb.gep(kb.arg("target_dz"), elem, token)), ir.getInt16Ty());
        dz = ir.CreateZExt(dz, kb.i32());
        for (int ks = 0; ks < 4; ++ks)
          for (int half = 0; half < 2; ++half) {
            Value*& pair = pairs[(ks * rows + h) * 2 + half];
            for (int e = 0; e < 2; ++e)  // columns first + 16·ks + 8·half + e
              pair = replace_element(kb, pair, ir.CreateICmpEQ(offset, kb.c32(16 * ks + 8 * half + e)), dz, e);
          }
      }
    };
    return transform;
  }
  // State: per k16 step ks and half, the two tokens' coef (<2 x f32>, columns col0 + 16·ks + 8·half
  // + {0, 1}); the targets of two of the slice's 64 tokens (<2 x i32>: each lane checks its two
  // against the warp's rows) and the first row of each of the warp's row blocks (i32).
  transform.slice = [&kb, ld](Value* m0, Value* k0, const FragmentPosition& pos) {
    auto& ir = kb.ir();
    std::vector<Value*> state;
    Value* tile = eager_tile(kb, m0);
    Value* first = ir.CreateAdd(k0, ir.CreateZExt(pos.col0, kb.i64()));
    auto* f32x2 = llvm::FixedVectorType::get(kb.f32(), 2);
    auto* i32x2 = llvm::FixedVectorType::get(kb.i32(), 2);
    for (int step = 0; step < 8; ++step) {  // k16 step step / 2, half step % 2: 8 columns on each
      Value* token = clamp_token(kb, ir.CreateAdd(first, kb.c64(8 * step)), ld, 2);
      state.push_back(kb.load(f32x2, kb.gep(kb.arg("coef"), kb.f32(), ir.CreateAdd(ir.CreateMul(tile, ld), token))));
    }
    Value* lane = ir.CreateAnd(kb.tid(), kb.c32(31));
    Value* token = clamp_token(kb, ir.CreateAdd(k0, ir.CreateZExt(ir.CreateMul(lane, kb.c32(2)), kb.i64())), ld, 2);
    state.push_back(kb.load(i32x2, kb.gep(kb.arg("target_col"), kb.i32(), token)));
    // The first of the warp's 16 rows in each m64 block (compared in may_fix, a slice later, so
    // that nothing waits for the load here).
    for (size_t h = 0; h < pos.row.size(); h += 2)
      state.push_back(ir.CreateAdd(ir.CreateTrunc(m0, kb.i32()), ir.CreateAnd(pos.row[h], kb.c32(~15))));
    return state;
  };
  transform.pair = [&kb, spec](const std::vector<Value*>& state, Value* pair, int, int ks, int half) {
    auto& ir = kb.ir();
    Value* coef = state[2 * ks + half];
    return scaled_pair(kb, spec, pair, ir.CreateExtractElement(coef, uint64_t{0}), ir.CreateExtractElement(coef, uint64_t{1}));
  };
  transform.may_fix = [&kb](const std::vector<Value*>& state) {
    auto& ir = kb.ir();
    Value* cols = state[8];
    Value* hit = ir.getFalse();
    for (size_t b = 9; b < state.size(); ++b)
      for (int e = 0; e < 2; ++e) {
        Value* offset = ir.CreateSub(ir.CreateExtractElement(cols, uint64_t(e)), state[b]);
        hit = ir.CreateOr(hit, ir.CreateICmpULT(offset, kb.c32(16)));
      }
    return hit;
  };
  transform.fix = [&kb, ld](Value* m0, Value* k0, const FragmentPosition& pos, std::vector<Value*>& pairs) {
    auto& ir = kb.ir();
    const int rows = static_cast<int>(pos.row.size());
    Value* first = ir.CreateAdd(k0, ir.CreateZExt(pos.col0, kb.i64()));
    auto* i32x2 = llvm::FixedVectorType::get(kb.i32(), 2);
    for (int step = 0; step < 8; ++step) {
      const int ks = step / 2, half = step % 2;
      Value* token = clamp_token(kb, ir.CreateAdd(first, kb.c64(8 * step)), ld, 2);
      Value* cols = kb.load(i32x2, kb.gep(kb.arg("target_col"), kb.i32(), token));
      // Two 16-bit target_dz, 4-byte aligned (the token is even); the low half the first token's.
      Value* dz = kb.load(kb.i32(), kb.gep(kb.arg("target_dz"), ir.getInt16Ty(), token));
      for (int h = 0; h < rows; ++h) {
        Value* v = ir.CreateAdd(ir.CreateTrunc(m0, kb.i32()), pos.row[h]);
        Value*& pair = pairs[(ks * rows + h) * 2 + half];
        for (int e = 0; e < 2; ++e) {
          Value* hit = ir.CreateICmpEQ(ir.CreateExtractElement(cols, uint64_t(e)), v);
          pair = replace_element(kb, pair, hit, e == 0 ? dz : ir.CreateLShr(dz, kb.c32(16)), e);
        }
      }
    }
  };
  return transform;
}

// What grad_weight and grad_input hand run_persistent: the transform where the spec has one.
inline std::optional<OperandTransform> eager_operand(KernelBuilder& kb, const KernelSpec& spec, llvm::Value* ld,
                                                     bool tokens_along_m) {
  if (!spec.eager_operand) return std::nullopt;
  return eager_operand_transform(kb, spec, ld, tokens_along_m);
}

}  // namespace lfce
