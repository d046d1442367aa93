// loss_reduce: one CTA sums the per-token losses and counts the non-ignored targets, in a
// fixed order (strided per-thread sums, then a tree), so the result is the same every run.
// Writes the count (the mean's denominator, kept on the device: no host sync) and the
// reduced loss: sum, or sum / count for mean (NaN when every target is ignored, as PyTorch).
#include "templates/template_util.h"
#include "templates/templates.h"

namespace lfce {

using llvm::Value;

KernelShape build_loss_reduce(llvm::Module& module, const KernelSpec& spec) {
  constexpr int kThreads = 1024;
  KernelBuilder kb(module, "loss_reduce",
                   {{"token_loss", ParamType::GlobalPtr}, {"targets", ParamType::GlobalPtr},
                    {"n", ParamType::I64}, {"ignore_index", ParamType::I64},
                    {"loss", ParamType::GlobalPtr}, {"valid_count", ParamType::GlobalPtr}},
                   kThreads);
  auto& ir = kb.ir();
  Value* tid = kb.tid();
  Value* acc = kb.local_array(kb.f32(), 2, "acc");
  Value* sum_slot = kb.at(acc, kb.f32(), 0);
  Value* count_slot = kb.at(acc, kb.f32(), 1);
  kb.store(kb.cf(0.f), sum_slot);
  kb.store(kb.cf(0.f), count_slot);
  kb.for_range(ir.CreateZExt(tid, kb.i64()), kb.arg("n"), kb.c64(kThreads), [&](Value* m) {
    Value* target = load_target(kb, spec, kb.arg("targets"), m);
    Value* valid = ir.CreateICmpNE(target, kb.arg("ignore_index"));
    Value* loss = kb.load(kb.f32(), kb.gep(kb.arg("token_loss"), kb.f32(), m));
    kb.store(ir.CreateFAdd(kb.load(kb.f32(), sum_slot), loss), sum_slot);
    kb.store(ir.CreateFAdd(kb.load(kb.f32(), count_slot), ir.CreateSelect(valid, kb.cf(1.f), kb.cf(0.f))),
             count_slot);
  });
  // Tree over shared memory: [0, 1024) sums, [1024, 2048) counts.
  auto slot = [&](Value* i, int base) { return kb.smem(ir.CreateMul(ir.CreateAdd(i, kb.c32(base)), kb.c32(4))); };
  kb.store(kb.load(kb.f32(), sum_slot), slot(tid, 0));
  kb.store(kb.load(kb.f32(), count_slot), slot(tid, kThreads));
  for (int stride = kThreads / 2; stride > 0; stride /= 2) {
    kb.barrier();
    kb.if_then(ir.CreateICmpULT(tid, kb.c32(stride)), [&] {
      Value* other = ir.CreateAdd(tid, kb.c32(stride));
      for (int base : {0, kThreads})
        kb.store(ir.CreateFAdd(kb.load(kb.f32(), slot(tid, base)), kb.load(kb.f32(), slot(other, base))),
                 slot(tid, base));
    });
  }
  kb.if_then(ir.CreateICmpEQ(tid, kb.c32(0)), [&] {
    Value* sum = kb.load(kb.f32(), slot(tid, 0));
    Value* count = kb.load(kb.f32(), slot(tid, kThreads));
    kb.store(count, kb.arg("valid_count"));
    if (spec.reduction != Reduction::None)
      kb.store(spec.reduction == Reduction::Mean ? ir.CreateFDiv(sum, count) : sum, kb.arg("loss"));
  });
  kb.finish();
  return {"loss_reduce", kThreads, 8 * kThreads};
}

}  // namespace lfce
