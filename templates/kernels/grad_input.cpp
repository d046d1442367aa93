// grad_input: grad_x += dz[:, chunk] · W[chunk] with K = the chunk's vocabulary rows.
// Across chunks the sum lives in an fp32 [N, H] accumulator: the first chunk writes it, the
// last converts it to the dtype (one chunk: straight to the output). Each element belongs to
// one CTA per launch, so the read-modify-write needs no atomics.
// A = dzᵀ [chunk, ld] (MN-major: tokens contiguous); B = W[chunk] [chunk, H] (MN-major).
#include "templates/gemm/eager_operand.h"
#include "templates/gemm/gemm_skeleton.h"
#include "templates/gemm/tile_scheduler.h"
#include "templates/template_util.h"
#include "templates/templates.h"

namespace lfce {

using llvm::Value;

constexpr int kLoadGroup = 8;  // fp32 sum pairs read between warp syncs in the sm_90a epilogue

KernelShape build_grad_input(llvm::Module& module, const KernelSpec& spec) {
  const TileConfig& t = spec.tile;
  std::vector<Param> params = {{"dz", ParamType::GlobalPtr}, {"w", ParamType::GlobalPtr}, {"n", ParamType::I64},
                               {"ld", ParamType::I64}, {"v_begin", ParamType::I64}, {"v_len", ParamType::I64},
                               // fp32 problems accumulate in the output itself: the same buffer twice.
                               {"acc", ParamType::GlobalPtr, /*noalias=*/false},
                               {"grad_input", ParamType::GlobalPtr, /*noalias=*/false},
                               {"first", ParamType::I32}, {"last", ParamType::I32}, {"grad_loss", ParamType::GlobalPtr},
                               {"valid_count", ParamType::GlobalPtr}, {"targets", ParamType::GlobalPtr},
                               {"residual", ParamType::GlobalPtr}};
  add_shift_param(spec, params);
  add_eager_operand_params(spec, params);
  KernelBuilder kb(module, "grad_input", gemm_params(t, params), t.threads());
  auto& ir = kb.ir();
  llvm::Type* elem = elem_type(kb, spec.dtype);
  GemmSkeleton gemm(kb, spec);
  Value* n = kb.arg("n");
  Value* hidden = kb.c64(spec.hidden);
  const int row_align = hidden_row_align(spec.hidden, spec.dtype);  // rows of H elements
  Value* v_len = kb.arg("v_len");
  Value* first = ir.CreateICmpNE(kb.arg("first"), kb.c32(0));
  Value* last = ir.CreateICmpNE(kb.arg("last"), kb.c32(0));
  // dz was stored times dz_scale (fp16): multiply by its reciprocal in fp32, exactly (a power of two).
  Value* unscale = dz_unscale(kb, spec, kb.arg("grad_loss"), kb.arg("valid_count"));
  Value* v_begin = kb.arg("v_begin");
  Value* w_chunk = kb.gep(kb.arg("w"), elem, ir.CreateMul(v_begin, hidden));
  // Token m's target term, compensated: when its target is in this chunk, dlogits_backward left
  // in residual[m] what rounding dz[m, target] to the dtype lost; residual[m] · W[target] is
  // added in fp32 (docs/design.md, Numerics). fp32 rounds nothing. Returns (whether, residual, W row).
  const bool compensate = spec.dtype != DType::FP32;
  struct Target {
    Value *hit, *residual, *w_row;
  };
  auto target_term = [&](Value* m) {
    Value* in_rows = ir.CreateICmpSLT(m, n);
    Value* safe_m = ir.CreateSelect(in_rows, m, kb.c64(0));
    Value* v = ir.CreateSub(load_target(kb, spec, kb.arg("targets"), safe_m, kb.c64(-1)), v_begin);
    Value* hit = ir.CreateAnd(in_rows, ir.CreateAnd(ir.CreateICmpSGE(v, kb.c64(0)), ir.CreateICmpSLT(v, v_len)));
    Value* residual = kb.load(kb.f32(), kb.gep(kb.arg("residual"), kb.f32(), safe_m));
    return Target{hit, ir.CreateSelect(hit, residual, kb.cf(0.f)),
                  kb.gep(w_chunk, elem, ir.CreateMul(ir.CreateSelect(hit, v, kb.c64(0)), hidden))};
  };

  if (gemm.specialised()) {
    const std::optional<OperandTransform> operand = eager_operand(kb, spec, kb.arg("ld"), /*tokens_along_m=*/true);
    // sm_90a: persistent CTAs over the [N, H] tiles (grouped order); each thread adds its
    // accumulator pairs to the fp32 sum in registers (H even, pairs 8-byte aligned). Whether
    // the sum is read (not the first chunk) and where it goes (the output in the dtype on the
    // last chunk, else the fp32 sum) is the same for the whole launch: one branch per tile.
    gemm.run_persistent(gemm.blocks_for(n, t.bm), gemm.blocks_for(hidden, t.bn), gemm.k_tiles_for(v_len),
                        [&](Value* m0, Value* n0, const Fragment& f) {
      // One row h of the fragment; with_term: the row's target is in this chunk (about one row
      // in V / chunk), so its W row is read and residual · W added, pair by pair.
      auto row_epilogue = [&](int h, bool accumulate, bool final, const Target* target) {
        Value* m = f.row_at(kb, m0, h);
        Value* row = ir.CreateMul(m, hidden);
        Value* in_rows = ir.CreateICmpSLT(m, n);
        for (int j = 0; j < f.blocks(); ++j) {
          // The fp32 sums are read in groups: all read at once, 2 x BN/8 more live registers
          // next to the accumulators spilled under the driver's JIT (H200, driver 580).
          if (accumulate && j > 0 && j % kLoadGroup == 0) kb.warp_sync();
          Value* col = f.col_at(kb, n0, j);
          kb.if_then(ir.CreateAnd(in_rows, ir.CreateICmpSLT(col, hidden)), [&] {
            Value* index = ir.CreateAdd(row, col);
            Value* acc_ptr = kb.gep(kb.arg("acc"), kb.f32(), index);
            Value* a = f.at(j, h, 0);
            Value* b = f.at(j, h, 1);
            if (target) {
              Value* w = kb.load(llvm::FixedVectorType::get(elem, 2), kb.gep(target->w_row, elem, col));
              a = ir.CreateFAdd(a, ir.CreateFMul(target->residual, kb.to_f32(ir.CreateExtractElement(w, uint64_t{0}))));
              b = ir.CreateFAdd(b, ir.CreateFMul(target->residual, kb.to_f32(ir.CreateExtractElement(w, uint64_t{1}))));
            }
            a = ir.CreateFMul(a, unscale);
            b = ir.CreateFMul(b, unscale);
            if (accumulate) {
              auto sum = load_pair_f32(kb, acc_ptr);
              a = ir.CreateFAdd(a, sum.first);
              b = ir.CreateFAdd(b, sum.second);
            }
            if (final) {
              store_pair(kb, a, b, elem, kb.gep(kb.arg("grad_input"), elem, index));
            } else {
              store_pair(kb, a, b, kb.f32(), acc_ptr);
            }
          });
        }
      };
      // A branch per row rather than per element keeps the target term out of the registers
      // of rows without it (a term per accumulator, selected in, spilled under the driver's JIT).
      auto epilogue = [&](bool accumulate, bool final) {
        for (int h = 0; h < f.rows(); ++h) {
          if (!compensate) {
            row_epilogue(h, accumulate, final, nullptr);
            continue;
          }
          Target target = target_term(f.row_at(kb, m0, h));
          kb.if_then_else(
              target.hit, [&] { row_epilogue(h, accumulate, final, &target); },
              [&] { row_epilogue(h, accumulate, final, nullptr); });
        }
      };
      kb.if_then_else(
          first, [&] { kb.if_then_else(last, [&] { epilogue(false, true); }, [&] { epilogue(false, false); }); },
          [&] { kb.if_then_else(last, [&] { epilogue(true, true); }, [&] { epilogue(true, false); }); });
    }, operand ? &*operand : nullptr);
    kb.finish();
    return {"grad_input", t.threads(), gemm.smem_bytes(0), kb.signature()};
  }

  Value *m0, *n0;
  std::tie(m0, n0) = TileScheduler(t).origin(kb);

  GemmOperand dz{kb.arg("dz"), kb.arg("ld"), Layout::MNMajor, n, v_len};
  GemmOperand w{w_chunk, hidden, Layout::MNMajor, hidden, v_len, row_align};
  gemm.compute_tile(dz, w, m0, n0, gemm.k_tiles_for(v_len));
  gemm.for_each_element(/*rows_fastest=*/false, [&](Value* r, Value* c) {
    Value* m = ir.CreateAdd(m0, ir.CreateZExt(r, kb.i64()));
    Value* h = ir.CreateAdd(n0, ir.CreateZExt(c, kb.i64()));
    kb.if_then(ir.CreateAnd(ir.CreateICmpSLT(m, n), ir.CreateICmpSLT(h, hidden)), [&] {
      Value* index = ir.CreateAdd(ir.CreateMul(m, hidden), h);
      Value* acc_ptr = kb.gep(kb.arg("acc"), kb.f32(), index);
      Value* slot = kb.local_array(kb.f32(), 1, "sum");
      Value* sum_ptr = kb.at(slot, kb.f32(), 0);
      kb.store(kb.load(kb.f32(), gemm.staged(r, c)), sum_ptr);
      if (compensate) {
        Target target = target_term(m);
        kb.if_then(target.hit, [&] {
          Value* w = kb.to_f32(kb.load(elem, kb.gep(target.w_row, elem, h)));
          kb.store(ir.CreateFAdd(kb.load(kb.f32(), sum_ptr), ir.CreateFMul(target.residual, w)), sum_ptr);
        });
      }
      kb.store(ir.CreateFMul(kb.load(kb.f32(), sum_ptr), unscale), sum_ptr);
      kb.if_then(ir.CreateNot(first), [&] {
        kb.store(ir.CreateFAdd(kb.load(kb.f32(), sum_ptr), kb.load(kb.f32(), acc_ptr)), sum_ptr);
      });
      Value* sum = kb.load(kb.f32(), sum_ptr);
      kb.if_then_else(
          last, [&] { kb.store(kb.from_f32(sum, elem), kb.gep(kb.arg("grad_input"), elem, index)); },
          [&] { kb.store(sum, acc_ptr); });
    });
  });
  kb.finish();
  return {"grad_input", t.threads(), gemm.smem_bytes(0), kb.signature()};
}

}  // namespace lfce
