// loss_reduce: one CTA sums the per-token losses and counts the non-ignored targets, in a
// fixed order (strided per-thread sums, then a tree), so the result is the same every run.
// Writes the count (the mean's denominator, kept on the device: no host sync) and the
// reduced loss: sum, or sum / count for mean (NaN when every target is ignored, as PyTorch).
// With class weights it also writes valid_count[1] = Σ w_y over the counted tokens, the mean's
// denominator of the cross-entropy (and smoothing) terms; the z-loss part of each token's loss,
// s·LSE², keeps the count as its own (as Liger-Kernel's): mean = (Σ loss − Σ z) / Σ w_y + Σ z / count.
//
// token_count (eager mode's three-GEMM schedule) is the same kernel without the losses: it writes
// the count (and Σ w_y) before any dz is formed, since eager_dz divides by them, and with the same
// per-thread order and tree, so loss_reduce later writes the same bits there.
#include "templates/template_util.h"
#include "templates/templates.h"

namespace lfce {

using llvm::Value;

KernelShape build_loss_reduce(llvm::Module& module, const KernelSpec& spec) {
  constexpr int kThreads = 1024;
  const bool losses = spec.kind == KernelKind::LossReduce;  // else token_count: the counts alone
  const bool weighted = spec.class_weight;
  const bool z_loss = spec.z_loss_scale != 0.f;  // read only for mean with class weights (fields_read)
  std::vector<Param> params = {{"token_loss", ParamType::GlobalPtr}, {"targets", ParamType::GlobalPtr},
                               {"n", ParamType::I64}, {"ignore_index", ParamType::I64},
                               {"loss", ParamType::GlobalPtr}, {"valid_count", ParamType::GlobalPtr}};
  if (!losses)
    params = {{"targets", ParamType::GlobalPtr}, {"n", ParamType::I64}, {"ignore_index", ParamType::I64},
              {"valid_count", ParamType::GlobalPtr}};
  if (weighted) params.push_back({"class_weight", ParamType::GlobalPtr});
  if (z_loss) params.push_back({"lse", ParamType::GlobalPtr});
  add_shift_param(spec, params);
  const std::string name(kind_name(spec.kind));
  KernelBuilder kb(module, name, params, kThreads);
  auto& ir = kb.ir();
  Value* tid = kb.tid();
  // Per-thread sums: loss, count, and with class weights Σ w_y and Σ s·LSE² (token_count: the loss
  // slot stays 0 and unread).
  const int sums = weighted ? 4 : 2;
  Value* acc = kb.local_array(kb.f32(), sums, "acc");
  Value* sum_slot = kb.at(acc, kb.f32(), 0);
  Value* count_slot = kb.at(acc, kb.f32(), 1);
  for (int i = 0; i < sums; ++i) kb.store(kb.cf(0.f), kb.at(acc, kb.f32(), i));
  kb.for_range(ir.CreateZExt(tid, kb.i64()), kb.arg("n"), kb.c64(kThreads), [&](Value* m) {
    Value* target = load_target(kb, spec, kb.arg("targets"), m, kb.arg("ignore_index"));
    Value* valid = ir.CreateICmpNE(target, kb.arg("ignore_index"));
    if (losses) {
      Value* loss = kb.load(kb.f32(), kb.gep(kb.arg("token_loss"), kb.f32(), m));
      kb.store(ir.CreateFAdd(kb.load(kb.f32(), sum_slot), loss), sum_slot);
    }
    kb.store(ir.CreateFAdd(kb.load(kb.f32(), count_slot), ir.CreateSelect(valid, kb.cf(1.f), kb.cf(0.f))),
             count_slot);
    if (weighted) {
      // A target outside [0, V) reads no weight (its loss is NaN already).
      Value* in_range = ir.CreateAnd(ir.CreateICmpSGE(target, kb.c64(0)), ir.CreateICmpSLT(target, kb.c64(spec.vocab)));
      Value* counted = ir.CreateAnd(valid, in_range);
      Value* w = load_class_weight(kb, spec, ir.CreateSelect(counted, target, kb.c64(0)));
      Value* slot = kb.at(acc, kb.f32(), 2);
      kb.store(ir.CreateFAdd(kb.load(kb.f32(), slot), ir.CreateSelect(counted, w, kb.cf(0.f))), slot);
      if (z_loss) {
        Value* lse = kb.load(kb.f32(), kb.gep(kb.arg("lse"), kb.f32(), m));
        Value* z = z_loss_term(kb, spec, lse);
        // With token scaling the token's loss holds its z-loss times its scale (lse[N + m]).
        if (spec.token_scaling) z = ir.CreateFMul(z, kb.load(kb.f32(), lse_row_at(kb, kb.arg("lse"), lse_row_scale(spec), kb.arg("n"), m)));
        slot = kb.at(acc, kb.f32(), 3);
        kb.store(ir.CreateFAdd(kb.load(kb.f32(), slot), ir.CreateSelect(counted, z, kb.cf(0.f))), slot);
      }
    }
  });
  // Tree over shared memory: sum i of thread t at [i·1024 + t].
  auto slot = [&](Value* i, int base) { return kb.smem(ir.CreateMul(ir.CreateAdd(i, kb.c32(base)), kb.c32(4))); };
  for (int i = 0; i < sums; ++i) kb.store(kb.load(kb.f32(), kb.at(acc, kb.f32(), i)), slot(tid, i * kThreads));
  for (int stride = kThreads / 2; stride > 0; stride /= 2) {
    kb.barrier();
    kb.if_then(ir.CreateICmpULT(tid, kb.c32(stride)), [&] {
      Value* other = ir.CreateAdd(tid, kb.c32(stride));
      for (int i = 0; i < sums; ++i) {
        const int base = i * kThreads;
        kb.store(ir.CreateFAdd(kb.load(kb.f32(), slot(tid, base)), kb.load(kb.f32(), slot(other, base))),
                 slot(tid, base));
      }
    });
  }
  kb.if_then(ir.CreateICmpEQ(tid, kb.c32(0)), [&] {
    Value* sum = kb.load(kb.f32(), slot(tid, 0));
    Value* count = kb.load(kb.f32(), slot(tid, kThreads));
    kb.store(count, kb.arg("valid_count"));
    Value* mean = nullptr;
    if (weighted) {
      Value* weight_sum = kb.load(kb.f32(), slot(tid, 2 * kThreads));
      kb.store(weight_sum, kb.gep(kb.arg("valid_count"), kb.f32(), kb.c64(1)));
      if (!losses) return;
      if (z_loss) {
        Value* z_sum = kb.load(kb.f32(), slot(tid, 3 * kThreads));
        mean = ir.CreateFAdd(ir.CreateFDiv(ir.CreateFSub(sum, z_sum), weight_sum), ir.CreateFDiv(z_sum, count));
      } else {
        mean = ir.CreateFDiv(sum, weight_sum);
      }
    } else {
      if (!losses) return;
      mean = ir.CreateFDiv(sum, count);
    }
    if (spec.reduction != Reduction::None)
      kb.store(spec.reduction == Reduction::Mean ? mean : sum, kb.arg("loss"));
  });
  kb.finish();
  return {name, kThreads, kernel_smem_bytes(spec), kb.signature()};
}

}  // namespace lfce
