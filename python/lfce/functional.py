"""``linear_cross_entropy``: the fused loss as a differentiable PyTorch function.

The loss is ``F.cross_entropy(F.linear(hidden, weight, bias), targets)`` computed
without ever materialising the [tokens, vocab] logits. Two modes:

* ``"recompute"`` (default) keeps only the per-token log-sum-exp (4 bytes a token)
  between forward and backward; the backward recomputes the logits chunk by chunk.
* ``"eager"`` computes the gradients during the forward (upstream gradient 1) and
  keeps them until the backward, which only scales them. Faster backward, but it
  holds grad_hidden and grad_weight in between.

In both modes only the gradients autograd can ask for are computed: a frozen weight
(``requires_grad=False``: a frozen LM head, LoRA) gets no [V, H] grad_weight, a frozen
hidden no grad_hidden; their kernels never run. In recompute mode that is decided at
backward time (``ctx.needs_input_grad``), in eager mode at forward time (the inputs'
``requires_grad``).

Every call only enqueues work on the current CUDA stream: nothing here waits for
the GPU or reads a device value on the host.
"""

import ctypes
import logging
import operator

import torch
import torch.nn.functional as F
from torch.autograd.function import once_differentiable

from . import _check, _lib

__all__ = ["linear_cross_entropy", "validate_options"]

logger = logging.getLogger("lfce")

_DTYPES = {torch.bfloat16: _lib.DTYPE_BF16, torch.float16: _lib.DTYPE_FP16, torch.float32: _lib.DTYPE_FP32}
_INDEX_DTYPES = {torch.int64: _lib.INDEX_INT64, torch.int32: _lib.INDEX_INT32}
_ALIGNMENT = 16  # bytes; lfce.h asks for 16-byte aligned operands

_logged_once = set()


def _log_once(level, message, *args):
    key = (level, message)
    if key not in _logged_once:
        _logged_once.add(key)
        logger.log(level, message, *args)


def validate_options(ignore_index=-100, reduction="mean", mode="recompute", chunk_size=None,
                     workspace_budget=None):
    """Check the non-tensor options; raise ValueError/TypeError naming the bad value."""
    _check.integer("ignore_index", ignore_index)
    _check.choice("reduction", reduction, _lib.REDUCTIONS)
    _check.choice("mode", mode, _lib.MODES)
    _check.positive("chunk_size", chunk_size, allow_none=True)
    _check.positive("workspace_budget", workspace_budget, allow_none=True)


def _validate_tensors(hidden, weight, targets, bias):
    """Check types, shapes, dtypes, then devices; return (tokens, hidden size, vocab).

    Devices come last so that every other mistake is reported the same way on a
    machine without a GPU.
    """
    named = [("hidden", hidden), ("weight", weight), ("targets", targets)]
    if bias is not None:
        named.append(("bias", bias))
    for name, value in named:
        if not isinstance(value, torch.Tensor):
            raise TypeError(f"{name} must be a torch.Tensor, got {type(value).__name__}")

    if hidden.dim() < 1:
        raise ValueError("hidden must have shape [..., H], got a 0-dim tensor")
    H = hidden.shape[-1]
    if H < 1:
        raise ValueError(f"hidden must have H >= 1, got shape {tuple(hidden.shape)}")
    N = hidden.numel() // H
    if N < 1:
        raise ValueError(f"hidden holds no tokens: shape {tuple(hidden.shape)} has N = 0 rows of H = {H}")
    if weight.dim() != 2:
        raise ValueError(f"weight must have shape [V, H], got shape {tuple(weight.shape)}")
    V = weight.shape[0]
    if weight.shape[1] != H:
        raise ValueError(f"weight must have shape [V, H] with H = {H} from hidden, got shape "
                         f"{tuple(weight.shape)} (H = {weight.shape[1]})")
    if V < 1:
        raise ValueError(f"weight must have V >= 1 rows, got shape {tuple(weight.shape)}")
    if bias is not None and tuple(bias.shape) != (V,):
        raise ValueError(f"bias must have shape [V] = ({V},), got shape {tuple(bias.shape)}")
    if tuple(targets.shape) != tuple(hidden.shape[:-1]):
        raise ValueError(f"targets must have shape hidden.shape[:-1] = {tuple(hidden.shape[:-1])}, "
                         f"got shape {tuple(targets.shape)}")

    if targets.dtype not in _INDEX_DTYPES:
        raise TypeError(f"targets must be torch.int64 or torch.int32, got {targets.dtype}")
    if hidden.dtype not in _DTYPES:
        raise TypeError(f"hidden must be torch.bfloat16, torch.float16 or torch.float32, got {hidden.dtype}")
    for name, value in named[1:]:
        if name != "targets" and value.dtype != hidden.dtype:
            raise TypeError(f"{name} must have the dtype of hidden ({hidden.dtype}), got {value.dtype}")

    for name, value in named:
        if value.device.type != "cuda":
            raise ValueError(f"lfce runs on CUDA tensors only; {name} is on {value.device}")
    for name, value in named[1:]:
        if value.device != hidden.device:
            raise ValueError(f"{name} is on {value.device} but hidden is on {hidden.device}; "
                             "all tensors must be on one CUDA device")
    return N, H, V


