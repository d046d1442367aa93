// lse_combine: one thread per token merges the per-split (max, Σ exp) partials of
// lse_forward into LSE_i and the per-token loss ℓ_i = LSE_i − z_{i,y_i}, plus the z-loss
// s·LSE_i² where the spec has one (0 when y_i is ignore_index; NaN when y_i is outside [0, V),
// so a bad target is loud, not silent). LSE and z_y are those of the logits the softmax sees.
// With class weights w the cross-entropy term is w_y·(LSE − z_y); with label smoothing eps it
// is (1 − eps)·w_y·(LSE − z_y) + eps / V · (W·LSE − Σ_v w_v·z_v), W = Σ_v w_v (V without class
// weights), from lse_forward's per-split partial Σ w_v·z_v and W summed here; thread 0 of
// CTA 0 writes W to valid_count[2] for the backward. With token scaling the loss is multiplied by
// the token's detached p(target) = exp(z_y − LSE), stored at lse[N + i] for the backward (0 for an
// ignored token, NaN for a target outside [0, V)). The extra outputs (lfce.h's lfce_output): the
// entropy H = ln s − t / s from the partial t of lse_forward (every token), the logprob z_y − LSE
// (0 for an ignored token, NaN for a target outside [0, V)), each in its row of lse, and the
// predicted id (the first split's argmax among equal maxima; -1 for an ignored token).
#include "templates/template_util.h"
#include "templates/templates.h"

