"""PyTorch's own fused loss, computed by lfce: ``torch.nn.functional.linear_cross_entropy`` and
``torch.nn.LinearCrossEntropyLoss`` (their argument names, order and defaults), so that code written
for them switches by changing an import::

    from lfce.compat.torch import linear_cross_entropy          # for torch.nn.functional's
    from lfce.compat.torch import LinearCrossEntropyLoss        # for torch.nn's

The semantics are ``F.cross_entropy(F.linear(input, linear_weight, linear_bias), target, weight=weight,
ignore_index=ignore_index, reduction=reduction, label_smoothing=label_smoothing)`` exactly, with
``ignore_index=None`` meaning -100 as PyTorch maps it for class indices: "mean" is the weighted mean
``sum_i w_{y_i} loss_i / sum_i w_{y_i}`` over the counted tokens; with label smoothing eps and
class weights w each counted token's loss is ``(1 - eps) w_y (LSE - z_y) + eps / C sum_c w_c (LSE -
z_c)`` and "mean" divides by the same ``sum w_y``, as F.cross_entropy defines it (lfce's own
label_smoothing and class_weight are that definition). The loss is fp32 (fp64 for fp64 CPU inputs),
CUDA or CPU tensors (lfce.linear_cross_entropy's inputs).

What lfce does not compute is refused, naming it (UnsupportedError): class-probability (floating)
targets, the K-dimensional loss (a linear_weight of more than 2 dimensions, out_features != ()), and
input of more than 2 dimensions (PyTorch's shapes are [in_features] and [N, in_features]; F.linear
would put the classes of [B, T, in_features] in dimension 2, which F.cross_entropy does not read as
classes). ``options`` is PyTorch's hook for its chunked implementation; here it is None or a dict of
lfce's execution options, which do not change the loss: ``mode``, ``chunk_size``, ``workspace_budget``.
"""

from __future__ import annotations

import math
from typing import Any, Optional, cast

from torch import Tensor, nn

from .. import _check
from ..errors import ArgumentTypeError, InvalidArgumentError, UnsupportedError
from ..functional import check_class_weight
from ..functional import linear_cross_entropy as _lfce_linear_cross_entropy
from ..options import Reduction

__all__ = ["LinearCrossEntropyLoss", "linear_cross_entropy"]

IGNORE_INDEX = -100  # what ignore_index=None means for class-index targets (PyTorch's mapping)
EXECUTION_OPTIONS = ("mode", "chunk_size", "workspace_budget")  # lfce's, accepted in options


def _ignore_index(value):
    return IGNORE_INDEX if value is None else _check.integer("ignore_index", value)


def _execution_options(options):
    """options as lfce keyword arguments: None, or a dict whose keys are EXECUTION_OPTIONS."""
    if options is None:
        return {}
    if not isinstance(options, dict):
        raise ArgumentTypeError(f"options must be None or a dict of lfce's execution options {EXECUTION_OPTIONS}, "
                                f"got {type(options).__name__}")
    unknown = sorted(str(key) for key in options if key not in EXECUTION_OPTIONS)
    if unknown:
        raise UnsupportedError(f"options {unknown} are not lfce's: lfce.compat.torch takes lfce's execution options "
                               f"{EXECUTION_OPTIONS} in options (PyTorch's own chunking options are for its "
                               "implementation); use torch.nn.functional.linear_cross_entropy for those")
    return dict(options)


def _check_shapes(input, linear_weight, target):
    """PyTorch's shapes that lfce computes; probability targets and the K-dimensional loss refused."""
    for name, value in (("input", input), ("linear_weight", linear_weight), ("target", target)):
        if not isinstance(value, Tensor):
            raise ArgumentTypeError(f"{name} must be a torch.Tensor, got {type(value).__name__}")
    if target.is_floating_point():
        raise UnsupportedError(f"target holds class probabilities ({target.dtype}); lfce computes class-index "
                               "targets only (torch.int64 or torch.int32); use "
                               "torch.nn.functional.linear_cross_entropy for probability targets")
    if linear_weight.dim() != 2:
        raise UnsupportedError(f"linear_weight of shape {tuple(linear_weight.shape)}: lfce computes the loss over "
                               "one class dimension only, linear_weight [C, in_features] (no K-dimensional loss); "
                               "use torch.nn.functional.linear_cross_entropy for it")
    if input.dim() not in (1, 2):
        raise UnsupportedError(f"input of shape {tuple(input.shape)}: PyTorch's shapes are [in_features] or [N, "
                               "in_features] (F.cross_entropy reads dimension 1 of more dimensions as the "
                               "classes); flatten the batch dimensions first, e.g. input.flatten(0, -2) and "
                               "target.flatten(), or call lfce.linear_cross_entropy, which takes [..., H]")


