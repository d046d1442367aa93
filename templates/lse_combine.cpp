// lse_combine: one thread per token merges the per-split (max, Σ exp) partials of
// lse_forward into LSE_i and the per-token loss ℓ_i = LSE_i − z_{i,y_i}, plus the z-loss
// s·LSE_i² where the spec has one (0 when y_i is ignore_index; NaN when y_i is outside [0, V),
// so a bad target is loud, not silent). LSE and z_y are those of the logits the softmax sees.
// With class weights w the cross-entropy term is w_y·(LSE − z_y); with label smoothing eps it
// is (1 − eps)·w_y·(LSE − z_y) + eps / V · (W·LSE − Σ_v w_v·z_v), W = Σ_v w_v (V without class
// weights), from lse_forward's per-split partial Σ w_v·z_v and per-split Σ w_v; thread 0 of
// CTA 0 writes W to valid_count[2] for the backward. With token scaling the loss is multiplied by
// the token's detached p(target) = exp(z_y − LSE), stored at lse[N + i] for the backward (0 for an
// ignored token, NaN for a target outside [0, V)).
#include "templates/template_util.h"
#include "templates/templates.h"

namespace lfce {

using llvm::Value;

KernelShape build_lse_combine(llvm::Module& module, const KernelSpec& spec) {
  constexpr int kThreads = 256;
  const bool smoothing = spec.label_smoothing != 0.f;
  std::vector<Param> params = {{"partial_max", ParamType::GlobalPtr}, {"partial_sum", ParamType::GlobalPtr},
                               {"target_logit", ParamType::GlobalPtr}, {"targets", ParamType::GlobalPtr},
                               {"n", ParamType::I64}, {"ignore_index", ParamType::I64}, {"splits", ParamType::I32},
                               {"lse", ParamType::GlobalPtr}, {"token_loss", ParamType::GlobalPtr}};
  if (smoothing) params.push_back({"partial_logit_sum", ParamType::GlobalPtr});
  if (spec.class_weight) params.push_back({"class_weight", ParamType::GlobalPtr});
  if (smoothing && spec.class_weight) {
    params.push_back({"weight_total", ParamType::GlobalPtr});
    params.push_back({"valid_count", ParamType::GlobalPtr});
  }
  KernelBuilder kb(module, "lse_combine", params, kThreads);
  auto& ir = kb.ir();
  // Σ_v w_v: the splits' totals in split order (every thread the same sum), or V.
  Value* weight_sum = kb.cf(static_cast<float>(spec.vocab));
  if (smoothing && spec.class_weight) {
    Value* total = kb.local_array(kb.f32(), 1, "weight_sum");
    kb.store(kb.cf(0.f), kb.at(total, kb.f32(), 0));
    kb.for_range(kb.c64(0), ir.CreateZExt(kb.arg("splits"), kb.i64()), kb.c64(1), [&](Value* s) {
      Value* slot = kb.at(total, kb.f32(), 0);
      kb.store(ir.CreateFAdd(kb.load(kb.f32(), slot), kb.load(kb.f32(), kb.gep(kb.arg("weight_total"), kb.f32(), s))),
               slot);
    });
    weight_sum = kb.load(kb.f32(), kb.at(total, kb.f32(), 0));
    kb.if_then(ir.CreateAnd(ir.CreateICmpEQ(kb.ctaid(0), kb.c32(0)), ir.CreateICmpEQ(kb.tid(), kb.c32(0))), [&] {
      kb.store(weight_sum, kb.gep(kb.arg("valid_count"), kb.f32(), kb.c64(2)));
    });
  }
  Value* n = kb.arg("n");
  Value* m = ir.CreateAdd(ir.CreateMul(ir.CreateZExt(kb.ctaid(0), kb.i64()), kb.c64(kThreads)),
                          ir.CreateZExt(kb.tid(), kb.i64()));
  kb.if_then(ir.CreateICmpSLT(m, n), [&] {
    Value* splits = ir.CreateZExt(kb.arg("splits"), kb.i64());
    Value* best = kb.local_array(kb.f32(), 2, "stats");
    Value* max_slot = kb.at(best, kb.f32(), 0);
    Value* sum_slot = kb.at(best, kb.f32(), 1);
    kb.store(neg_inf(kb), max_slot);
    kb.store(kb.cf(0.f), sum_slot);
    kb.for_range(kb.c64(0), splits, kb.c64(1), [&](Value* s) {
      Value* index = ir.CreateAdd(ir.CreateMul(s, n), m);
      Value* pmax = kb.load(kb.f32(), kb.gep(kb.arg("partial_max"), kb.f32(), index));
      Value* psum = kb.load(kb.f32(), kb.gep(kb.arg("partial_sum"), kb.f32(), index));
      // A split with no vocabulary tiles reports (-inf, 0): skip it, exp(-inf - -inf) is NaN.
      kb.if_then(ir.CreateFCmpOGT(psum, kb.cf(0.f)), [&] {
        Value* old_max = kb.load(kb.f32(), max_slot);
        Value* new_max = kb.fmax(old_max, pmax);
        Value* merged = ir.CreateFAdd(ir.CreateFMul(kb.load(kb.f32(), sum_slot), kb.exp(ir.CreateFSub(old_max, new_max))),
                                      ir.CreateFMul(psum, kb.exp(ir.CreateFSub(pmax, new_max))));
        kb.store(new_max, max_slot);
        kb.store(merged, sum_slot);
      });
    });
    Value* lse = ir.CreateFAdd(kb.load(kb.f32(), max_slot), kb.log(kb.load(kb.f32(), sum_slot)));
    kb.store(lse, kb.gep(kb.arg("lse"), kb.f32(), m));
    Value* target = load_target(kb, spec, kb.arg("targets"), m);
    Value* ignored = ir.CreateICmpEQ(target, kb.arg("ignore_index"));
    Value* in_range = ir.CreateAnd(ir.CreateICmpSGE(target, kb.c64(0)), ir.CreateICmpSLT(target, kb.c64(spec.vocab)));
    Value* loss_slot = kb.gep(kb.arg("token_loss"), kb.f32(), m);
    Value* scale_slot = spec.token_scaling ? kb.gep(kb.arg("lse"), kb.f32(), ir.CreateAdd(n, m)) : nullptr;
    kb.if_then_else(
        ignored,
        [&] {
          kb.store(kb.cf(0.f), loss_slot);
          if (scale_slot) kb.store(kb.cf(0.f), scale_slot);
        },
        [&] {
          kb.if_then_else(
              in_range,
              [&] {
                Value* z = kb.load(kb.f32(), kb.gep(kb.arg("target_logit"), kb.f32(), m));
                Value* loss = ir.CreateFSub(lse, z);
                if (spec.class_weight) loss = ir.CreateFMul(loss, load_class_weight(kb, spec, target));
                if (smoothing) {
                  Value* logit_sum = kb.local_array(kb.f32(), 1, "logit_sum");
                  kb.store(kb.cf(0.f), kb.at(logit_sum, kb.f32(), 0));
                  kb.for_range(kb.c64(0), splits, kb.c64(1), [&](Value* s) {
                    Value* slot = kb.at(logit_sum, kb.f32(), 0);
                    Value* part = kb.load(kb.f32(), kb.gep(kb.arg("partial_logit_sum"), kb.f32(), ir.CreateAdd(ir.CreateMul(s, n), m)));
                    kb.store(ir.CreateFAdd(kb.load(kb.f32(), slot), part), slot);
                  });
                  const float eps = spec.label_smoothing;
                  Value* smooth = ir.CreateFSub(ir.CreateFMul(weight_sum, lse), kb.load(kb.f32(), kb.at(logit_sum, kb.f32(), 0)));
                  smooth = ir.CreateFMul(smooth, kb.cf(eps / static_cast<float>(spec.vocab)));
                  loss = ir.CreateFAdd(ir.CreateFMul(loss, kb.cf(1.f - eps)), smooth);
                }
                if (Value* z_loss = z_loss_term(kb, spec, lse)) loss = ir.CreateFAdd(loss, z_loss);
                if (scale_slot) {
                  Value* scale = kb.exp(ir.CreateFSub(z, lse));
                  loss = ir.CreateFMul(loss, scale);
                  kb.store(scale, scale_slot);
                }
                kb.store(loss, loss_slot);
              },
              [&] {
                kb.store(llvm::ConstantFP::getNaN(kb.f32()), loss_slot);
                if (scale_slot) kb.store(llvm::ConstantFP::getNaN(kb.f32()), scale_slot);
              });
        });
  });
  kb.finish();
  return {"lse_combine", kThreads, 0};
}

}  // namespace lfce
