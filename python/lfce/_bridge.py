"""The ctypes bridge to liblfce.so for CUDA tensors: problems, workspaces, kernel launches.

Everything here takes tensors and a ``LossOptions`` and enqueues library calls on the current
CUDA stream; nothing waits for the GPU. The operators of ``_ops.py`` (their schemas, fake
implementations and autograd rule) call ``forward`` / ``backward``; ``lfce.distributed`` calls them
on its vocabulary shard. ``scaled`` is eager mode's backward (lfce_scale_gradient).

The first call for a problem loads (or compiles) its kernels, which cannot happen while a CUDA
graph is being captured: such a call raises a UsageError asking for a warm-up call first.
"""

from __future__ import annotations

import ctypes
import dataclasses
from typing import Any, NamedTuple

import torch
from torch import Tensor

from . import _lib
from . import options as _options
from .errors import InvalidArgumentError, UsageError
from .options import LossOptions, Mode

__all__ = ["ForwardOutputs", "backward", "compiling", "forward", "scale_held_gradients", "scaled"]

DTYPES = {torch.bfloat16: _lib.DTYPE_BF16, torch.float16: _lib.DTYPE_FP16, torch.float32: _lib.DTYPE_FP32}
INDEX_DTYPES = {torch.int64: _lib.INDEX_INT64, torch.int32: _lib.INDEX_INT32}
_ALIGNMENT = 16  # bytes; the most lfce.h asks of any operand
_F32 = torch.float32
NO_GRADIENTS = (False, False, False)


class ForwardOutputs(NamedTuple):
    """lfce::forward's outputs (see _ops.py): None for a gradient not computed, an empty predicted
    without OUTPUT_PREDICTED."""

    loss: Tensor
    lse: Tensor
    valid_count: Tensor
    grad_hidden: Tensor | None
    grad_weight: Tensor | None
    grad_bias: Tensor | None
    predicted: Tensor


def compiling() -> bool:
    """Whether torch.compile is tracing (False when this PyTorch cannot tell, or cannot compile)."""
    is_compiling = getattr(getattr(torch, "compiler", None), "is_compiling", None)
    return bool(is_compiling()) if is_compiling is not None else False


def statistics_dtype(tensor: Tensor) -> torch.dtype:
    """The dtype of the loss, lse, valid_count, grad_loss and grad_lse for inputs like ``tensor``:
    fp32, fp64 for the fp64 inputs that only the CPU implementation (_cpu.py) takes."""
    return torch.float64 if tensor.dtype == torch.float64 else _F32


def accumulated(wanted: tuple[bool, bool, bool], accumulators: tuple[Tensor | None, Tensor | None]
                ) -> tuple[bool, bool]:
    """(accumulate grad_weight, accumulate grad_bias): an accumulator given for a wanted gradient."""
    return (wanted[1] and accumulators[0] is not None, wanted[2] and accumulators[1] is not None)


# --- operands as lfce.h asks for them ---------------------------------------------------------

def _aligned(tensor: Tensor | None, alignment: int = _ALIGNMENT) -> Tensor | None:
    """A contiguous version of tensor starting on `alignment` bytes (itself when it already is)."""
    if tensor is None:
        return None
    tensor = tensor.contiguous()
    if tensor.data_ptr() % alignment:
        tensor = tensor.clone()  # a fresh allocation is aligned
    return tensor


def _rows_aligned(tensor: Tensor) -> Tensor:
    """hidden or weight ([rows, H]) as lfce.h asks: starting on 16 bytes when a row's bytes are a
    multiple of 16, else on the widest of 8, 4 or the element size that divides them (the kernels
    copy rows in such pieces). So a slice of whole rows of an odd-H tensor is used in place."""
    row_bytes = tensor.shape[-1] * tensor.element_size()
    piece = next((piece for piece in (16, 8, 4) if row_bytes % piece == 0), tensor.element_size())
    aligned = _aligned(tensor, piece)
    assert aligned is not None
    return aligned


def _ptr(tensor: Tensor | None) -> int | None:
    return None if tensor is None else tensor.data_ptr()


def _workspace(nbytes: int, device: torch.device) -> Tensor:
    # At least one byte so the pointer is a real allocation even when none is needed.
    return torch.empty(max(int(nbytes), 1), dtype=torch.uint8, device=device)


def _stream(device: torch.device) -> int | None:
    return torch.cuda.current_stream(device).cuda_stream or None  # 0 is the legacy default stream


