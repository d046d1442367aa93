// grad_weight: grad_W[v_begin + v, :] = Σ_tokens dzᵀ[v, i] · x[i, :] for one vocabulary chunk.
// K = tokens runs entirely inside the CTA with fp32 accumulators, so each grad_W row is
// written exactly once, already final: no [V, H] accumulator, no atomics, deterministic.
// A = dzᵀ (K-major, rows of `ld` tokens, zero past N); B = x [N, H] (MN-major: H contiguous).
// With spec.accumulate grad_weight is an fp32 buffer (Megatron's main_grad) and each element is
// added to it (one read-modify-write, still once per element: deterministic).
#include "templates/epilogue/eager_fixup.h"
#include "templates/gemm/eager_operand.h"
#include "templates/gemm/gemm_skeleton.h"
#include "templates/gemm/tile_scheduler.h"
#include "templates/template_util.h"
#include "templates/templates.h"

namespace lfce {

using llvm::Value;

KernelShape build_grad_weight(llvm::Module& module, const KernelSpec& spec) {
  const TileConfig& t = spec.tile;
  std::vector<Param> params = {{"dz", ParamType::GlobalPtr},          {"x", ParamType::GlobalPtr},
                               {"n", ParamType::I64},                {"ld", ParamType::I64},
                               {"v_begin", ParamType::I64},          {"v_len", ParamType::I64},
                               {"grad_weight", ParamType::GlobalPtr}, {"grad_loss", ParamType::GlobalPtr},
                               {"valid_count", ParamType::GlobalPtr}};
  add_eager_operand_params(spec, params);
  add_eager_fixup_params(spec, params);
  KernelBuilder kb(module, "grad_weight", gemm_params(t, params), t.threads());
  auto& ir = kb.ir();
  llvm::Type* elem = elem_type(kb, spec.dtype);
  // The type grad_weight is stored in: the dtype, or fp32 when added into.
  llvm::Type* out = spec.accumulate ? kb.f32() : elem;
  GemmSkeleton gemm(kb, spec);
  Value* hidden = kb.c64(spec.hidden);
  const int row_align = hidden_row_align(spec.hidden, spec.dtype);  // rows of H elements
  Value* v_len = kb.arg("v_len");
  Value* ld = kb.arg("ld");
  // dz was stored times dz_scale (fp16): multiply by its reciprocal in fp32, exactly (a power of two).
  Value* unscale = dz_unscale(kb, spec, kb.arg("grad_loss"), kb.arg("valid_count"));

  if (gemm.specialised()) {
    const std::optional<OperandTransform> operand = eager_operand(kb, spec, ld, /*tokens_along_m=*/false);
    // sm_90a: persistent CTAs over the chunk's [v_len, H] tiles (grouped order), each
    // thread storing its accumulator pairs straight from registers (wgmma rows are 16-byte
    // multiples, so H is even and every pair is whole and 4-byte aligned).
    Value* grid_m = gemm.blocks_for(v_len, t.bm);
    // eager_fixup: the producer warpgroup's spare warps turn p̃ into dz ahead of the tiles.
    std::optional<ProducerWork> fixup;
    if (spec.eager_fixup) fixup = eager_fixup_work(kb, spec, kb.arg("dz"), grid_m, ld, v_len);
    gemm.run_persistent(grid_m, gemm.blocks_for(hidden, t.bn), gemm.k_tiles_for(ld),
                        [&](Value* m0, Value* n0, const Fragment& f) {
      for (int h = 0; h < f.rows(); ++h) {
        Value* v = f.row_at(kb, m0, h);
        Value* row = kb.gep(kb.arg("grad_weight"), out, ir.CreateMul(ir.CreateAdd(kb.arg("v_begin"), v), hidden));
        Value* in_rows = ir.CreateICmpSLT(v, v_len);
        for (int j = 0; j < f.blocks(); ++j) {
          Value* col = f.col_at(kb, n0, j);
          kb.if_then(ir.CreateAnd(in_rows, ir.CreateICmpSLT(col, hidden)), [&] {
            Value* a = ir.CreateFMul(f.at(j, h, 0), unscale);
            Value* b = ir.CreateFMul(f.at(j, h, 1), unscale);
            Value* ptr = kb.gep(row, out, col);
            if (spec.accumulate) {  // an 8-byte aligned fp32 pair (H is even here)
              auto [old_a, old_b] = load_pair_f32(kb, ptr);
              a = ir.CreateFAdd(old_a, a);
              b = ir.CreateFAdd(old_b, b);
            }
            store_pair(kb, a, b, out, ptr);
          });
        }
      }
    }, operand ? &*operand : nullptr, fixup ? &*fixup : nullptr);
    kb.finish();
    return {"grad_weight", t.threads(), gemm.smem_bytes(0), kb.signature()};
  }

  if (spec.eager_fixup) throw InternalError("eager_fixup on a tile without the TMA pipeline (" + t.text() + ")");
  Value *m0, *n0;
  std::tie(m0, n0) = TileScheduler(t).origin(kb);

  GemmOperand dz{kb.arg("dz"), ld, Layout::KMajor, v_len, ld};
  GemmOperand x{kb.arg("x"), hidden, Layout::MNMajor, hidden, kb.arg("n"), row_align};
  gemm.compute_tile(dz, x, m0, n0, gemm.k_tiles_for(ld));
  gemm.for_each_element(/*rows_fastest=*/false, [&](Value* r, Value* c) {
    Value* v = ir.CreateAdd(m0, ir.CreateZExt(r, kb.i64()));
    Value* h = ir.CreateAdd(n0, ir.CreateZExt(c, kb.i64()));
    kb.if_then(ir.CreateAnd(ir.CreateICmpSLT(v, v_len), ir.CreateICmpSLT(h, hidden)), [&] {
      Value* index = ir.CreateAdd(ir.CreateMul(ir.CreateAdd(kb.arg("v_begin"), v), hidden), h);
      Value* value = ir.CreateFMul(kb.load(kb.f32(), gemm.staged(r, c)), unscale);
      Value* ptr = kb.gep(kb.arg("grad_weight"), out, index);
      if (spec.accumulate) value = ir.CreateFAdd(kb.load(kb.f32(), ptr), value);
      kb.store(kb.from_f32(value, out), ptr);
    });
  });
  kb.finish();
  return {"grad_weight", t.threads(), gemm.smem_bytes(0), kb.signature()};
}

}  // namespace lfce