def _aligned(tensor):
    """A contiguous, 16-byte aligned version of tensor (itself when it already is)."""
    if tensor is None:
        return None
    tensor = tensor.contiguous()
    if tensor.data_ptr() % _ALIGNMENT:
        tensor = tensor.clone()  # a fresh allocation is aligned
    return tensor


def _ptr(tensor):
    return None if tensor is None else tensor.data_ptr()


def _workspace(nbytes, device):
    # At least one byte so the pointer is a real allocation even when none is needed.
    return torch.empty(max(int(nbytes), 1), dtype=torch.uint8, device=device)


def _stream(device):
    return torch.cuda.current_stream(device).cuda_stream or None  # 0 is the legacy default stream


def _backward(problem, hidden, weight, bias, targets, lse, valid_count, grad_loss, wanted):
    """Enqueue lfce_backward for the gradients ``wanted`` (need_hidden, need_weight, need_bias);
    return (grad_hidden, grad_weight, grad_bias), None for each one not wanted.

    A gradient not wanted is never allocated and its kernel never runs (NULL in the C API).
    """
    need_hidden, need_weight, need_bias = wanted
    need_bias = need_bias and bias is not None
    if not (need_hidden or need_weight or need_bias):
        return None, None, None
    device = hidden.device
    grad_hidden = torch.empty_like(hidden) if need_hidden else None
    grad_weight = torch.empty_like(weight) if need_weight else None
    grad_bias = torch.empty_like(bias) if need_bias else None
    workspace = _workspace(_lib.backward_workspace_size(problem), device)
    args = _lib.BackwardArgs(
        hidden=_ptr(hidden), weight=_ptr(weight), bias=_ptr(bias), targets=_ptr(targets),
        lse=_ptr(lse), valid_count=_ptr(valid_count), grad_loss=_ptr(grad_loss),
        grad_hidden=_ptr(grad_hidden), grad_weight=_ptr(grad_weight), grad_bias=_ptr(grad_bias),
        workspace=_ptr(workspace), workspace_bytes=workspace.numel(),
        device=device.index, stream=_stream(device),
    )
    _lib.check(_lib.load().lfce_backward(ctypes.byref(problem), ctypes.byref(args)))
    # The workspace goes back to the caching allocator here; reuse is ordered on this stream.
    return grad_hidden, grad_weight, grad_bias


class _LinearCrossEntropy(torch.autograd.Function):
    """autograd node over lfce_forward / lfce_backward for 2-D hidden and 1-D targets."""

    @staticmethod
    def forward(ctx, hidden, weight, bias, targets, problem, grads_wanted):
        device = hidden.device
        N = problem.tokens
        with torch.cuda.device(device):
            f32 = {"dtype": torch.float32, "device": device}
            lse = torch.empty(N, **f32)
            token_loss = torch.empty(N, **f32)
            loss = torch.empty(1, **f32)
            valid_count = torch.empty(1, **f32)
            workspace = _workspace(_lib.forward_workspace_size(problem), device)
            args = _lib.ForwardArgs(
                hidden=_ptr(hidden), weight=_ptr(weight), bias=_ptr(bias), targets=_ptr(targets),
                lse=_ptr(lse), token_loss=_ptr(token_loss), loss=_ptr(loss), valid_count=_ptr(valid_count),
                workspace=_ptr(workspace), workspace_bytes=workspace.numel(),
                device=device.index, stream=_stream(device),
            )
            _lib.check(_lib.load().lfce_forward(ctypes.byref(problem), ctypes.byref(args)))
            del workspace

            ctx.problem = problem
            ctx.eager = problem.mode == _lib.MODE_EAGER
            if ctx.eager:
                # grad_loss NULL means an upstream gradient of 1; backward rescales. Only the
                # gradients of inputs that require one are computed and held (a frozen head: no
                # [V, H] grad_weight).
                ctx.save_for_backward(*_backward(problem, hidden, weight, bias, targets, lse,
                                                 valid_count, grad_loss=None, wanted=grads_wanted))
            else:
                ctx.save_for_backward(hidden, weight, bias, targets, lse, valid_count)

        if problem.reduction == _lib.REDUCTION_NONE:
            return token_loss.to(hidden.dtype)
        return loss.view(()).to(hidden.dtype)

    @staticmethod
    @once_differentiable
    def backward(ctx, grad_output):
        need_hidden, need_weight, need_bias = ctx.needs_input_grad[:3]
        if ctx.eager:
            saved = ctx.saved_tensors
            # grad_output is a 0-dim device tensor: scaling by it needs no host sync. An input
            # that required no gradient at forward time has none saved (and needs none now).
            grad_hidden, grad_weight, grad_bias = (
                torch.mul(g, grad_output) if need and g is not None else None
                for g, need in zip(saved, (need_hidden, need_weight, need_bias)))
            return grad_hidden, grad_weight, grad_bias, None, None, None

        hidden, weight, bias, targets, lse, valid_count = ctx.saved_tensors
        with torch.cuda.device(hidden.device):
            grad_loss = grad_output.to(torch.float32).contiguous().reshape(-1)  # [1] or [N]
            grad_hidden, grad_weight, grad_bias = _backward(ctx.problem, hidden, weight, bias, targets,
                                                            lse, valid_count, grad_loss,
                                                            wanted=(need_hidden, need_weight, need_bias))
        return grad_hidden, grad_weight, grad_bias, None, None, None


