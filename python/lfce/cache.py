"""The kernel cache from Python: where it is, filling it ahead of time, what loaded from it.

Kernels are cached on disk (PTX for each spec, plus the driver-compiled cubin per GPU and
driver) under ``lfce.cache_dir()``: $LFCE_CACHE_DIR, else $XDG_CACHE_HOME/lfce, else
~/.cache/lfce. The training path uses the cache with no code change; ``precompile`` fills it
without a GPU, e.g. while building a container image.
"""

from __future__ import annotations

import ctypes
import os
from collections.abc import Callable, Iterable
from typing import Any

from . import _check, _lib, presets
from .errors import ArgumentTypeError, InvalidArgumentError
from .kernels import problem_for
from .options import Mode, Reduction

__all__ = ["cache_dir", "kernel_load_stats", "precompile", "set_cache_dir", "tune"]


def cache_dir() -> str:
    """The kernel cache directory this process uses, as a str (a name that is not UTF-8 is decoded as
    os.fsdecode does, so ``os.fsencode(cache_dir())`` gives its bytes back)."""
    return os.fsdecode(_lib.load().lfce_cache_dir())


def set_cache_dir(path: str | os.PathLike[str]) -> None:
    """Use ``path`` (a str or os.PathLike) as the cache directory from now on in this process:
    for the kernels and the tuning winners (``<path>/tuning``) alike."""
    _lib.check(_lib.load().lfce_set_cache_dir(_check.path("path", path)))


def reload_options() -> None:
    """Read lfce's environment variables again (the first call into the library reads them once):
    LFCE_LOG_LEVEL, LFCE_CACHE_DIR (unless set_cache_dir chose one), LFCE_DEVICE_SMEM_LIMIT and
    LFCE_DEVICE_SM_COUNT (for devices not used yet). A malformed value raises ValueError naming it."""
    _lib.check(_lib.load().lfce_reload_options())


def _collect(callback_type, convert, call):
    rows, failures = [], []

    def on_row(pointer, _user):
        try:
            rows.append(convert(pointer.contents))
        except BaseException as error:  # noqa: BLE001 - an exception cannot cross the C frame
            failures.append(error)

    callback = callback_type(on_row)
    _lib.check(call(callback))
    if failures:
        raise failures[0]
    return rows


def _shape(model, vocab, hidden):
    """(vocab, hidden) from a preset name or the explicit sizes."""
    if model is not None:
        _check.text("model", model)
        if vocab is not None or hidden is not None:
            raise InvalidArgumentError("give either model or vocab and hidden, not both")
        known = presets.table()
        if model not in known:
            raise InvalidArgumentError(f"unknown model {model!r}; known models: {', '.join(sorted(known))}")
        hidden, vocab = known[model]
    elif vocab is None or hidden is None:
        raise InvalidArgumentError("give a model preset or both vocab and hidden")
    return vocab, hidden


def _archs(archs):
    """``archs`` (one arch name or an iterable of them) as a non-empty list of checked names."""
    if isinstance(archs, str):
        archs = [archs]
    try:
        archs = list(archs)
    except TypeError:
        raise ArgumentTypeError(f"archs must be an arch name or a list of them, got {archs!r}") from None
    if not archs:
        raise InvalidArgumentError(f"archs must name at least one arch, got {archs!r}")
    for arch in archs:
        _check.text("archs", arch)
    return archs


def precompile(model: str | None = None, *, vocab: int | None = None, hidden: int | None = None,
               archs: str | Iterable[str] = ("sm_90a", "sm_80"), dtype: object = "bf16", has_bias: bool = False,
               mode: Mode = "recompute", reduction: Reduction = "mean", tokens: int = 8192,
               chunk_size: int | None = None, workspace_budget: int | None = None, sm_count: int | None = None,
               smem_per_block: int | None = None, **loss_options: Any) -> list[dict[str, Any]]:
    """Fill the cache with every kernel of a model preset (or of ``vocab``/``hidden``) for ``archs``.

    No GPU is needed. ``sm_count`` and ``smem_per_block`` (bytes, the opt-in limit per block)
    describe the GPU the kernels are for when it is not the arch's reference device (an
    H200-class GPU for sm_90a): the default tiles depend on both. ``loss_options``: the loss
    options of the calls to precompile for, as lfce.kernels.problem_for takes them (softcap,
    temperature, z_loss_scale, label_smoothing, class_weight=True/False, token_scaling,
    outputs=("entropy", "logprob", "predicted"), shift=True/False; or options=lfce.LossOptions(...)); with an
    entropy or logprob output the backward
    kernel that takes their gradients is compiled too. Returns one dict per kernel and arch:
    name, arch, spec, key, cache_hit, compile_ms (LLVM), elapsed_ms, ptx_size.
    """
    vocab, hidden = _shape(model, vocab, hidden)
    archs = _archs(archs)
    limits = _lib.DeviceLimits(_check.integer("sm_count", sm_count, minimum=1, maximum=1 << 20, allow_none=True) or 0,
                               _check.integer("smem_per_block", smem_per_block, minimum=1, maximum=1 << 30,
                                              allow_none=True) or 0)
    problem = problem_for(vocab, hidden, dtype=dtype, has_bias=has_bias, mode=mode, reduction=reduction,
                          tokens=tokens, chunk_size=chunk_size, workspace_budget=workspace_budget, **loss_options)
    rows = []
    for arch in archs:
        def convert(k, arch=arch):
            return {"name": k.name.decode(), "arch": arch, "spec": k.spec.decode(), "key": k.key.decode(),
                    "cache_hit": bool(k.cache_hit), "compile_ms": k.compile_ms, "elapsed_ms": k.elapsed_ms,
                    "ptx_size": int(k.ptx_size)}

        rows += _collect(_lib.PRECOMPILE_CALLBACK, convert,
                         lambda cb, arch=arch: _lib.load().lfce_precompile_for(ctypes.byref(problem), arch.encode(),
                                                                               ctypes.byref(limits), cb, None))
    return rows