def linear_cross_entropy(input: Tensor, linear_weight: Tensor, target: Tensor, *, linear_bias: Tensor | None = None,
                         weight: Tensor | None = None, reduction: Reduction = "mean", ignore_index: int | None = None,
                         label_smoothing: float = 0.0, options: dict[str, Any] | None = None) -> Tensor:
    """``torch.nn.functional.linear_cross_entropy``, computed by lfce.

    Args:
        input: [N, in_features] or [in_features] (then target is 0-dim).
        linear_weight: [C, in_features], the dtype and device of input.
        target: class indices [N] (or 0-dim), int64 or int32, in [0, C) or ignore_index. Class
            probabilities (a floating target) are refused (UnsupportedError).
        linear_bias: None or [C].
        weight: None or the class weights [C] (any floating dtype; they get no gradient).
        reduction: "mean" (the weighted mean), "sum" or "none".
        ignore_index: None (-100) or an int.
        label_smoothing: in [0, 1].
        options: None or a dict of lfce's execution options (mode, chunk_size, workspace_budget).

    Returns:
        The loss: 0-dim for mean / sum, target's shape for none.
    """
    _check_shapes(input, linear_weight, target)
    check_class_weight(weight, "weight")
    loss = _lfce_linear_cross_entropy(input, linear_weight, target, linear_bias, ignore_index=_ignore_index(ignore_index),
                                      reduction=reduction, label_smoothing=label_smoothing, class_weight=weight,
                                      **_execution_options(options))
    return cast(Tensor, loss)  # (no extra outputs asked for: the loss alone)


class LinearCrossEntropyLoss(nn.Module):
    """``torch.nn.LinearCrossEntropyLoss``, computed by lfce: a criterion that owns its linear layer
    (``self.linear``, an ``nn.Linear(in_features, num_classes, bias=bias)``) and computes
    ``linear_cross_entropy(input, self.linear.weight, target, linear_bias=self.linear.bias, ...)``.
    The class weights are a buffer (``self.weight``, as torch.nn.CrossEntropyLoss's). ``out_features``
    other than () (the K-dimensional loss) is refused (UnsupportedError)."""

    def __init__(self, in_features: int, num_classes: int, *, out_features: tuple[int, ...] = (), bias: bool = False,
                 device=None, dtype=None, reduction: Reduction = "mean", weight: Tensor | None = None,
                 ignore_index: int | None = None, label_smoothing: float = 0.0,
                 options: dict[str, Any] | None = None) -> None:
        super().__init__()
        _check.positive("in_features", in_features)
        _check.positive("num_classes", num_classes)
        if tuple(out_features) != ():
            raise UnsupportedError(f"out_features={tuple(out_features)!r}: lfce computes the loss over one class "
                                   "dimension only (no K-dimensional loss); use torch.nn.LinearCrossEntropyLoss")
        _check.choice("reduction", reduction, ("mean", "sum", "none"))
        _check.label_smoothing(label_smoothing)
        check_class_weight(weight, "weight")
        if weight is not None and weight.shape[0] != num_classes:
            raise InvalidArgumentError(f"weight must have shape [num_classes] = ({num_classes},), got shape "
                                       f"{tuple(weight.shape)}")
        self.options = _execution_options(options)
        self.in_features, self.num_classes, self.out_features = in_features, num_classes, ()
        self.reduction, self.label_smoothing = reduction, label_smoothing
        self.ignore_index = _ignore_index(ignore_index)
        self.linear = nn.Linear(in_features, num_classes * math.prod(self.out_features), bias=bias, device=device,
                                dtype=dtype)
        self.register_buffer("weight", weight)

    def forward(self, input: Tensor, target: Tensor) -> Tensor:
        weight = cast(Optional[Tensor], self.weight)  # (a buffer: nn.Module's attribute type is wider)
        return linear_cross_entropy(input, self.linear.weight, target, linear_bias=self.linear.bias, weight=weight,
                                    reduction=self.reduction, ignore_index=self.ignore_index,
                                    label_smoothing=self.label_smoothing, options=self.options)

    def extra_repr(self) -> str:
        text = f"in_features={self.in_features}, num_classes={self.num_classes}, reduction={self.reduction!r}"
        if self.ignore_index != IGNORE_INDEX:
            text += f", ignore_index={self.ignore_index}"
        if self.label_smoothing:
            text += f", label_smoothing={self.label_smoothing}"
        return text

