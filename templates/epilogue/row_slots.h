// The shared memory a GEMM kernel keeps for each row of its BM-row tile, after the skeleton's:
// one layout, read by the templates that use the slots and by kernel_smem_per_row (the
// shared-memory estimate the tile policy and the tuner size tiles with). A slot of `size` bytes per
// row at offset `o` holds row r at o·BM + r·size from the start of that region, so each offset is
// the bytes per row of the slots before it.
#pragma once

#include "compiler/kernel_kind.h"
#include "compiler/kernel_spec.h"
#include "templates/template_util.h"

namespace lfce {

struct RowSlots {
  static constexpr int kNone = -1;
  // lse_forward: the running max and sum-exp (f32), the target (i64); then, where the spec has
  // them, label smoothing's logit sum, the entropy's sum (f32) and the argmax (i32).
  int max = kNone, sum = kNone, target = kNone, logit_sum = kNone, entropy = kNone, argmax = kNone;
  // dlogits_backward: the LSE and g (f32), the target (i64); with row terms (dz_math.h's P/T/U
  // form) P and T, with the entropy's gradient q (f32). (target as above.)
  int lse = kNone, g = kNone, p = kNone, t = kNone, q = kNone;
  int bytes = 0;  // per row, all slots

  int add(int size) {
    const int at = bytes;
    bytes += size;
    return at;
  }
};

inline RowSlots row_slots(const KernelSpec& spec) {
  RowSlots s;
  switch (spec.kind) {
    case KernelKind::LseForward:
      s.max = s.add(4);
      s.sum = s.add(4);
      s.target = s.add(8);
      if (spec.label_smoothing != 0.f) s.logit_sum = s.add(4);
      if (spec.entropy) s.entropy = s.add(4);
      if (spec.argmax) s.argmax = s.add(4);
      break;
    case KernelKind::DlogitsBackward:
      s.lse = s.add(4);
      s.g = s.add(4);
      s.target = s.add(8);
      if (has_target_terms(spec) || spec.lse_grad) {
        s.p = s.add(4);
        s.t = s.add(4);
      }
      if (spec.lse_grad && spec.entropy) s.q = s.add(4);
      break;
    case KernelKind::EagerLogits:
      // The staged form's row maxima; a row keeps lse_forward's 16 bytes (its tiles are sized alike).
      s.max = s.add(4);
      s.add(12);
      break;
    default:
      break;
  }
  return s;
}

// Row r's slot in shared memory: the slot's rows start at byte offset `base` (the region's
// offset plus o·BM), `bytes` bytes each.
inline llvm::Value* row_slot_at(KernelBuilder& kb, int base, llvm::Value* r, int bytes) {
  auto& ir = kb.ir();
  return kb.smem(ir.CreateAdd(kb.c32(base), ir.CreateMul(r, kb.c32(bytes))));
}

}  // namespace lfce