def tune(model: str | None = None, *, vocab: int | None = None, hidden: int | None = None, tokens: int = 8192,
         dtype: object = "bf16", has_bias: bool = False, mode: Mode = "recompute", reduction: Reduction = "mean",
         device: int = 0, space: str = "default", budget_minutes: float = 0.0, verify: bool = False,
         repetitions: int = 0, progress: Callable[[int, int, float, str, str], object] | None = None
         ) -> list[dict[str, Any]]:
    """Autotune the GEMM kernels of one problem on CUDA device ``device``.

    Winners and every measurement persist in the cache directory: later calls (and new
    processes) run with the winners, and a sweep stopped by ``budget_minutes`` resumes where it
    stopped. ``progress(done, total, eta_seconds, kernel, candidate)`` is called before each
    config. Returns one dict per kernel: kernel, default_config, default_ms, winner, winner_ms,
    speedup, measured, reused, failed, rejected, path.
    """
    vocab, hidden = _shape(model, vocab, hidden)
    _check.choice("space", space, ("default", "small", "wgmma"))
    problem = problem_for(vocab, hidden, dtype=dtype, has_bias=has_bias, mode=mode, reduction=reduction,
                          tokens=tokens)
    if progress is not None and not callable(progress):
        raise ArgumentTypeError(f"progress must be a callable or None, got {type(progress).__name__} {progress!r}")
    options = _lib.TuneOptions(
        device=_check.integer("device", device, minimum=0, maximum=_check.INT32_MAX),
        space=space.encode(), budget_minutes=_check.real("budget_minutes", budget_minutes, minimum=0.0),
        verify=_check.flag("verify", verify),
        repetitions=_check.integer("repetitions", repetitions, minimum=0, maximum=_check.INT32_MAX))
    failures = []

    def on_progress(done, total, eta, kernel, candidate, _user):
        try:
            progress(done, total, eta, kernel.decode(), candidate.decode())
        except BaseException as error:  # noqa: BLE001 - an exception cannot cross the C frame
            failures.append(error)

    options.progress = _lib.TUNE_PROGRESS(on_progress) if progress is not None else _lib.TUNE_PROGRESS()

    def convert(r):
        return {"kernel": r.kernel.decode(), "default_config": r.default_config.decode(),
                "default_ms": r.default_ms, "winner": r.winner.decode() if r.winner else None,
                "winner_ms": r.winner_ms, "speedup": r.speedup or None, "measured": r.measured,
                "reused": r.reused, "failed": r.failed, "rejected": r.rejected, "path": r.path.decode()}

    stopped = ctypes.c_int32(0)
    rows = _collect(_lib.TUNE_CALLBACK, convert,
                    lambda cb: _lib.load().lfce_tune(ctypes.byref(problem), ctypes.byref(options), cb, None,
                                                     ctypes.byref(stopped)))
    if failures:
        raise failures[0]
    return rows


def kernel_load_stats() -> list[dict[str, Any]]:
    """How each kernel this process loaded got there: source ("cubin-cache", "ptx-cache" or
    "llvm") and the milliseconds spent in LLVM, the driver JIT, disk reads and module loading.
    The warp-specialised sm_90a GEMM kernels keep no cubin (docs/cache.md): warm, they say
    "ptx-cache", with the driver's JIT (from its own cache) in jit_ms."""
    def convert(k):
        return {"spec": k.spec.decode(), "device": k.device, "source": k.source.decode(), "llvm_ms": k.llvm_ms,
                "jit_ms": k.jit_ms, "disk_ms": k.disk_ms, "load_ms": k.load_ms, "total_ms": k.total_ms,
                "registers": k.registers, "local_bytes": k.local_bytes}

    return _collect(_lib.KERNEL_LOAD_CALLBACK, convert, lambda cb: _lib.load().lfce_kernel_load_stats(cb, None))
