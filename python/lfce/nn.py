"""``LinearCrossEntropyLoss``: the fused loss as an ``nn.Module``."""

from __future__ import annotations

import torch
from torch import Tensor

from .functional import LossOutput, _linear_cross_entropy, check_class_weight
from .options import EXTRA_OUTPUTS, LossOptions, Mode, Reduction, resolve

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
    returns an :class:`lfce.LossOutput`), or all of them as ``options=lfce.LossOptions(...)``; they are
    kept as ``module.options`` (a LossOptions). ``class_weight`` is a registered buffer, as
    ``torch.nn.CrossEntropyLoss``'s ``weight``: it follows ``module.to(device)`` and is in the
    state dict; its length and device are checked against the inputs at each call.

    The gradient accumulators are arguments of ``forward``, not of the module: like the weight,
    the fp32 buffer (Megatron's ``main_grad``) belongs to the parameter, and a module shared by
    several heads or rebuilt buffers must not hold a stale one::

        loss = loss_fn(hidden_states, head.weight, labels, weight_grad_accumulator=head.weight.main_grad)

    The backward then adds grad_weight into ``head.weight.main_grad`` and leaves ``head.weight.grad``
    untouched (see :func:`lfce.linear_cross_entropy` for when it is filled); recompute mode only.
    """

    class_weight: Tensor | None
    options: LossOptions

    def __init__(self, *, ignore_index: int = -100, reduction: Reduction = "mean", mode: Mode = "recompute",
                 chunk_size: int | None = None, workspace_budget: int | None = None, softcap: float | None = None,
                 temperature: float | None = None, z_loss_scale: float | None = None,
                 label_smoothing: float | None = None, class_weight: Tensor | None = None,
                 return_z_loss: bool = False, shift: bool = False, token_scaling: bool = False,
                 return_lse: bool = False, return_entropy: bool = False, return_logprob: bool = False,
                 return_accuracy: bool = False, return_predicted: bool = False,
                 options: LossOptions | None = None) -> None:
        super().__init__()
        self.options = resolve(
            options, ignore_index=ignore_index, reduction=reduction, mode=mode, chunk_size=chunk_size,
            workspace_budget=workspace_budget, softcap=softcap, temperature=temperature, z_loss_scale=z_loss_scale,
            label_smoothing=label_smoothing, return_z_loss=return_z_loss, shift=shift, token_scaling=token_scaling,
            return_lse=return_lse, return_entropy=return_entropy, return_logprob=return_logprob,
            return_accuracy=return_accuracy, return_predicted=return_predicted)
        check_class_weight(class_weight)
        self.register_buffer("class_weight", class_weight)

    def forward(self, hidden: Tensor, weight: Tensor, targets: Tensor, bias: Tensor | None = None, *,
                weight_grad_accumulator: Tensor | None = None, bias_grad_accumulator: Tensor | None = None
                ) -> Tensor | tuple[Tensor, Tensor] | LossOutput:
        """Loss of ``hidden @ weight.T + bias`` against ``targets``; with an accumulator, the backward
        adds grad_weight (grad_bias) into it instead of giving weight (bias) a gradient. See
        linear_cross_entropy."""
        return _linear_cross_entropy(hidden, weight, targets, bias, self.options, self.class_weight,
                                     (weight_grad_accumulator, bias_grad_accumulator))

    def extra_repr(self) -> str:
        o = self.options
        shown = [f"ignore_index={o.ignore_index!r}", f"reduction={o.reduction!r}", f"mode={o.mode!r}"]
        defaults = LossOptions()
        for name in ("chunk_size", "workspace_budget", "softcap", "temperature", "z_loss_scale", "label_smoothing"):
            if getattr(o, name) != getattr(defaults, name):
                shown.append(f"{name}={getattr(o, name)!r}")
        if self.class_weight is not None:
            shown.append(f"class_weight=[{self.class_weight.shape[0]}]")
        shown.extend(f"{name}=True" for name in ("return_z_loss", "shift", "token_scaling", *EXTRA_OUTPUTS)
                     if getattr(o, name))
        return ", ".join(shown)
