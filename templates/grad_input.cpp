// grad_input: grad_x += dz[:, chunk] · W[chunk] with K = the chunk's vocabulary rows.
// Across chunks the sum lives in an fp32 [N, H] accumulator: the first chunk writes it, the
// last converts it to the dtype (one chunk: straight to the output). Each element belongs to
// one CTA per launch, so the read-modify-write needs no atomics.
// A = dzᵀ [chunk, ld] (MN-major: tokens contiguous); B = W[chunk] [chunk, H] (MN-major).
#include "templates/gemm_skeleton.h"
#include "templates/template_util.h"
#include "templates/templates.h"

namespace lfce {

using llvm::Value;

KernelShape build_grad_input(llvm::Module& module, const KernelSpec& spec) {
  const TileConfig& t = spec.tile;
  KernelBuilder kb(module, "grad_input",
                   gemm_params(t, {{"dz", ParamType::GlobalPtr}, {"w", ParamType::GlobalPtr}, {"n", ParamType::I64},
                    {"ld", ParamType::I64}, {"v_begin", ParamType::I64}, {"v_len", ParamType::I64},
                    // fp32 problems accumulate in the output itself: the same buffer twice.
                    {"acc", ParamType::GlobalPtr, /*noalias=*/false},
                    {"grad_input", ParamType::GlobalPtr, /*noalias=*/false},
                    {"first", ParamType::I32}, {"last", ParamType::I32}, {"grad_loss", ParamType::GlobalPtr},
                    {"valid_count", ParamType::GlobalPtr}}),
                   t.threads());
  auto& ir = kb.ir();
  llvm::Type* elem = elem_type(kb, spec.dtype);
  GemmSkeleton gemm(kb, spec, Layout::MNMajor, Layout::MNMajor);
  Value* n = kb.arg("n");
  Value* hidden = kb.c64(spec.hidden);
  const int row_align = hidden_row_align(spec.hidden, spec.dtype);  // rows of H elements
  Value* v_len = kb.arg("v_len");
  Value *m0, *n0;
  std::tie(m0, n0) = gemm.tile_origin();

  GemmOperand dz{kb.arg("dz"), kb.arg("ld"), Layout::MNMajor, n, v_len};
  Value* w_chunk = kb.gep(kb.arg("w"), elem, ir.CreateMul(kb.arg("v_begin"), hidden));
  GemmOperand w{w_chunk, hidden, Layout::MNMajor, hidden, v_len, row_align};
  gemm.compute_tile(dz, w, m0, n0, gemm.k_tiles_for(v_len));

  Value* first = ir.CreateICmpNE(kb.arg("first"), kb.c32(0));
  Value* last = ir.CreateICmpNE(kb.arg("last"), kb.c32(0));
  // dz was stored times dz_scale (fp16): multiply by its reciprocal in fp32, exactly (a power of two).
  Value* unscale = dz_unscale(kb, spec, kb.arg("grad_loss"), kb.arg("valid_count"));
  gemm.for_each_element(/*rows_fastest=*/false, [&](Value* r, Value* c) {
    Value* m = ir.CreateAdd(m0, ir.CreateZExt(r, kb.i64()));
    Value* h = ir.CreateAdd(n0, ir.CreateZExt(c, kb.i64()));
    kb.if_then(ir.CreateAnd(ir.CreateICmpSLT(m, n), ir.CreateICmpSLT(h, hidden)), [&] {
      Value* index = ir.CreateAdd(ir.CreateMul(m, hidden), h);
      Value* acc_ptr = kb.gep(kb.arg("acc"), kb.f32(), index);
      Value* value = ir.CreateFMul(kb.load(kb.f32(), gemm.staged(r, c)), unscale);
      Value* slot = kb.local_array(kb.f32(), 1, "sum");
      Value* sum_ptr = kb.at(slot, kb.f32(), 0);
      kb.store(value, sum_ptr);
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
  return {"grad_input", t.threads(), gemm.smem_bytes(0)};
}

}  // namespace lfce
