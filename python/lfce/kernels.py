"""Kernel generation without a GPU: ``lfce.generate`` returns the PTX lfce would run."""

import ctypes

from . import _check, _lib
from .errors import InvalidArgumentError

__all__ = ["dtype_code", "generate", "problem_for"]

# Accepted spellings of each dtype; torch dtypes are matched by name so torch is optional.
_DTYPE_NAMES = {
    "bf16": _lib.DTYPE_BF16, "bfloat16": _lib.DTYPE_BF16, "torch.bfloat16": _lib.DTYPE_BF16,
    "fp16": _lib.DTYPE_FP16, "float16": _lib.DTYPE_FP16, "half": _lib.DTYPE_FP16,
    "torch.float16": _lib.DTYPE_FP16,
    "fp32": _lib.DTYPE_FP32, "float32": _lib.DTYPE_FP32, "float": _lib.DTYPE_FP32,
    "torch.float32": _lib.DTYPE_FP32,
}


def dtype_code(dtype):
    """lfce_dtype for a torch dtype or one of the strings "bf16", "fp16", "fp32"."""
    code = _DTYPE_NAMES.get(str(dtype))
    if code is None:
        raise InvalidArgumentError(f"dtype must be bf16, fp16 or fp32 (a string or torch dtype), got {dtype!r}")
    return code


# The extra outputs that change kernels (lfce_problem.outputs), by name.
OUTPUT_FLAGS = {"entropy": _lib.OUTPUT_ENTROPY, "logprob": _lib.OUTPUT_LOGPROB, "predicted": _lib.OUTPUT_PREDICTED}


def problem_for(vocab, hidden, *, dtype="bf16", has_bias=False, mode="recompute", reduction="mean",
                tokens=8192, chunk_size=None, workspace_budget=None, ignore_index=-100, softcap=None,
                temperature=None, z_loss_scale=None, label_smoothing=None, class_weight=False, token_scaling=False,
                outputs=(), shift=False):
    """Validate the options of a problem description and fill an lfce_problem. The loss options are
    linear_cross_entropy's (class_weight: whether there are class weights; the values are run-time
    data); outputs: names from OUTPUT_FLAGS (return_accuracy needs "predicted"); shift: the causal
    shift's kernels (the sequence length is a run-time value: the problem takes one sequence of
    ``tokens``)."""
    if isinstance(outputs, str):
        outputs = (outputs,)
    unknown = [name for name in outputs if name not in OUTPUT_FLAGS]
    if unknown:
        raise InvalidArgumentError(f"outputs: unknown output(s) {unknown}; expected names from {sorted(OUTPUT_FLAGS)}")
    return _lib.make_problem(
        _check.positive("tokens", tokens), _check.positive("hidden", hidden), _check.positive("vocab", vocab),
        dtype_code(dtype), has_bias=_check.flag("has_bias", has_bias),
        reduction=_lib.REDUCTIONS[_check.choice("reduction", reduction, _lib.REDUCTIONS)],
        mode=_lib.MODES[_check.choice("mode", mode, _lib.MODES)],
        ignore_index=_check.integer("ignore_index", ignore_index),
        chunk_size=_check.positive("chunk_size", chunk_size, allow_none=True),
        workspace_budget=_check.positive("workspace_budget", workspace_budget, allow_none=True),
        softcap=_check.softcap(softcap), temperature=_check.temperature(temperature),
        z_loss_scale=_check.z_loss_scale(z_loss_scale), label_smoothing=_check.label_smoothing(label_smoothing),
        has_class_weight=_check.flag("class_weight", class_weight), token_scaling=_check.flag("token_scaling",
                                                                                               token_scaling),
        outputs=sum(OUTPUT_FLAGS[name] for name in set(outputs)),
        sequence_length=tokens if _check.flag("shift", shift) else 0,
    )


def generate(vocab, hidden, *, arch="sm_90a", dtype="bf16", has_bias=False, mode="recompute",
             reduction="mean", tokens=8192, chunk_size=None, workspace_budget=None,
             ignore_index=-100, **loss_options):
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
