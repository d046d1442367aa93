"""``LinearCrossEntropyLoss``: the fused loss as an ``nn.Module``."""

from __future__ import annotations

import torch

from . import _check
from .functional import (
    EXTRA_OUTPUTS,
    check_class_weight,
    linear_cross_entropy,
    validate_options,
)

__all__ = ["LinearCrossEntropyLoss"]


class LinearCrossEntropyLoss(torch.nn.Module):
    """Module form of :func:`lfce.linear_cross_entropy`.

    The options are fixed at construction (and checked there); the weight is passed
    to ``forward`` so the module can share the model's output projection::

        loss_fn = lfce.LinearCrossEntropyLoss(ignore_index=-100)
        loss = loss_fn(hidden_states, model.lm_head.weight, labels)

    Args: see :func:`lfce.linear_cross_entropy` (ignore_index, reduction, mode,
    chunk_size, workspace_budget, softcap, temperature, z_loss_scale, label_smoothing,
    class_weight, return_z_loss, shift, token_scaling, and the extra outputs return_lse,
    return_entropy, return_logprob, return_accuracy, return_predicted: with any of them set, forward
    returns an :class:`lfce.LossOutput`). ``class_weight`` is a registered buffer, as
    ``torch.nn.CrossEntropyLoss``'s ``weight``: it follows ``module.to(device)`` and is in the
    state dict; its length and device are checked against the inputs at each call.

    The gradient accumulators are arguments of ``forward``, not of the module: like the weight,
    the fp32 buffer (Megatron's ``main_grad``) belongs to the parameter, and a module shared by
    several heads or rebuilt buffers must not hold a stale one::

        loss = loss_fn(hidden_states, head.weight, labels, weight_grad_accumulator=head.weight.main_grad)

    The backward then adds grad_weight into ``head.weight.main_grad`` and leaves ``head.weight.grad``
    untouched (see :func:`lfce.linear_cross_entropy` for when it is filled); recompute mode only.
    """

    class_weight: torch.Tensor | None

    def __init__(self, *, ignore_index=-100, reduction="mean", mode="recompute", chunk_size=None,
                 workspace_budget=None, softcap=None, temperature=None, z_loss_scale=None, label_smoothing=None,
                 class_weight=None, return_z_loss=False, shift=False, token_scaling=False, return_lse=False,
                 return_entropy=False, return_logprob=False, return_accuracy=False, return_predicted=False):
        super().__init__()
        self.extra_outputs = dict(zip(EXTRA_OUTPUTS, (return_lse, return_entropy, return_logprob, return_accuracy,
                                                      return_predicted)))
        validate_options(ignore_index, reduction, mode, chunk_size, workspace_budget, softcap, temperature, z_loss_scale,
                         return_z_loss, label_smoothing, token_scaling, self.extra_outputs)
        check_class_weight(class_weight)
        self.register_buffer("class_weight", class_weight)
        self.softcap = softcap
        self.temperature = temperature
        self.z_loss_scale = z_loss_scale
        self.label_smoothing = label_smoothing
        self.return_z_loss = return_z_loss
        self.token_scaling = token_scaling
        _check.flag("shift", shift)
        self.shift = shift
        self.ignore_index = ignore_index
        self.reduction = reduction
        self.mode = mode
        self.chunk_size = chunk_size
        self.workspace_budget = workspace_budget

    def forward(self, hidden, weight, targets, bias=None, *, weight_grad_accumulator=None, bias_grad_accumulator=None):
        """Loss of ``hidden @ weight.T + bias`` against ``targets``; with an accumulator, the backward
        adds grad_weight (grad_bias) into it instead of giving weight (bias) a gradient. See
        linear_cross_entropy."""
        return linear_cross_entropy(
            hidden, weight, targets, bias, ignore_index=self.ignore_index, reduction=self.reduction,
            mode=self.mode, chunk_size=self.chunk_size, workspace_budget=self.workspace_budget,
            softcap=self.softcap, temperature=self.temperature, z_loss_scale=self.z_loss_scale,
            label_smoothing=self.label_smoothing, class_weight=self.class_weight, return_z_loss=self.return_z_loss,
            weight_grad_accumulator=weight_grad_accumulator, bias_grad_accumulator=bias_grad_accumulator,
            shift=self.shift, token_scaling=self.token_scaling, **self.extra_outputs,
        )

    def extra_repr(self):
        options = [f"ignore_index={self.ignore_index!r}", f"reduction={self.reduction!r}", f"mode={self.mode!r}"]
        for name in ("chunk_size", "workspace_budget", "softcap", "temperature", "z_loss_scale", "label_smoothing"):
            if getattr(self, name) is not None:
                options.append(f"{name}={getattr(self, name)!r}")
        if self.class_weight is not None:
            options.append(f"class_weight=[{self.class_weight.shape[0]}]")
        if self.return_z_loss:
            options.append("return_z_loss=True")
        if self.shift:
            options.append("shift=True")
        if self.token_scaling:
            options.append("token_scaling=True")
        options.extend(f"{name}=True" for name, value in self.extra_outputs.items() if value)
        return ", ".join(options)