def _accumulator(name: str, tensor: Tensor | None, like: Tensor) -> Tensor:
    """``tensor`` as the kernels add into it: fp32, contiguous, like's shape (the Python layer
    checks this with the user's names; here it guards direct calls of the operator). Never a copy:
    the sum would be lost."""
    assert tensor is not None
    if tensor.dtype != _F32 or not tensor.is_contiguous() or tuple(tensor.shape) != tuple(like.shape):
        raise InvalidArgumentError(f"{name} must be a contiguous torch.float32 tensor of shape {tuple(like.shape)}, "
                                   f"got {tensor.dtype} of shape {tuple(tensor.shape)} and strides {tensor.stride()}")
    return tensor


# --- eager mode's token chunk -----------------------------------------------------------------

# Eager mode's default token chunk: every token at once when the chunk's [N, V] exponentials
# (in the dtype) fit in an eighth of the device memory free now, else chunks of that budget,
# rounded down to a power of two so that nearby sizes share one plan.
_EAGER_MEMORY_SHARE = 8


def _eager_budget(hidden: Tensor, weight: Tensor) -> int | None:
    """workspace_budget for an eager call that set neither chunk_size nor workspace_budget: None
    (one chunk) when the [N, V] workspace fits, else the power of two under the free share."""
    free, _ = torch.cuda.mem_get_info(hidden.device)
    # Memory the caching allocator holds but no tensor uses is free to this call too.
    reserved, allocated = _allocator_bytes(hidden.device)
    free += reserved - allocated
    share = max(free // _EAGER_MEMORY_SHARE, 1)
    needed = hidden.shape[0] * weight.shape[0] * hidden.element_size()
    return None if needed <= share else 1 << (share.bit_length() - 1)


def _allocator_bytes(device: torch.device) -> tuple[int, int]:
    """(reserved, allocated) bytes of the caching allocator on ``device``. torch.cuda.memory_reserved
    and memory_allocated each flatten the allocator's whole statistics dictionary in Python (1 ms of
    host time an eager call at llama3-8b, docs/measurements.md#eager-scaling): its two counters are read from the
    nested dictionary itself where this PyTorch has it."""
    try:
        index = device.index if device.index is not None else torch.cuda.current_device()
        stats = torch._C._cuda_memoryStats(index)
        return int(stats["reserved_bytes"]["all"]["current"]), int(stats["allocated_bytes"]["all"]["current"])
    except (AttributeError, KeyError, TypeError, RuntimeError):
        return torch.cuda.memory_reserved(device), torch.cuda.memory_allocated(device)


# --- problems and the capture check -----------------------------------------------------------

def _problem(hidden: Tensor, weight: Tensor, bias: Tensor | None, targets: Tensor, class_weight: Tensor | None,
             options: LossOptions, mode: Mode, sequence_length: int, accumulate: tuple[bool, bool] = (False, False)
             ) -> _lib.Problem:
    return _options.problem(options, hidden.shape[0], hidden.shape[1], weight.shape[0], DTYPES[hidden.dtype],
                            target_dtype=INDEX_DTYPES[targets.dtype], has_bias=bias is not None,
                            has_class_weight=class_weight is not None, accumulate=accumulate,
                            sequence_length=sequence_length, mode=mode)


# Problems whose kernels this process has loaded, per device and pass: the only ones a CUDA graph
# capture may run (loading a module is not a stream operation and cannot be captured).
_loaded: set[tuple[Any, ...]] = set()


def _key(problem: _lib.Problem, device: torch.device, *which: Any) -> tuple[Any, ...]:
    return (device.index,) + tuple(getattr(problem, name) for name, *_ in _lib.Problem._fields_) + which


def _require_loaded(key: tuple[Any, ...], problem: _lib.Problem, what: str) -> None:
    if key in _loaded or not torch.cuda.is_current_stream_capturing():
        return
    dtype = {code: name for name, code in _lib.DTYPES.items()}[problem.dtype]
    raise UsageError(
        f"lfce: the first {what} for N={problem.tokens}, H={problem.hidden}, V={problem.vocab}, {dtype} "
        "runs inside CUDA graph capture, where its kernels cannot be loaded or compiled; run the same "
        "step once outside the capture first (a warm-up call with the same shapes and options)")


# --- the passes -------------------------------------------------------------------------------

def forward(hidden: Tensor, weight: Tensor, bias: Tensor | None, targets: Tensor, options: LossOptions, *,
            class_weight: Tensor | None = None, eager: bool = False, wanted: tuple[bool, bool, bool] = NO_GRADIENTS,
            sequence_length: int = 0) -> ForwardOutputs:
    """lfce_forward, or with ``eager`` lfce_forward_backward and the gradients ``wanted`` (need_hidden,
    need_weight, need_bias) for an upstream gradient of 1. hidden [N, H], targets [N]; class_weight
    fp32 [V] or None; sequence_length T > 0 for a causal shift. Eager with no gradient wanted runs the
    forward alone. The loss is [N] for reduction "none", else 0-dim."""
    hidden, weight = _rows_aligned(hidden), _rows_aligned(weight)
    bias, targets_, class_weight = _aligned(bias), _aligned(targets), _aligned(class_weight)
    assert targets_ is not None
    wanted = (wanted[0], wanted[1], wanted[2] and bias is not None) if eager else NO_GRADIENTS
    eager = eager and any(wanted)
    if eager and options.chunk_size is None and options.workspace_budget is None:
        options = dataclasses.replace(options, workspace_budget=_eager_budget(hidden, weight))
    problem = _problem(hidden, weight, bias, targets_, class_weight, options, "eager" if eager else "recompute",
                       sequence_length)
    device = hidden.device
    key = _key(problem, device, "forward", wanted)
    _require_loaded(key, problem, "forward")
    n = problem.tokens
    with torch.cuda.device(device):
        lse = hidden.new_empty(_lib.lse_rows(options.token_scaling, options.outputs) * n, dtype=_F32)
        token_loss = hidden.new_empty(n, dtype=_F32)
        predicted = hidden.new_empty(n if options.outputs & _lib.OUTPUT_PREDICTED else 0, dtype=torch.int64)
        loss = token_loss if options.reduction == "none" else hidden.new_empty((), dtype=_F32)
        # [1], or [3] with class weights; zeroed then: the library writes the last (the sum of all
        # class weights) only with label smoothing, and an output must not carry stale memory.
        valid_count = hidden.new_empty(1, dtype=_F32) if class_weight is None else hidden.new_zeros(3, dtype=_F32)
        # Eager: the gradients for an upstream gradient of 1 in the same call (lfce_forward_backward);
        # autograd's backward rescales them.
        grads: tuple[Tensor | None, Tensor | None, Tensor | None] = (None, None, None)
        if eager:
            grads = (hidden.new_empty(hidden.shape) if wanted[0] else None,
                     weight.new_empty(weight.shape) if wanted[1] else None,
                     bias.new_empty(bias.shape) if wanted[2] and bias is not None else None)
            workspace = _workspace(_lib.forward_backward_workspace_size(problem), device)
        else:
            workspace = _workspace(_lib.forward_workspace_size(problem), device)
        args = _lib.ForwardArgs(
            hidden=_ptr(hidden), weight=_ptr(weight), bias=_ptr(bias), targets=_ptr(targets_),
            class_weight=_ptr(class_weight), lse=_ptr(lse), token_loss=_ptr(token_loss),
            loss=None if options.reduction == "none" else _ptr(loss), valid_count=_ptr(valid_count),
            predicted=_ptr(predicted) if predicted.numel() else None,
            workspace=_ptr(workspace), workspace_bytes=workspace.numel(),
            device=device.index, stream=_stream(device),
        )
        if eager:
            _lib.check(_lib.load().lfce_forward_backward(ctypes.byref(problem), ctypes.byref(args),
                                                         *(_ptr(g) for g in grads)))
        else:
            _lib.check(_lib.load().lfce_forward(ctypes.byref(problem), ctypes.byref(args)))
        del workspace  # back to the caching allocator; reuse is ordered on this stream
    _loaded.add(key)
    return ForwardOutputs(loss, lse, valid_count, *grads, predicted)


def backward(hidden: Tensor, weight: Tensor, bias: Tensor | None, targets: Tensor, options: LossOptions, *,
             lse: Tensor, valid_count: Tensor, grad_loss: Tensor, wanted: tuple[bool, bool, bool],
             class_weight: Tensor | None = None, grad_lse: Tensor | None = None,
             weight_grad_accumulator: Tensor | None = None, bias_grad_accumulator: Tensor | None = None,
             sequence_length: int = 0) -> tuple[Tensor | None, Tensor | None, Tensor | None]:
    """Enqueue lfce_backward for the gradients ``wanted`` (need_hidden, need_weight, need_bias);
    return (grad_hidden, grad_weight, grad_bias), None for each one not wanted or added into its
    accumulator (fp32 buffers, or None). grad_loss: fp32 [1] or [N]; grad_lse: None, or the fp32
    gradient of lse's rows (lfce_backward_args.grad_lse).

    A gradient not wanted is never allocated and its kernel never runs (NULL in the C API).
    """
    hidden, weight = _rows_aligned(hidden), _rows_aligned(weight)
    bias, targets_, class_weight, grad_loss_, grad_lse = (
        _aligned(t) for t in (bias, targets, class_weight, grad_loss, grad_lse))
    assert targets_ is not None and grad_loss_ is not None
    need_hidden, need_weight, need_bias = wanted
    need_bias = need_bias and bias is not None
    if not (need_hidden or need_weight or need_bias):
        return None, None, None
    accumulators = (weight_grad_accumulator, bias_grad_accumulator)
    add_weight, add_bias = accumulated((need_hidden, need_weight, need_bias), accumulators)
    problem = _problem(hidden, weight, bias, targets_, class_weight, options, "recompute", sequence_length,
                       (add_weight, add_bias))
    device = hidden.device
    key = _key(problem, device, "backward", (need_hidden, need_weight, need_bias))
    _require_loaded(key, problem, "backward")
    with torch.cuda.device(device):
        grad_hidden = hidden.new_empty(hidden.shape) if need_hidden else None
        grad_weight = None
        if need_weight:
            grad_weight = (_accumulator("weight_grad_accumulator", accumulators[0], weight) if add_weight
                           else weight.new_empty(weight.shape))
        grad_bias = None
        if need_bias:
            assert bias is not None
            grad_bias = (_accumulator("bias_grad_accumulator", accumulators[1], bias) if add_bias
                         else bias.new_empty(bias.shape))
        workspace = _workspace(_lib.backward_workspace_size(problem), device)
        args = _lib.BackwardArgs(
            hidden=_ptr(hidden), weight=_ptr(weight), bias=_ptr(bias), targets=_ptr(targets_),
            class_weight=_ptr(class_weight), lse=_ptr(lse.contiguous()), valid_count=_ptr(valid_count.contiguous()),
            grad_loss=_ptr(grad_loss_), grad_lse=_ptr(grad_lse), grad_hidden=_ptr(grad_hidden),
            grad_weight=_ptr(grad_weight), grad_bias=_ptr(grad_bias),
            workspace=_ptr(workspace), workspace_bytes=workspace.numel(),
            device=device.index, stream=_stream(device),
        )
        _lib.check(_lib.load().lfce_backward(ctypes.byref(problem), ctypes.byref(args)))
        # The workspace goes back to the caching allocator here; reuse is ordered on this stream.
    _loaded.add(key)
    return grad_hidden, None if add_weight else grad_weight, None if add_bias else grad_bias


# --- eager mode's backward: the held gradients times the upstream gradient ----------------------

def scaled_reference(gradient: Tensor, grad_loss: Tensor) -> Tensor:
    """gradient · grad_loss in fp32 (fp64 for fp64 gradients), rounded once to the gradient's dtype
    (what lfce_scale_gradient computes; torch.mul would round grad_loss to a 16-bit gradient's dtype
    first: up to 2^-9 more relative error)."""
    dtype = statistics_dtype(gradient)
    return (gradient.to(dtype) * grad_loss.to(dtype)).to(gradient.dtype)


def scaled(gradient: Tensor, grad_loss: Tensor, out: Tensor | None = None) -> Tensor:
    """gradient · grad_loss (a 0-dim tensor) through lfce_scale_gradient, into ``out`` (a new tensor
    where None; ``gradient`` itself in place): the fp32 product rounded once to the gradient's
    dtype; scaled_reference for what the kernel does not take (a CPU tensor, another device, a
    non-contiguous or misaligned tensor)."""
    g = grad_loss.to(_F32).reshape(1)
    if (not gradient.is_cuda or not gradient.is_contiguous() or g.device != gradient.device
            or gradient.data_ptr() % 16 or gradient.dtype not in DTYPES):
        return scaled_reference(gradient, grad_loss)
    g = g.contiguous()
    out = torch.empty_like(gradient) if out is None else out
    device = gradient.device
    with torch.cuda.device(device):
        _lib.check(_lib.load().lfce_scale_gradient(DTYPES[gradient.dtype], gradient.data_ptr(), out.data_ptr(),
                                                   gradient.numel(), g.data_ptr(), device.index, _stream(device)))
    return out


def scale_held_gradients(ctx: Any, gradients: tuple[Tensor | None, ...], grad_loss: Tensor
                         ) -> tuple[Tensor | None, ...]:
    """Eager mode's backward outside torch.compile: each held gradient (computed in the forward for an
    upstream gradient of 1) times grad_loss, in place through lfce_scale_gradient (nothing written
    for an upstream gradient of 1); None stays None. In place, so it runs once per forward: a second
    backward through the same forward (retain_graph=True) is refused (``ctx`` remembers the first)."""
    if getattr(ctx, "scaled_in_place", False):
        raise UsageError("lfce: eager mode's backward scales the gradients it held since the forward in place, so "
                         "it runs once per forward; a second backward through the same forward (retain_graph=True) "
                         "needs mode='recompute'")
    ctx.scaled_in_place = True
    return tuple(None if g is None else scaled(g, grad_loss, out=g) for g in gradients)
