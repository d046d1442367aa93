"""Kernel generation without a GPU: ``lfce.generate`` returns the PTX lfce would run."""

from __future__ import annotations

import ctypes
from collections.abc import Iterable
from typing import Any

from . import _check, _lib
from . import options as _options
from .errors import InvalidArgumentError
from .options import LossOptions, Mode, Reduction

__all__ = ["dtype_code", "generate", "problem_for"]

# Accepted spellings of each dtype; torch dtypes are matched by name so torch is optional.
_DTYPE_NAMES = {
    "bf16": _lib.DTYPE_BF16, "bfloat16": _lib.DTYPE_BF16, "torch.bfloat16": _lib.DTYPE_BF16,
    "fp16": _lib.DTYPE_FP16, "float16": _lib.DTYPE_FP16, "half": _lib.DTYPE_FP16,
    "torch.float16": _lib.DTYPE_FP16,
    "fp32": _lib.DTYPE_FP32, "float32": _lib.DTYPE_FP32, "float": _lib.DTYPE_FP32,
    "torch.float32": _lib.DTYPE_FP32,
}


def dtype_code(dtype: object) -> int:
    """lfce_dtype for a torch dtype or one of the strings "bf16", "fp16", "fp32"."""
    code = _DTYPE_NAMES.get(str(dtype))
    if code is None:
        raise InvalidArgumentError(f"dtype must be bf16, fp16 or fp32 (a string or torch dtype), got {dtype!r}")
    return code


# The extra outputs that change kernels (lfce_problem.outputs), by name, and the LossOptions field
# that asks for each.
OUTPUT_FLAGS = {"entropy": _lib.OUTPUT_ENTROPY, "logprob": _lib.OUTPUT_LOGPROB, "predicted": _lib.OUTPUT_PREDICTED}
_OUTPUT_FIELDS = {"entropy": "return_entropy", "logprob": "return_logprob", "predicted": "return_predicted"}


def problem_for(vocab: int, hidden: int, *, dtype: object = "bf16", has_bias: bool = False, mode: Mode = "recompute",
                reduction: Reduction = "mean", tokens: int = 8192, chunk_size: int | None = None,
                workspace_budget: int | None = None, ignore_index: int = -100, softcap: float | None = None,
                temperature: float | None = None, z_loss_scale: float | None = None,
                label_smoothing: float | None = None, class_weight: bool = False, token_scaling: bool = False,
                outputs: str | Iterable[str] = (), shift: bool = False,
                options: LossOptions | None = None) -> _lib.Problem:
    """Validate the options of a problem description and fill an lfce_problem. The loss options are
    linear_cross_entropy's, or one LossOptions as ``options`` (class_weight: whether there are class
    weights; the values are run-time data); outputs: names from OUTPUT_FLAGS (return_accuracy needs
    "predicted"); shift: the causal shift's kernels (the sequence length is a run-time value: the
    problem takes one sequence of ``tokens``)."""
    if isinstance(outputs, str):
        outputs = (outputs,)
    outputs = tuple(outputs)
    unknown = [name for name in outputs if name not in OUTPUT_FLAGS]
    if unknown:
        raise InvalidArgumentError(f"outputs: unknown output(s) {unknown}; expected names from {sorted(OUTPUT_FLAGS)}")
    loss = _options.resolve(options, ignore_index=ignore_index, reduction=reduction, mode=mode, chunk_size=chunk_size,
                            workspace_budget=workspace_budget, softcap=softcap, temperature=temperature,
                            z_loss_scale=z_loss_scale, label_smoothing=label_smoothing, token_scaling=token_scaling,
                            shift=shift, **{_OUTPUT_FIELDS[name]: True for name in outputs})
    tokens = _check.positive("tokens", tokens)
    return _options.problem(loss, tokens, _check.positive("hidden", hidden), _check.positive("vocab", vocab),
                            dtype_code(dtype), has_bias=bool(_check.flag("has_bias", has_bias)),
                            has_class_weight=bool(_check.flag("class_weight", class_weight)),
                            sequence_length=tokens if loss.shift else 0)


def generate(vocab: int, hidden: int, *, arch: str = "sm_90a", dtype: object = "bf16", has_bias: bool = False,
             mode: Mode = "recompute", reduction: Reduction = "mean", tokens: int = 8192,
             chunk_size: int | None = None, workspace_budget: int | None = None, ignore_index: int = -100,
             **loss_options: Any) -> list[dict[str, Any]]:
    """Generate every kernel a problem needs for ``arch`` ("sm_80" or "sm_90a"); no GPU is touched.

    Returns a list of dicts, one per kernel, in the library's order::

        {"name": "lse_forward", "spec": "<canonical KernelSpec>", "ptx": "<PTX text>",
         "ptx_size": bytes, "compile_ms": LLVM time, "smem_bytes": dynamic smem per CTA,
         "threads": threads per CTA}

    ``tokens`` matters only where the library derives a tile or chunk choice from it.
    ``loss_options``: problem_for's (softcap, temperature, z_loss_scale, label_smoothing,
    class_weight, token_scaling, outputs, shift).
    Raises ValueError for a bad request and CompileError if LLVM fails.
    """
    problem = problem_for(vocab, hidden, dtype=dtype, has_bias=has_bias, mode=mode, reduction=reduction,
                          tokens=tokens, chunk_size=chunk_size, workspace_budget=workspace_budget,
                          ignore_index=ignore_index, **loss_options)
    arch = _check.text("arch", arch)
    kernels = []
    failures = []

    def collect(info_ptr, _user):
        try:
            info = info_ptr.contents
            kernels.append({
                "name": info.name.decode(),
                "spec": info.spec.decode(),
                "ptx": info.ptx.decode(),  # NUL-terminated
                "ptx_size": int(info.ptx_size),
                "compile_ms": float(info.compile_ms),
                "smem_bytes": int(info.smem_bytes),
                "threads": int(info.threads),
            })
        except BaseException as error:  # noqa: BLE001 - an exception cannot cross the C frame
            failures.append(error)

    callback = _lib.KERNEL_CALLBACK(collect)  # kept alive by this frame during the call
    _lib.check(_lib.load().lfce_generate(ctypes.byref(problem), arch, callback, None))
    if failures:
        raise failures[0]
    return kernels
