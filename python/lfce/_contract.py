"""The operators' contract that both implementations (CUDA: _ops.py's, CPU tensors: _cpu.py's) check
and follow: a direct call's class weights and lse, whether the forward computes the gradients, the
length of the lse output."""

import torch

from . import _lib
from ._bridge import statistics_dtype
from .errors import InvalidArgumentError


def check_class_weight(class_weight, valid_count=None):
    """The operators' own check of what the kernels read as float*: the functional layer converts
    class weights to fp32, a direct operator call must pass them so; the backward's valid_count
    must hold the three counts then."""
    if class_weight is None:
        return
    if class_weight.dtype != torch.float32:
        raise InvalidArgumentError(f"lfce operators: class_weight must be torch.float32, got {class_weight.dtype}")
    if valid_count is not None and valid_count.numel() < 3:
        raise InvalidArgumentError("lfce::backward: with class_weight, valid_count must hold 3 counts (as "
                                   f"lfce::forward returns it), got {valid_count.numel()}")


DIFFERENTIABLE_OUTPUTS = _lib.OUTPUT_ENTROPY | _lib.OUTPUT_LOGPROB


def eager(mode, reduction, outputs):
    """Whether the forward computes the gradients: mode "eager" needs a scalar loss and no entropy
    or logprob row (their gradients come after the forward); otherwise it recomputes. (Which
    schedule lfce_forward_backward then runs is the library's choice: lfce_eager_schedule.)"""
    return mode == "eager" and reduction != "none" and not outputs & DIFFERENTIABLE_OUTPUTS


def lse_size(n, token_scaling, outputs):
    """The forward's lse: the N LSEs, then with token scaling the N scales p(target), then the N
    entropies and the N logprobs where asked for (lfce.h)."""
    return _lib.lse_rows(token_scaling, outputs) * n


def check_lse(hidden, lse, grad_lse, token_scaling, outputs):
    """The backward's lse and grad_lse as lfce::forward made lse: the kernels would read past a
    shorter one, or one row as another; and grad_lse not with fp16 (the library refuses it)."""
    n = hidden.shape[0]
    expected = lse_size(n, token_scaling, outputs)
    if lse.numel() != expected:
        raise InvalidArgumentError(f"lfce::backward: lse must hold {expected} values for {n} tokens with "
                                   f"token_scaling={token_scaling} and outputs={outputs} (as lfce::forward returns "
                                   f"it), got {lse.numel()}")
    if grad_lse is None:
        return
    if grad_lse.numel() != expected or grad_lse.dtype != statistics_dtype(hidden):
        raise InvalidArgumentError(f"lfce::backward: grad_lse must be {statistics_dtype(hidden)} with {expected} "
                                   f"values, like lse, got {grad_lse.dtype} with {grad_lse.numel()}")
    if hidden.dtype == torch.float16:
        raise InvalidArgumentError("lfce::backward: grad_lse (a gradient of the lse, entropy or logprob outputs) is "
                                   "not supported with torch.float16 inputs; use torch.bfloat16 or torch.float32")
