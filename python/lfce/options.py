"""``LossOptions``: every non-tensor option of the loss, as one checked, immutable value.

    options = lfce.LossOptions(reduction="sum", softcap=30.0, return_entropy=True)
    out = lfce.linear_cross_entropy(hidden, weight, labels, options=options)

The public entry points (``lfce.linear_cross_entropy``, ``lfce.LinearCrossEntropyLoss``, the
compat modules, ``lfce.distributed``, ``lfce.precompile``/``lfce.generate``) take the same names as
keyword arguments and build one of these; each value is checked once, here, with the checks of
``_check`` (a TypeError or ValueError naming the option, the value and what it may be). The values
are kept canonical: NumPy scalars become Python ints, floats and bools, and an option that is off
has one spelling (temperature None is 1.0, z_loss_scale and label_smoothing None are 0.0), so two
equal requests compare and hash equal.

Tensors are not options: the class weights (``class_weight``) and the gradient accumulators are
arguments of the calls. This module needs neither PyTorch nor a GPU.
"""

from __future__ import annotations

import dataclasses
from typing import Any, Literal

from . import _check, _lib
from .errors import ArgumentTypeError, UsageError

__all__ = ["EXTRA_OUTPUTS", "OPTION_NAMES", "LossOptions", "Mode", "Reduction", "problem", "resolve"]

Reduction = Literal["mean", "sum", "none"]
Mode = Literal["recompute", "eager"]

# The extra per-token outputs, in lfce.LossOutput's order; the first three are rows of the operator's lse.
EXTRA_OUTPUTS = ("return_lse", "return_entropy", "return_logprob", "return_accuracy", "return_predicted")


@dataclasses.dataclass(frozen=True)
class LossOptions:
    """The options of ``lfce.linear_cross_entropy`` (see its docstring for what each one does).

    Checked at construction (``dataclasses.replace`` checks again). ``mode`` is the one asked for:
    the call itself runs "recompute" where eager mode cannot serve the request (reduction "none",
    or a gradient through lse, entropy or logprob).
    """

    ignore_index: int = -100
    reduction: Reduction = "mean"
    mode: Mode = "recompute"
    chunk_size: int | None = None
    workspace_budget: int | None = None
    softcap: float | None = None
    temperature: float | None = None
    z_loss_scale: float | None = None
    label_smoothing: float | None = None
    token_scaling: bool = False
    shift: bool = False
    return_z_loss: bool = False
    return_lse: bool = False
    return_entropy: bool = False
    return_logprob: bool = False
    return_accuracy: bool = False
    return_predicted: bool = False

    def __post_init__(self) -> None:
        # In the order the checks ran before there was a LossOptions: the first bad value is named.
        canonical = {
            "softcap": _check.softcap(self.softcap),
            "temperature": _check.temperature(self.temperature),
            "z_loss_scale": _check.z_loss_scale(self.z_loss_scale),
            "label_smoothing": _check.label_smoothing(self.label_smoothing),
        }
        for name in ("return_z_loss", "token_scaling", *EXTRA_OUTPUTS):
            canonical[name] = bool(_check.flag(name, getattr(self, name)))
        canonical["ignore_index"] = _check.integer("ignore_index", self.ignore_index)
        _check.choice("reduction", self.reduction, _lib.REDUCTIONS)
        _check.choice("mode", self.mode, _lib.MODES)
        canonical["chunk_size"] = _check.positive("chunk_size", self.chunk_size, allow_none=True)
        canonical["workspace_budget"] = _check.positive("workspace_budget", self.workspace_budget, allow_none=True)
        canonical["shift"] = bool(_check.flag("shift", self.shift))
        for name, value in canonical.items():
            object.__setattr__(self, name, value)  # frozen: the one place the fields are set after __init__

    @property
    def outputs(self) -> int:
        """lfce_problem.outputs (lfce.h's lfce_output flags) for the extra outputs asked for:
        accuracy needs the predicted ids."""
        flags = _lib.OUTPUT_ENTROPY if self.return_entropy else 0
        flags |= _lib.OUTPUT_LOGPROB if self.return_logprob else 0
        return flags | (_lib.OUTPUT_PREDICTED if self.return_accuracy or self.return_predicted else 0)

    @property
    def extra_outputs(self) -> dict[str, bool]:
        """{name in EXTRA_OUTPUTS: asked for}."""
        return {name: getattr(self, name) for name in EXTRA_OUTPUTS}


# The field names of LossOptions: the keyword arguments every entry point accepts for them.
OPTION_NAMES = tuple(field.name for field in dataclasses.fields(LossOptions))
_DEFAULTS = LossOptions()


def resolve(options: LossOptions | None = None, /, **given: Any) -> LossOptions:
    """The LossOptions of a call: ``LossOptions(**given)`` (the keyword arguments it was given,
    checked), or ``options`` when one was passed, with every keyword option left at its default (a
    UsageError names those that were not: one call, one way of passing them)."""
    built = LossOptions(**given)
    if options is None:
        return built
    if not isinstance(options, LossOptions):
        raise ArgumentTypeError(f"options must be None or an lfce.LossOptions, got {type(options).__name__} "
                                f"{options!r}")
    clashes = [f"{name}={getattr(built, name)!r}" for name in OPTION_NAMES
               if getattr(built, name) != getattr(_DEFAULTS, name)]
    if clashes:
        raise UsageError(f"options=LossOptions(...) and the keyword options {', '.join(clashes)} were both given; "
                         "pass every option in the LossOptions (dataclasses.replace(options, ...)) or none")
    return options


def problem(options: LossOptions, tokens: int, hidden: int, vocab: int, dtype: int, *,
            target_dtype: int = _lib.INDEX_INT64, has_bias: bool = False, has_class_weight: bool = False,
            accumulate: tuple[bool, bool] = (False, False), sequence_length: int = 0,
            mode: Mode | None = None) -> _lib.Problem:
    """The lfce_problem of ``options`` for these sizes and dtypes (lfce.h's codes): the one place
    where a loss option becomes a field of the C struct. ``mode`` overrides options.mode (the
    schedule a call really runs: eager's fallbacks, the backward); ``sequence_length``: T > 0 for a
    causal shift."""
    return _lib.make_problem(
        tokens, hidden, vocab, dtype, target_dtype=target_dtype, has_bias=has_bias,
        reduction=_lib.REDUCTIONS[options.reduction], mode=_lib.MODES[mode or options.mode],
        ignore_index=options.ignore_index, chunk_size=options.chunk_size, workspace_budget=options.workspace_budget,
        softcap=options.softcap, temperature=options.temperature, z_loss_scale=options.z_loss_scale,
        label_smoothing=options.label_smoothing, has_class_weight=has_class_weight,
        accumulate_grad_weight=accumulate[0], accumulate_grad_bias=accumulate[1],
        token_scaling=options.token_scaling, outputs=options.outputs, sequence_length=sequence_length)
