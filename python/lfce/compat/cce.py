"""Cut Cross-Entropy's ``linear_cross_entropy``, computed by lfce.

The arguments of ``cut_cross_entropy.linear_cross_entropy`` (25.1): names, order and defaults.

Supported: ignore_index, reduction ("mean", "sum", "none"), shift (targets shifted by one
position for causal language modelling: token i is scored against target i + 1, the last
position against nothing; with "none" the loss has shape targets[..., 1:]). ``filter_eps``
(CCE's gradient filtering, an approximation) is accepted and has no effect: lfce computes exact
gradients. ``impl`` picks one of CCE's implementations; every one computes this loss, which lfce
computes, softcap included. The loss is fp32.
"""

import enum

from ..functional import linear_cross_entropy as _lfce_linear_cross_entropy

__all__ = ["LinearCrossEntropyImpl", "linear_cross_entropy"]

IGNORE_INDEX = -100


class LinearCrossEntropyImpl(enum.IntEnum):
    """CCE's implementation names (accepted for compatibility; lfce computes every one)."""

    CCE = 1
    TORCH_COMPILE = 2


def linear_cross_entropy(
    e,
    c,
    targets,
    ignore_index: int = IGNORE_INDEX,
    softcap=None,
    reduction: str = "mean",
    shift: bool = False,
    filter_eps="high",
    impl=LinearCrossEntropyImpl.CCE,
):
    """Cross-entropy of ``e @ c.T`` against ``targets`` (CCE's argument names: e [..., D], c [V, D])."""
    if not isinstance(impl, (str, enum.Enum)):
        raise TypeError(f"impl must be a str or LinearCrossEntropyImpl, got {type(impl).__name__} {impl!r}")
    if shift not in (False, True):
        raise NotImplementedError(f"lfce implements Cut Cross-Entropy's shift as a bool (a shift by one), "
                                  f"got shift={shift!r}")
    # lfce's shift scores position i against target i + 1 without slicing e (a copy); CCE cuts the
    # last position off a "none" loss.
    loss = _lfce_linear_cross_entropy(e, c, targets, ignore_index=ignore_index, reduction=reduction, softcap=softcap,
                                      shift=shift)
    return loss[..., :-1] if shift and reduction == "none" else loss
