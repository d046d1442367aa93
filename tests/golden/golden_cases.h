// The problem options the two golden records cover (ptx_golden_test.cpp: the PTX of every
// kernel a problem launches; launch_trace_test.cpp: every launch the C API makes), each under a
// name written here by hand. Both records are keyed by these names, not by KernelSpec's text, so
// that they stay comparable through a redesign that changes how a spec is spelled.
#pragma once

#include <cstdint>

#include "lfce/lfce.h"

namespace lfce::golden {

// One option (or a combination) applied to a problem. lse_grad: the backward also takes the
// gradients of the lse rows (lfce_backward_args.grad_lse), which lfce_problem does not carry.
struct Option {
  const char* name;
  void (*apply)(lfce_problem&);
  bool lse_grad = false;
};

// Sequences of this many tokens for the causal shift (every shape's token count is a multiple).
constexpr int64_t kSequenceLength = 8;

inline lfce_problem problem(int64_t tokens, int64_t hidden, int64_t vocab, lfce_dtype dtype, lfce_mode mode) {
  lfce_problem p{};
  p.tokens = tokens;
  p.hidden = hidden;
  p.vocab = vocab;
  p.dtype = dtype;
  p.target_dtype = LFCE_INDEX_INT64;
  p.reduction = LFCE_REDUCTION_MEAN;
  p.mode = mode;
  p.ignore_index = -100;
  return p;
}

// Each option on its own.
inline const Option kOptions[] = {
    {"plain", [](lfce_problem&) {}},
    {"bias", [](lfce_problem& p) { p.has_bias = 1; }},
    {"softcap", [](lfce_problem& p) { p.softcap = 30.f; }},
    {"temperature", [](lfce_problem& p) { p.temperature = 0.7f; }},
    {"z_loss", [](lfce_problem& p) { p.z_loss_scale = 1e-4f; }},
    {"label_smoothing", [](lfce_problem& p) { p.label_smoothing = 0.1f; }},
    {"class_weight", [](lfce_problem& p) { p.has_class_weight = 1; }},
    {"token_scaling", [](lfce_problem& p) { p.token_scaling = 1; }},
    {"shift", [](lfce_problem& p) { p.sequence_length = kSequenceLength; }},
    {"entropy", [](lfce_problem& p) { p.outputs = LFCE_OUTPUT_ENTROPY; }},
    {"logprob", [](lfce_problem& p) { p.outputs = LFCE_OUTPUT_LOGPROB; }},
    {"predicted", [](lfce_problem& p) { p.outputs = LFCE_OUTPUT_PREDICTED; }},
    {"entropy_logprob_grad", [](lfce_problem& p) { p.outputs = LFCE_OUTPUT_ENTROPY | LFCE_OUTPUT_LOGPROB; }, true},
    {"accumulate_grads",
     [](lfce_problem& p) {
       p.has_bias = 1;
       p.accumulate_grad_weight = 1;
       p.accumulate_grad_bias = 1;
     }},
    {"reduction_sum", [](lfce_problem& p) { p.reduction = LFCE_REDUCTION_SUM; }},
    {"reduction_none", [](lfce_problem& p) { p.reduction = LFCE_REDUCTION_NONE; }},
    {"targets_i32", [](lfce_problem& p) { p.target_dtype = LFCE_INDEX_INT32; }},
};

// A few combinations, as models use them.
inline const Option kCombinations[] = {
    {"softcap_shift", [](lfce_problem& p) {  // Gemma 2
       p.softcap = 30.f;
       p.sequence_length = kSequenceLength;
     }},
    {"smoothing_class_weight_z_loss", [](lfce_problem& p) {
       p.label_smoothing = 0.1f;
       p.has_class_weight = 1;
       p.z_loss_scale = 1e-4f;
     }},
    {"temperature_z_loss_token_scaling_i32", [](lfce_problem& p) {
       p.temperature = 0.7f;
       p.z_loss_scale = 1e-4f;
       p.token_scaling = 1;
       p.target_dtype = LFCE_INDEX_INT32;
     }},
    {"bias_softcap_temperature_smoothing_sum", [](lfce_problem& p) {
       p.has_bias = 1;
       p.softcap = 30.f;
       p.temperature = 0.7f;
       p.label_smoothing = 0.1f;
       p.reduction = LFCE_REDUCTION_SUM;
     }},
    {"all_outputs_grad_shift",
     [](lfce_problem& p) {
       p.outputs = LFCE_OUTPUT_ENTROPY | LFCE_OUTPUT_LOGPROB | LFCE_OUTPUT_PREDICTED;
       p.sequence_length = kSequenceLength;
     },
     true},
};

inline const char* dtype_label(lfce_dtype dtype) {
  return dtype == LFCE_DTYPE_BF16 ? "bf16" : dtype == LFCE_DTYPE_FP16 ? "fp16" : "fp32";
}
inline const char* mode_label(lfce_mode mode) { return mode == LFCE_MODE_EAGER ? "eager" : "recompute"; }

}  // namespace lfce::golden
