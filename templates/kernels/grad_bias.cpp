// grad_bias: grad_b[v_begin + v] = Σ_tokens dzᵀ[v, :], one warp per vocabulary row of the
// chunk workspace, summed in fp32 in a fixed order (deterministic).
#include "templates/template_util.h"
#include "templates/templates.h"

namespace lfce {

using llvm::Value;

KernelShape build_grad_bias(llvm::Module& module, const KernelSpec& spec) {
  constexpr int kThreads = 256, kWarps = kThreads / 32;
  KernelBuilder kb(module, "grad_bias",
                   {{"dz", ParamType::GlobalPtr}, {"n", ParamType::I64}, {"ld", ParamType::I64},
                    {"v_begin", ParamType::I64}, {"v_len", ParamType::I64}, {"grad_bias", ParamType::GlobalPtr},
                    {"grad_loss", ParamType::GlobalPtr}, {"valid_count", ParamType::GlobalPtr}},
                   kThreads);
  auto& ir = kb.ir();
  llvm::Type* elem = elem_type(kb, spec.dtype);
  Value* lane = ir.CreateAnd(kb.tid(), kb.c32(31));
  Value* v = ir.CreateAdd(ir.CreateMul(ir.CreateZExt(kb.ctaid(0), kb.i64()), kb.c64(kWarps)),
                          ir.CreateZExt(ir.CreateLShr(kb.tid(), kb.c32(5)), kb.i64()));
  kb.if_then(ir.CreateICmpSLT(v, kb.arg("v_len")), [&] {
    Value* acc = kb.local_array(kb.f32(), 1, "acc");
    Value* slot = kb.at(acc, kb.f32(), 0);
    kb.store(kb.cf(0.f), slot);
    Value* row = ir.CreateMul(v, kb.arg("ld"));
    kb.for_range(ir.CreateZExt(lane, kb.i64()), kb.arg("n"), kb.c64(32), [&](Value* m) {
      Value* dz = kb.to_f32(kb.load(elem, kb.gep(kb.arg("dz"), elem, ir.CreateAdd(row, m))));
      kb.store(ir.CreateFAdd(kb.load(kb.f32(), slot), dz), slot);
    });
    // dz was stored times dz_scale (fp16): multiply by its reciprocal in fp32, exactly (a power of two).
    Value* unscale = dz_unscale(kb, spec, kb.arg("grad_loss"), kb.arg("valid_count"));
    Value* sum = ir.CreateFMul(kb.warp_sum(kb.load(kb.f32(), slot)), unscale);
    kb.if_then(ir.CreateICmpEQ(lane, kb.c32(0)), [&] {
      // With spec.accumulate grad_bias is an fp32 buffer the sum is added to.
      llvm::Type* out = spec.accumulate ? kb.f32() : elem;
      Value* ptr = kb.gep(kb.arg("grad_bias"), out, ir.CreateAdd(kb.arg("v_begin"), v));
      Value* value = spec.accumulate ? ir.CreateFAdd(kb.load(kb.f32(), ptr), sum) : sum;
      kb.store(kb.from_f32(value, out), ptr);
    });
  });
  kb.finish();
  return {"grad_bias", kThreads, 0, kb.signature()};
}

}  // namespace lfce