namespace lfce {

using llvm::Value;

KernelShape build_lse_combine(llvm::Module& module, const KernelSpec& spec) {
  constexpr int kThreads = kLseCombineThreads;
  const bool smoothing = spec.label_smoothing != 0.f;
  std::vector<Param> params = {{"partial_max", ParamType::GlobalPtr}, {"partial_sum", ParamType::GlobalPtr},
                               {"target_logit", ParamType::GlobalPtr}, {"targets", ParamType::GlobalPtr},
                               {"n", ParamType::I64}, {"ignore_index", ParamType::I64}, {"splits", ParamType::I32},
                               {"lse", ParamType::GlobalPtr}, {"token_loss", ParamType::GlobalPtr}};
  if (smoothing) params.push_back({"partial_logit_sum", ParamType::GlobalPtr});
  if (spec.class_weight) params.push_back({"class_weight", ParamType::GlobalPtr});
  if (smoothing && spec.class_weight) params.push_back({"valid_count", ParamType::GlobalPtr});
  if (spec.entropy) params.push_back({"partial_entropy", ParamType::GlobalPtr});
  if (spec.argmax) {
    params.push_back({"partial_argmax", ParamType::GlobalPtr});
    params.push_back({"predicted", ParamType::GlobalPtr});
  }
  add_shift_param(spec, params);
  KernelBuilder kb(module, "lse_combine", params, kThreads);
  auto& ir = kb.ir();
  // Σ_v w_v, or V: every CTA sums the V weights in the same fixed order (each thread the v ≡ tid
  // modulo the CTA's threads, then a tree over the threads in shared memory), so every token reads
  // the same W. (Summed here, not in lse_forward: there it cost a wgmma tile's registers.)
  Value* weight_sum = kb.cf(static_cast<float>(spec.vocab));
  if (smoothing && spec.class_weight) {
    Value* total = kb.local_array(kb.f32(), 1, "weight_sum");
    kb.store(kb.cf(0.f), kb.at(total, kb.f32(), 0));
    Value* tid = kb.tid();
    kb.for_range(ir.CreateZExt(tid, kb.i64()), kb.c64(spec.vocab), kb.c64(kThreads), [&](Value* v) {
      Value* slot = kb.at(total, kb.f32(), 0);
      kb.store(ir.CreateFAdd(kb.load(kb.f32(), slot), load_class_weight(kb, spec, v)), slot);
    });
    auto slot_of = [&](Value* i) { return kb.smem(ir.CreateMul(i, kb.c32(4))); };
    kb.store(kb.load(kb.f32(), kb.at(total, kb.f32(), 0)), slot_of(tid));
    kb.barrier();
    for (int stride = kThreads / 2; stride >= 1; stride /= 2) {
      kb.if_then(ir.CreateICmpULT(tid, kb.c32(stride)), [&] {
        Value* sum = ir.CreateFAdd(kb.load(kb.f32(), slot_of(tid)),
                                   kb.load(kb.f32(), slot_of(ir.CreateAdd(tid, kb.c32(stride)))));
        kb.store(sum, slot_of(tid));
      });
      kb.barrier();
    }
    weight_sum = kb.load(kb.f32(), kb.smem(kb.c32(0)));
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
    // The entropy's t and the argmax, merged split by split beside (max, sum).
    Value* entropy_slot = spec.entropy ? kb.at(kb.local_array(kb.f32(), 1, "entropy_t"), kb.f32(), 0) : nullptr;
    Value* argmax_slot = spec.argmax ? kb.at(kb.local_array(kb.i32(), 1, "argmax"), kb.i32(), 0) : nullptr;
    if (spec.entropy) kb.store(kb.cf(0.f), entropy_slot);
    if (spec.argmax) kb.store(kb.c32(-1), argmax_slot);
    kb.for_range(kb.c64(0), splits, kb.c64(1), [&](Value* s) {
      Value* index = ir.CreateAdd(ir.CreateMul(s, n), m);
      Value* pmax = kb.load(kb.f32(), kb.gep(kb.arg("partial_max"), kb.f32(), index));
      Value* psum = kb.load(kb.f32(), kb.gep(kb.arg("partial_sum"), kb.f32(), index));
      // A split with no vocabulary tiles reports (-inf, 0): skip it, exp(-inf - -inf) is NaN.
      kb.if_then(ir.CreateFCmpOGT(psum, kb.cf(0.f)), [&] {
        Value* old_max = kb.load(kb.f32(), max_slot);
        Value* old_sum = kb.load(kb.f32(), sum_slot);
        Value* new_max = kb.fmax(old_max, pmax);
        Value* merged = ir.CreateFAdd(ir.CreateFMul(old_sum, kb.exp(ir.CreateFSub(old_max, new_max))),
                                      ir.CreateFMul(psum, kb.exp(ir.CreateFSub(pmax, new_max))));
        kb.store(new_max, max_slot);
        kb.store(merged, sum_slot);
        if (spec.entropy) {
          Value* pt = kb.load(kb.f32(), kb.gep(kb.arg("partial_entropy"), kb.f32(), index));
          kb.store(merged_entropy(kb, new_max, old_max, old_sum, kb.load(kb.f32(), entropy_slot), pmax, psum, pt),
                   entropy_slot);
        }
        if (spec.argmax) {
          Value* pi = kb.load(kb.i32(), kb.gep(kb.arg("partial_argmax"), kb.i32(), index));
          kb.store(merged_argmax(kb, old_max, kb.load(kb.i32(), argmax_slot), pmax, pi), argmax_slot);
        }
      });
    });
    Value* lse = ir.CreateFAdd(kb.load(kb.f32(), max_slot), kb.log(kb.load(kb.f32(), sum_slot)));
    kb.store(lse, kb.gep(kb.arg("lse"), kb.f32(), m));
    if (spec.entropy) {
      Value* sum = kb.load(kb.f32(), sum_slot);
      Value* entropy = ir.CreateFSub(kb.log(sum), kb.div_full(kb.load(kb.f32(), entropy_slot), sum));
      kb.store(entropy, lse_row_at(kb, kb.arg("lse"), lse_row_entropy(spec), n, m));
    }
    Value* target = load_target(kb, spec, kb.arg("targets"), m, kb.arg("ignore_index"));
    Value* ignored = ir.CreateICmpEQ(target, kb.arg("ignore_index"));
    Value* in_range = ir.CreateAnd(ir.CreateICmpSGE(target, kb.c64(0)), ir.CreateICmpSLT(target, kb.c64(spec.vocab)));
    Value* loss_slot = kb.gep(kb.arg("token_loss"), kb.f32(), m);
    Value* scale_slot = spec.token_scaling ? lse_row_at(kb, kb.arg("lse"), lse_row_scale(spec), n, m) : nullptr;
    Value* logprob_slot = spec.logprob ? lse_row_at(kb, kb.arg("lse"), lse_row_logprob(spec), n, m) : nullptr;
    if (spec.argmax)
      kb.store(ir.CreateSelect(ignored, kb.c64(-1), ir.CreateSExt(kb.load(kb.i32(), argmax_slot), kb.i64())),
               kb.gep(kb.arg("predicted"), kb.i64(), m));
    kb.if_then_else(
        ignored,
        [&] {
          kb.store(kb.cf(0.f), loss_slot);
          if (scale_slot) kb.store(kb.cf(0.f), scale_slot);
          if (logprob_slot) kb.store(kb.cf(0.f), logprob_slot);
        },
        [&] {
          kb.if_then_else(
              in_range,
              [&] {
                Value* z = kb.load(kb.f32(), kb.gep(kb.arg("target_logit"), kb.f32(), m));
                Value* loss = ir.CreateFSub(lse, z);
                if (logprob_slot) kb.store(ir.CreateFNeg(loss), logprob_slot);
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
                if (logprob_slot) kb.store(llvm::ConstantFP::getNaN(kb.f32()), logprob_slot);
              });
        });
  });
  kb.finish();
  return {"lse_combine", kThreads, smoothing && spec.class_weight ? kThreads * 4 : 0, kb.signature()};
}

}  // namespace lfce
