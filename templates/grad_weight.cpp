// grad_weight: grad_W[v_begin + v, :] = Σ_tokens dzᵀ[v, i] · x[i, :] for one vocabulary chunk.
// K = tokens runs entirely inside the CTA with fp32 accumulators, so each grad_W row is
// written exactly once, already final: no [V, H] accumulator, no atomics, deterministic.
// A = dzᵀ (K-major, rows of `ld` tokens, zero past N); B = x [N, H] (MN-major: H contiguous).
#include "templates/gemm_skeleton.h"
#include "templates/template_util.h"
#include "templates/templates.h"

namespace lfce {

using llvm::Value;

KernelShape build_grad_weight(llvm::Module& module, const KernelSpec& spec) {
  const TileConfig& t = spec.tile;
  KernelBuilder kb(module, "grad_weight",
                   gemm_params(t, {{"dz", ParamType::GlobalPtr}, {"x", ParamType::GlobalPtr}, {"n", ParamType::I64},
                    {"ld", ParamType::I64}, {"v_begin", ParamType::I64}, {"v_len", ParamType::I64},
                    {"grad_weight", ParamType::GlobalPtr}, {"grad_loss", ParamType::GlobalPtr},
                    {"valid_count", ParamType::GlobalPtr}}),
                   t.threads());
  auto& ir = kb.ir();
  llvm::Type* elem = elem_type(kb, spec.dtype);
  GemmSkeleton gemm(kb, spec, Layout::KMajor, Layout::MNMajor);
  Value* hidden = kb.c64(spec.hidden);
  const int row_align = hidden_row_align(spec.hidden, spec.dtype);  // rows of H elements
  Value* v_len = kb.arg("v_len");
  Value* ld = kb.arg("ld");
  // dz was stored times dz_scale (fp16): multiply by its reciprocal in fp32, exactly (a power of two).
  Value* unscale = dz_unscale(kb, spec, kb.arg("grad_loss"), kb.arg("valid_count"));

  if (gemm.specialised()) {
    // sm_90a: persistent CTAs over the chunk's [v_len, H] tiles (grouped order), each
    // thread storing its accumulator pairs straight from registers (wgmma rows are 16-byte
    // multiples, so H is even and every pair is whole and 4-byte aligned).
    gemm.run_persistent(gemm.blocks_for(v_len, t.bm), gemm.blocks_for(hidden, t.bn), gemm.k_tiles_for(ld),
                        [&](Value* m0, Value* n0, const Fragment& f) {
      for (int h = 0; h < f.rows(); ++h) {
        Value* v = f.row_at(kb, m0, h);
        Value* row = kb.gep(kb.arg("grad_weight"), elem, ir.CreateMul(ir.CreateAdd(kb.arg("v_begin"), v), hidden));
        Value* in_rows = ir.CreateICmpSLT(v, v_len);
        for (int j = 0; j < f.blocks(); ++j) {
          Value* col = f.col_at(kb, n0, j);
          kb.if_then(ir.CreateAnd(in_rows, ir.CreateICmpSLT(col, hidden)), [&] {
            store_pair(kb, ir.CreateFMul(f.at(j, h, 0), unscale), ir.CreateFMul(f.at(j, h, 1), unscale), elem,
                       kb.gep(row, elem, col));
          });
        }
      }
    });
    kb.finish();
    return {"grad_weight", t.threads(), gemm.smem_bytes(0)};
  }

  Value *m0, *n0;
  std::tie(m0, n0) = gemm.tile_origin();

  GemmOperand dz{kb.arg("dz"), ld, Layout::KMajor, v_len, ld};
  GemmOperand x{kb.arg("x"), hidden, Layout::MNMajor, hidden, kb.arg("n"), row_align};
  gemm.compute_tile(dz, x, m0, n0, gemm.k_tiles_for(ld));
  gemm.for_each_element(/*rows_fastest=*/false, [&](Value* r, Value* c) {
    Value* v = ir.CreateAdd(m0, ir.CreateZExt(r, kb.i64()));
    Value* h = ir.CreateAdd(n0, ir.CreateZExt(c, kb.i64()));
    kb.if_then(ir.CreateAnd(ir.CreateICmpSLT(v, v_len), ir.CreateICmpSLT(h, hidden)), [&] {
      Value* index = ir.CreateAdd(ir.CreateMul(ir.CreateAdd(kb.arg("v_begin"), v), hidden), h);
      Value* value = ir.CreateFMul(kb.load(kb.f32(), gemm.staged(r, c)), unscale);
      kb.store(kb.from_f32(value, elem), kb.gep(kb.arg("grad_weight"), elem, index));
    });
  });
  kb.finish();
  return {"grad_weight", t.threads(), gemm.smem_bytes(0)};
}

}  // namespace lfce
