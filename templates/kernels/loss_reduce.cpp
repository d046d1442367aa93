// loss_reduce: one CTA sums the per-token losses and counts the non-ignored targets, in a
// fixed order (token_sums.h), so the result is the same every run.
// Writes the count (the mean's denominator, kept on the device: no host sync) and the
// reduced loss: sum, or sum / count for mean (NaN when every target is ignored, as PyTorch).
// With class weights it also writes valid_count[1] = Σ w_y over the counted tokens, the mean's
// denominator of the cross-entropy (and smoothing) terms; the z-loss part of each token's loss,
// s·LSE², keeps the count as its own (as Liger-Kernel's): mean = (Σ loss − Σ z) / Σ w_y + Σ z / count.
#include "templates/kernels/token_sums.h"
#include "templates/templates.h"

namespace lfce {

using llvm::Value;

KernelShape build_loss_reduce(llvm::Module& module, const KernelSpec& spec) {
  std::vector<Param> params = {{"token_loss", ParamType::GlobalPtr}, {"targets", ParamType::GlobalPtr},
                               {"n", ParamType::I64}, {"ignore_index", ParamType::I64},
                               {"loss", ParamType::GlobalPtr}, {"valid_count", ParamType::GlobalPtr}};
  add_token_sum_params(spec, params);
  const std::string name(kind_name(spec.kind));
  KernelBuilder kb(module, name, params, kTokenSumThreads);
  auto& ir = kb.ir();
  auto token_loss = [&](Value* m) { return kb.load(kb.f32(), kb.gep(kb.arg("token_loss"), kb.f32(), m)); };
  sum_tokens(kb, spec, token_loss, [&](const TokenTotals& totals) {
    Value* mean = nullptr;
    if (spec.class_weight) {
      if (spec.z_loss_scale != 0.f) {
        Value* z_sum = totals.total(3);
        mean = ir.CreateFAdd(ir.CreateFDiv(ir.CreateFSub(totals.loss, z_sum), totals.weight),
                             ir.CreateFDiv(z_sum, totals.count));
      } else {
        mean = ir.CreateFDiv(totals.loss, totals.weight);
      }
    } else {
      mean = ir.CreateFDiv(totals.loss, totals.count);
    }
    if (spec.reduction != Reduction::None)
      kb.store(spec.reduction == Reduction::Mean ? mean : totals.loss, kb.arg("loss"));
  });
  kb.finish();
  return {name, kTokenSumThreads, kernel_smem_bytes(spec), kb.signature()};
}

}  // namespace lfce
