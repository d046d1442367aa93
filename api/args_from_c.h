// The C API's argument structs as the runtime takes them (runtime/launch.h), field by field by
// name: the only place lfce_forward_args and lfce_backward_args meet the runtime.
#pragma once

#include "lfce/lfce.h"
#include "runtime/launch.h"

namespace lfce::api {

inline runtime::ForwardArgs forward_args_from_c(const lfce_forward_args& c) {
  runtime::ForwardArgs a;
  a.hidden = c.hidden;
  a.weight = c.weight;
  a.bias = c.bias;
  a.targets = c.targets;
  a.class_weight = c.class_weight;
  a.lse = c.lse;
  a.token_loss = c.token_loss;
  a.loss = c.loss;
  a.valid_count = c.valid_count;
  a.predicted = c.predicted;
  a.workspace = c.workspace;
  a.workspace_bytes = c.workspace_bytes;
  a.device = c.device;
  a.stream = c.stream;
  return a;
}

inline runtime::BackwardArgs backward_args_from_c(const lfce_backward_args& c) {
  runtime::BackwardArgs a;
  a.hidden = c.hidden;
  a.weight = c.weight;
  a.bias = c.bias;
  a.targets = c.targets;
  a.class_weight = c.class_weight;
  a.lse = c.lse;
  a.valid_count = c.valid_count;
  a.grad_loss = c.grad_loss;
  a.grad_lse = c.grad_lse;
  a.grad_hidden = c.grad_hidden;
  a.grad_weight = c.grad_weight;
  a.grad_bias = c.grad_bias;
  a.workspace = c.workspace;
  a.workspace_bytes = c.workspace_bytes;
  a.device = c.device;
  a.stream = c.stream;
  return a;
}

}  // namespace lfce::api
