"""Liger-Kernel's fused linear cross-entropy entry points, computed by lfce.

``LigerFusedLinearCrossEntropyLoss`` and ``liger_fused_linear_cross_entropy`` take the arguments
of ``liger_kernel.transformers`` (0.8): names, order and defaults. Note the module's forward takes
the weight first: ``loss_fn(lm_head.weight, hidden, targets)``.

Supported: ignore_index, reduction ("mean", "sum", "none"), bias, softcap, ce_weight (per-class
weights: lfce's class_weight, same semantics: "mean" divides by the sum of the counted tokens'
weights, the z-loss by their count; not with fp16 inputs), label_smoothing, lse_square_scale
(z-loss: lfce's z_loss_scale) and return_z_loss (then a ``CrossEntropyOutput`` with the loss and
the z-loss term, as Liger returns; the z-loss has no gradient, as Liger's), use_token_scaling
(lfce's token_scaling: each token's loss, z-loss term and gradient times its detached p(target));
return_token_accuracy and return_predicted_tokens (lfce's return_accuracy and return_predicted:
the argmax of the logits the softmax sees, -1 for ignored tokens; the accuracy per token for
"none", else its mean over the counted tokens, as Liger's; no gradient), returned in a
``CrossEntropyOutput`` as Liger returns them; accum_dtype None or torch.float32 (lfce always
accumulates in fp32); chunk_mem_const is a memory knob of Liger's and changes no result (lfce
sizes its own chunks: see workspace_budget). The loss is fp32.
"""

from __future__ import annotations

import dataclasses

import torch
from torch import Tensor

from .. import _check
from ..functional import LossOutput, check_class_weight, linear_cross_entropy
from ..options import LossOptions, Reduction
from . import unsupported

__all__ = ["CrossEntropyOutput", "LigerFusedLinearCrossEntropyLoss", "liger_fused_linear_cross_entropy"]

_PACKAGE = "Liger-Kernel"


@dataclasses.dataclass
class CrossEntropyOutput:
    """What Liger-Kernel returns when an extra output is asked for (the fields lfce fills)."""

    loss: torch.Tensor
    z_loss: torch.Tensor | None = None
    token_accuracy: torch.Tensor | None = None
    predicted_tokens: torch.Tensor | None = None


def _options(ce_weight, ignore_index, lse_square_scale, label_smoothing, reduction, softcap, return_z_loss,
             accum_dtype, use_token_scaling, return_token_accuracy, return_predicted_tokens) -> LossOptions:
    """Liger's options as lfce's LossOptions, each checked first under the name Liger gives it (the
    module's at construction), before any work."""
    check_class_weight(ce_weight, "ce_weight")  # lfce's class_weight; its length is checked with the inputs
    _check.z_loss_scale(lse_square_scale, "lse_square_scale")  # lfce's z_loss_scale, named as the caller knows it
    for name, value in (("use_token_scaling", use_token_scaling), ("return_token_accuracy", return_token_accuracy),
                        ("return_predicted_tokens", return_predicted_tokens)):
        _check.flag(name, value)
    options = LossOptions(ignore_index=ignore_index, reduction=reduction, softcap=softcap,
                          z_loss_scale=lse_square_scale, label_smoothing=label_smoothing, return_z_loss=return_z_loss,
                          token_scaling=use_token_scaling, return_accuracy=return_token_accuracy,
                          return_predicted=return_predicted_tokens)
    if accum_dtype is not None and accum_dtype != torch.float32:
        unsupported(_PACKAGE, "accum_dtype", accum_dtype, None)
    return options


def liger_fused_linear_cross_entropy(
    input: Tensor,
    weight: Tensor,
    target: Tensor,
    bias: Tensor | None = None,
    ce_weight: Tensor | None = None,
    ignore_index: int = -100,
    lse_square_scale: float = 0.0,
    label_smoothing: float = 0.0,
    reduction: Reduction = "mean",
    softcap: float | None = None,
    return_z_loss: bool = False,
    accum_dtype: torch.dtype | None = None,
    use_token_scaling: bool = False,
    return_token_accuracy: bool = False,
    return_predicted_tokens: bool = False,
    chunk_mem_const: int = 1,
) -> Tensor | CrossEntropyOutput:
    """Cross-entropy of ``input @ weight.T + bias`` against ``target`` (Liger-Kernel's functional form)."""
    options = _options(ce_weight, ignore_index, lse_square_scale, label_smoothing, reduction, softcap, return_z_loss,
                       accum_dtype, use_token_scaling, return_token_accuracy, return_predicted_tokens)
    _check.positive("chunk_mem_const", chunk_mem_const)
    return _loss(input, weight, target, bias, ce_weight, options)


def _loss(hidden: Tensor, weight: Tensor, target: Tensor, bias: Tensor | None, ce_weight: Tensor | None,
          options: LossOptions) -> Tensor | CrossEntropyOutput:
    """The loss alone, or Liger's CrossEntropyOutput when any extra output is asked for (as Liger)."""
    out = linear_cross_entropy(hidden, weight, target, bias, class_weight=ce_weight, options=options)
    if isinstance(out, LossOutput):  # return_token_accuracy or return_predicted_tokens
        return CrossEntropyOutput(out.loss, out.z_loss, out.accuracy, out.predicted)
    if isinstance(out, tuple):  # return_z_loss: (loss, z_loss)
        return CrossEntropyOutput(*out)
    return out


class LigerFusedLinearCrossEntropyLoss(torch.nn.Module):
    """Liger-Kernel's module: options at construction, ``forward(lin_weight, _input, target, bias=None)``."""

    def __init__(
        self,
        ce_weight: Tensor | None = None,
        ignore_index: int = -100,
        lse_square_scale: float = 0.0,
        label_smoothing: float = 0.0,
        reduction: Reduction = "mean",
        softcap: float | None = None,
        return_z_loss: bool = False,
        accum_dtype: torch.dtype | None = None,
        use_token_scaling: bool = False,
        return_token_accuracy: bool = False,
        return_predicted_tokens: bool = False,
    ) -> None:
        super().__init__()
        _options(ce_weight, ignore_index, lse_square_scale, label_smoothing, reduction, softcap, return_z_loss,
                 accum_dtype, use_token_scaling, return_token_accuracy, return_predicted_tokens)
        self.ce_weight = ce_weight
        self.ignore_index = ignore_index
        self.lse_square_scale = lse_square_scale
        self.label_smoothing = label_smoothing
        self.reduction = reduction
        self.softcap = softcap
        self.return_z_loss = return_z_loss
        self.accum_dtype = accum_dtype
        self.use_token_scaling = use_token_scaling
        self.return_token_accuracy = return_token_accuracy
        self.return_predicted_tokens = return_predicted_tokens

    def forward(self, lin_weight: Tensor, _input: Tensor, target: Tensor, bias: Tensor | None = None
                ) -> Tensor | CrossEntropyOutput:
        """The loss of the options the module holds now (Liger's modules keep them as plain attributes)."""
        options = _options(self.ce_weight, self.ignore_index, self.lse_square_scale, self.label_smoothing,
                           self.reduction, self.softcap, self.return_z_loss, self.accum_dtype, self.use_token_scaling,
                           self.return_token_accuracy, self.return_predicted_tokens)
        return _loss(_input, lin_weight, target, bias, self.ce_weight, options)