def linear_cross_entropy(hidden, weight, targets, bias=None, *, ignore_index=-100, reduction="mean",
                         mode="recompute", chunk_size=None, workspace_budget=None):
    """Cross-entropy of ``hidden @ weight.T + bias`` against ``targets``, fused.

    Same result as ``F.cross_entropy(F.linear(hidden, weight, bias).flatten(0, -2),
    targets.flatten(), ignore_index=ignore_index, reduction=reduction)`` (with the
    "none" loss shaped like ``targets``), differentiable w.r.t. hidden, weight and bias.

    Args:
        hidden: [..., H] CUDA tensor, bfloat16, float16 or float32.
        weight: [V, H], same dtype and device as hidden.
        targets: hidden.shape[:-1], int64 or int32, class indices in [0, V) or ignore_index.
        bias: optional [V], same dtype and device as hidden.
        ignore_index: targets equal to this give no loss and no gradient.
        reduction: "mean" (over non-ignored tokens; NaN if all are ignored, like PyTorch),
            "sum" or "none".
        mode: "recompute" (hold 4 bytes a token until backward) or "eager" (compute the
            gradients in the forward and hold them; "none" reduction falls back to recompute).
        chunk_size: vocabulary chunk width of the backward; None derives it from the budget.
        workspace_budget: bytes for the backward's logit-gradient chunk; None means 256 MiB.

    Returns:
        The loss in hidden's dtype: 0-dim for mean/sum, shape hidden.shape[:-1] for none.

    Raises:
        TypeError / ValueError naming the bad argument; lfce.CompileError if a kernel
        fails to compile; lfce.CudaError if the driver fails.
    """
    validate_options(ignore_index, reduction, mode, chunk_size, workspace_budget)
    N, H, V = _validate_tensors(hidden, weight, targets, bias)
    dtype = _DTYPES[hidden.dtype]
    batch_shape = hidden.shape[:-1]

    hidden = hidden.reshape(N, H)
    targets = targets.reshape(N)
    multiple = _lib.HIDDEN_MULTIPLE[dtype]
    if H % multiple:
        padded = -(-H // multiple) * multiple
        _log_once(logging.WARNING,
                  "lfce: hidden size %d is not a multiple of %d for %s; padding hidden and weight "
                  "with zeros to %d (copies both; pad the model's hidden size to avoid this)",
                  H, multiple, hidden.dtype, padded)
        # F.pad is differentiable: autograd slices the gradients back to H.
        hidden = F.pad(hidden, (0, padded - H))
        weight = F.pad(weight, (0, padded - H))
        H = padded

    if mode == "eager" and reduction == "none":
        _log_once(logging.INFO, "lfce: mode 'eager' needs a scalar loss; reduction 'none' uses 'recompute'")
        mode = "recompute"

    problem = _lib.make_problem(
        N, H, V, dtype, target_dtype=_INDEX_DTYPES[targets.dtype], has_bias=bias is not None,
        reduction=_lib.REDUCTIONS[reduction], mode=_lib.MODES[mode], ignore_index=operator.index(ignore_index),
        chunk_size=chunk_size, workspace_budget=workspace_budget,
    )
    # Inside Function.forward grad mode is off, so which gradients a backward can ask for is
    # decided here; eager mode computes only those (none when grad mode is off).
    grads_wanted = tuple(torch.is_grad_enabled() and t is not None and t.requires_grad
                         for t in (hidden, weight, bias))
    loss = _LinearCrossEntropy.apply(_aligned(hidden), _aligned(weight), _aligned(bias), _aligned(targets),
                                     problem, grads_wanted)
    if reduction == "none":
        loss = loss.reshape(batch_shape)
    return loss
