// The reduction loss_reduce and token_count share: one CTA sums per-token values over the N
// tokens in a fixed order (strided per-thread sums, then a tree over shared memory), so the
// result is the same every run and both kernels write the same bits for the count (and Σ w_y).
// Per-thread sums: the loss (token_count: 0 and unread), the count of non-ignored targets, and
// with class weights Σ w_y and Σ s·LSE² (the z-loss part of each token's loss).
#pragma once

#include <functional>
#include <vector>

#include "templates/template_util.h"

namespace lfce {

inline constexpr int kTokenSumThreads = 1024;

// The parameters after the kernel's own: class_weight with class weights, lse with z-loss (read
// only for mean with class weights: fields_read), and the causal shift's.
inline void add_token_sum_params(const KernelSpec& spec, std::vector<Param>& params) {
  if (spec.class_weight) params.push_back({"class_weight", ParamType::GlobalPtr});
  if (spec.z_loss_scale != 0.f) params.push_back({"lse", ParamType::GlobalPtr});
  add_shift_param(spec, params);
}

// What thread 0 holds after the tree: Σ loss, the count, Σ w_y (nullptr without class weights),
// and total(i), which loads sum i (3: Σ s·LSE², with class weights and z-loss).
struct TokenTotals {
  llvm::Value* loss;
  llvm::Value* count;
  llvm::Value* weight;
  std::function<llvm::Value*(int)> total;
};

// Sums over tokens m in [0, n): token_loss(m) (where given) into the loss sum, the count, and
// with class weights Σ w_y and Σ s·LSE² of the counted tokens. Thread 0 stores the count to
// valid_count[0] (and Σ w_y to valid_count[1]), then passes the totals to `reduced` (where given).
inline void sum_tokens(KernelBuilder& kb, const KernelSpec& spec,
                       const std::function<llvm::Value*(llvm::Value* m)>& token_loss,
                       const std::function<void(const TokenTotals&)>& reduced) {
  using llvm::Value;
  constexpr int kThreads = kTokenSumThreads;
  const bool weighted = spec.class_weight;
  const bool z_loss = spec.z_loss_scale != 0.f;
  auto& ir = kb.ir();
  Value* tid = kb.tid();
  const int sums = weighted ? 4 : 2;
  Value* acc = kb.local_array(kb.f32(), sums, "acc");
  Value* sum_slot = kb.at(acc, kb.f32(), 0);
  Value* count_slot = kb.at(acc, kb.f32(), 1);
  for (int i = 0; i < sums; ++i) kb.store(kb.cf(0.f), kb.at(acc, kb.f32(), i));
  kb.for_range(ir.CreateZExt(tid, kb.i64()), kb.arg("n"), kb.c64(kThreads), [&](Value* m) {
    Value* target = load_target(kb, spec, kb.arg("targets"), m, kb.arg("ignore_index"));
    Value* valid = ir.CreateICmpNE(target, kb.arg("ignore_index"));
    if (token_loss) {
      Value* loss = token_loss(m);
      kb.store(ir.CreateFAdd(kb.load(kb.f32(), sum_slot), loss), sum_slot);
    }
    kb.store(ir.CreateFAdd(kb.load(kb.f32(), count_slot), ir.CreateSelect(valid, kb.cf(1.f), kb.cf(0.f))), count_slot);
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
        if (spec.token_scaling)
          z = ir.CreateFMul(z, kb.load(kb.f32(), lse_row_at(kb, kb.arg("lse"), lse_row_scale(spec), kb.arg("n"), m)));
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
    TokenTotals totals{kb.load(kb.f32(), slot(tid, 0)), nullptr, nullptr,
                       [&](int i) { return kb.load(kb.f32(), slot(tid, i * kThreads)); }};
    totals.count = kb.load(kb.f32(), slot(tid, kThreads));
    kb.store(totals.count, kb.arg("valid_count"));
    if (weighted) {
      totals.weight = kb.load(kb.f32(), slot(tid, 2 * kThreads));
      kb.store(totals.weight, kb.gep(kb.arg("valid_count"), kb.f32(), kb.c64(1)));
    }
    if (reduced) reduced(totals);
  });
}

}  // namespace lfce
