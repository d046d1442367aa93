"""Cut Cross-Entropy's ``linear_cross_entropy``, computed by lfce.

The arguments of ``cut_cross_entropy.linear_cross_entropy`` (25.1): names, order and defaults.

Supported: ignore_index, reduction ("mean", "sum", "none"), shift (targets shifted by one
position for causal language modelling: token i is scored against target i + 1, the last
position against nothing; with "none" the loss has shape targets[..., 1:]). ``filter_eps``
(CCE's gradient filtering, an approximation) is accepted and has no effect: lfce computes exact
gradients. ``impl`` picks one of CCE's implementations; every one computes this loss, which lfce
computes, softcap included. The loss is fp32.
"""

from __future__ import annotations

import enum
import operator
from typing import Any

from torch import Tensor

from ..errors import ArgumentTypeError, InvalidArgumentError, UnsupportedError
from ..functional import linear_cross_entropy as _lfce_linear_cross_entropy
from ..options import LossOptions, Reduction

__all__ = ["LinearCrossEntropyImpl", "linear_cross_entropy"]

IGNORE_INDEX = -100


class LinearCrossEntropyImpl(enum.IntEnum):
    """CCE's implementation names (accepted for compatibility; lfce computes every one)."""

    CCE = 1
    TORCH_COMPILE = 2
    CCE_EXACT = 3


# CCE's implementation names as strings: the enum's, and its presets (cce_utils.CCEPresets).
IMPL_NAMES = ("cce", "torch_compile", "cce_exact", "cce_kahan", "cce_kahan_full_c", "cce_kahan_full_e",
              "cce_kahan_full")


def linear_cross_entropy(
    e: Tensor,
    c: Tensor,
    targets: Tensor,
    ignore_index: int = IGNORE_INDEX,
    softcap: float | None = None,
    reduction: Reduction = "mean",
    shift: bool | int = False,
    filter_eps: float | str | None = "high",
    impl: str | enum.Enum = LinearCrossEntropyImpl.CCE,
) -> Tensor:
    """Cross-entropy of ``e @ c.T`` against ``targets`` (CCE's argument names: e [..., D], c [V, D])."""
    _check_impl(impl)
    options = LossOptions(ignore_index=ignore_index, reduction=reduction, softcap=softcap, shift=_shift(shift))
    # lfce's shift scores position i against target i + 1 without slicing e (a copy); CCE cuts the
    # last position off a "none" loss.
    loss = _lfce_linear_cross_entropy(e, c, targets, options=options)
    assert isinstance(loss, Tensor)  # no extra output asked for
    return loss[..., :-1] if options.shift and options.reduction == "none" else loss


def _check_impl(impl: object) -> None:
    """One of CCE's implementations: a LinearCrossEntropyImpl (lfce's or CCE's own enum) or its name."""
    if isinstance(impl, enum.Enum):
        name = impl.name.lower()
    elif isinstance(impl, str):
        name = impl.lower()
    else:
        raise ArgumentTypeError(f"impl must be a str or LinearCrossEntropyImpl, got {type(impl).__name__} {impl!r}")
    if name not in IMPL_NAMES:
        raise InvalidArgumentError("impl must be one of Cut Cross-Entropy's implementations "
                                   f"({', '.join(IMPL_NAMES)}), got {impl!r}")


def _shift(shift: Any) -> bool:
    """CCE's shift (a bool, or an int: the number of positions) as lfce's bool: lfce shifts by one."""
    if isinstance(shift, bool):
        return shift
    try:
        positions = operator.index(shift)
    except TypeError:
        raise ArgumentTypeError(f"shift must be a bool or an int, got {type(shift).__name__} {shift!r}") from None
    if positions not in (0, 1):
        raise UnsupportedError("lfce implements Cut Cross-Entropy's shift by one position (shift=True or 1) or none "
                               f"(False or 0), got shift={shift!r}")
    return positions == 1
