// grad_scale: dst[i] = src[i] · scale[0] in fp32, rounded once to the dtype (torch.mul of a 16-bit
// tensor by an fp32 0-dim tensor would round the scale to the dtype first), persistent threads
// striding over `count` elements, for the autograd backward of eager mode, which scales the
// gradients held since the forward by the upstream gradient read on the device (no host
// synchronisation); 8 elements a thread in 16-byte vectors (16-bit) where they are whole. In place
// (src = dst) with a scale of 1 it writes nothing.
#include "templates/template_util.h"
#include "templates/templates.h"

namespace lfce {

using llvm::Value;

KernelShape build_grad_scale(llvm::Module& module, const KernelSpec& spec) {
  constexpr int kThreads = 256, kVector = 8;
  KernelBuilder kb(module, "grad_scale",
                   {{"src", ParamType::GlobalPtr, /*noalias=*/false}, {"dst", ParamType::GlobalPtr, /*noalias=*/false},
                    {"count", ParamType::I64}, {"scale", ParamType::GlobalPtr}},
                   kThreads);
  auto& ir = kb.ir();
  llvm::Type* elem = elem_type(kb, spec.dtype);
  llvm::Type* vec = llvm::FixedVectorType::get(elem, kVector);
  Value* scale = kb.load(kb.f32(), kb.arg("scale"));
  // In place by 1: nothing to write (eager mode's backward for loss.backward() of the loss itself).
  Value* same = ir.CreateICmpEQ(ir.CreatePtrToInt(kb.arg("src"), kb.i64()), ir.CreatePtrToInt(kb.arg("dst"), kb.i64()));
  kb.if_then(ir.CreateNot(ir.CreateAnd(same, ir.CreateFCmpOEQ(scale, kb.cf(1.f)))), [&] {
    auto [first, stride] = grid_stride(kb, kThreads);
    Value* count = kb.arg("count");
    Value* vectors = ir.CreateUDiv(count, kb.c64(kVector));
    auto scaled = [&](Value* value) { return kb.from_f32(ir.CreateFMul(kb.to_f32(value), scale), elem); };
    kb.for_range(first, vectors, stride, [&](Value* v) {
      Value* offset = ir.CreateMul(v, kb.c64(kVector));
      Value* in = kb.load(vec, kb.gep(kb.arg("src"), elem, offset));
      Value* out = llvm::PoisonValue::get(vec);
      for (int j = 0; j < kVector; ++j)
        out = ir.CreateInsertElement(out, scaled(ir.CreateExtractElement(in, uint64_t(j))), uint64_t(j));
      kb.store(out, kb.gep(kb.arg("dst"), elem, offset));
    });
    // The last count % 8 elements, one a thread.
    kb.for_range(ir.CreateAdd(ir.CreateMul(vectors, kb.c64(kVector)), first), count, stride, [&](Value* i) {
      kb.store(scaled(kb.load(elem, kb.gep(kb.arg("src"), elem, i))), kb.gep(kb.arg("dst"), elem, i));
    });
  });
  kb.finish();
  return {"grad_scale", kThreads, 0, kb.signature()};
}

}  // namespace lfce
