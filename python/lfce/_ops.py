"""The fused loss as PyTorch operators: ``torch.ops.lfce.forward`` and ``torch.ops.lfce.backward``.

Both are ``torch.library`` custom ops (PyTorch 2.4 and later), so ``torch.compile`` traces a
model that calls lfce without a graph break: Dynamo and Inductor see two opaque operators whose
output shapes and dtypes come from the fake implementations below (symbolic in the token count,
so a new N needs no recompilation), and the ctypes calls into liblfce.so run only inside the real
implementations, on CUDA tensors. The autograd formula is registered on ``lfce::forward``.

    lfce::forward(hidden [N, H], weight [V, H], bias [V]?, targets [N], class_weight [V]?,
                  weight_grad_accumulator [V, H]?, bias_grad_accumulator [V]?, ignore_index, reduction,
                  mode, chunk_size?, workspace_budget?, softcap?, temperature, z_loss_scale,
                  label_smoothing, token_scaling, need_hidden, need_weight, need_bias, outputs=0,
                  sequence_length=0)
        -> (loss, lse [rows * N], valid_count, grad_hidden, grad_weight, grad_bias, predicted)

    loss is fp32: 0-dim for "mean" / "sum", [N] for "none". valid_count is fp32 [1] (the count
    of targets != ignore_index), or [3] with class_weight (fp32 contiguous: the count, the sum of
    the counted tokens' class weights, the sum of all V class weights; lfce.h). In mode "eager"
    the gradients (for an upstream gradient of 1; with "mean" or "sum" only) are computed here
    for the inputs whose need_* is set; every gradient not computed is an empty tensor of shape
    [0] (an operator returns no None). class_weight gets no gradient (as PyTorch's ``weight``).
    The forward neither reads nor writes the two accumulators (fp32, contiguous; mode "recompute"
    only): they are inputs so that the autograd rule can hand them to lfce::backward. With
    token_scaling (Liger-Kernel's use_token_scaling) each counted token's loss and gradient are
    multiplied by its detached p(target); lse then holds the N LSEs followed by the N scales (0 for
    ignored tokens), and the backward reads the same [2N] buffer.

    outputs is a sum of lfce.h's lfce_output flags (_lib.OUTPUT_*): the extra per-token outputs of
    the softmax the loss sees (after softcap and temperature; no smoothing, class weight or token
    scale in them). lse holds rows = 1 + token_scaling + (ENTROPY) + (LOGPROB) rows of N, in this
    order: each token's LSE (every token), its scale with token_scaling, its entropy -sum_v p_v
    log p_v with OUTPUT_ENTROPY (every token), its log p(target) with OUTPUT_LOGPROB (0 for ignored
    tokens, NaN for a target outside [0, V)). predicted is int64 [N] with OUTPUT_PREDICTED (the
    argmax of the logits, the lowest index among equal maxima; -1 for ignored tokens), else [0].
    lse is differentiable: the gradient of its LSE, entropy and logprob rows reaches lfce::backward
    as grad_lse, added to the loss's (the scale row's is dropped: the scale is detached). Mode
    "eager" computes the gradients in the forward, before that gradient is known, so with
    OUTPUT_ENTROPY or OUTPUT_LOGPROB the forward runs "recompute" (as for "none"); otherwise in mode
    "eager" a gradient reaching lse (its LSE row) is dropped: lfce.linear_cross_entropy asks for
    "recompute" whenever it returns a row of lse.

    sequence_length: T > 0 for a causal shift (lfce_problem.sequence_length): the N tokens are
    sequences of T, position t of each is scored against targets[t + 1] of its sequence, read in
    place (targets stays the unshifted [N] tensor), and each sequence's last position counts as
    ignored (loss 0, no gradient, not in valid_count, predicted -1).

    lfce::backward(hidden, weight, bias?, targets, class_weight?, lse, valid_count,
                   grad_loss (fp32, [1] or [N]), weight_grad_accumulator(a!)?,
                   bias_grad_accumulator(b!)?, ignore_index, reduction, chunk_size?,
                   workspace_budget?, softcap?, temperature, z_loss_scale, label_smoothing,
                   token_scaling, need_hidden, need_weight, need_bias, grad_lse=None, outputs=0,
                   sequence_length=0)
        -> (grad_hidden, grad_weight, grad_bias), each [0] when not needed

    grad_lse: None, or fp32 [rows * N] laid out like lse: the upstream gradients of the LSE, entropy
    and logprob rows (dLSE/du = p, dH/du = -p (u - (LSE - H)), dlogp_y/du = onehot(y) - p for counted
    tokens), added to the loss's gradient before the softcap and temperature chain rule. Not with
    fp16 inputs (ValueError, as the library). grad_loss may be zeros when only grad_lse matters.

    With an accumulator, the needed grad_weight (grad_bias) is added into it in place, in fp32,
    by the kernel that would have written it (lfce_problem.accumulate_grad_weight / _bias): no
    [V, H] temporary; the operator returns [0] for that gradient and declares the accumulators
    mutated, so torch.compile orders and keeps the write. Autograd gives weight (bias) no
    gradient then.

A gradient not needed is never allocated and its kernel never runs (a NULL pointer in the C API).

Outside torch.compile the same implementations and autograd rule run inside a
``torch.autograd.Function`` instead (also on a PyTorch without custom ops): calling a custom op
with an autograd formula imports torch._dynamo on first use, 3.6 s of cold start that eager
training does not need. Results are identical either way.

The first call for a problem loads (or compiles) its kernels, which cannot happen while a CUDA
graph is being captured: such a call raises a RuntimeError asking for a warm-up call first.
"""

import ctypes
from typing import Optional

import torch
from torch import Tensor

from . import _lib
from .errors import InvalidArgumentError, UsageError

__all__ = ["HAVE_CUSTOM_OPS", "forward"]

HAVE_CUSTOM_OPS = all(hasattr(torch.library, name) for name in ("custom_op", "register_fake", "register_autograd"))

DTYPES = {torch.bfloat16: _lib.DTYPE_BF16, torch.float16: _lib.DTYPE_FP16, torch.float32: _lib.DTYPE_FP32}
INDEX_DTYPES = {torch.int64: _lib.INDEX_INT64, torch.int32: _lib.INDEX_INT32}
_ALIGNMENT = 16  # bytes; the most lfce.h asks of any operand
_F32 = torch.float32
# The operators' schemas are inferred from these annotations (at run time: no string annotations).
OptionalTensor = Optional[Tensor]
OptionalInt = Optional[int]
OptionalFloat = Optional[float]


# --- the real implementations (ctypes) --------------------------------------------------------

def _aligned(tensor, alignment=_ALIGNMENT):
    """A contiguous version of tensor starting on `alignment` bytes (itself when it already is)."""
    if tensor is None:
        return None
    tensor = tensor.contiguous()
    if tensor.data_ptr() % alignment:
        tensor = tensor.clone()  # a fresh allocation is aligned
    return tensor


def _rows_aligned(tensor):
    """hidden or weight ([rows, H]) as lfce.h asks: starting on 16 bytes when a row's bytes are a
    multiple of 16, else on the widest of 8, 4 or the element size that divides them (the kernels
    copy rows in such pieces). So a slice of whole rows of an odd-H tensor is used in place."""
    row_bytes = tensor.shape[-1] * tensor.element_size()
    return _aligned(tensor, next((piece for piece in (16, 8, 4) if row_bytes % piece == 0), tensor.element_size()))


def _ptr(tensor):
    return None if tensor is None else tensor.data_ptr()


def _workspace(nbytes, device):
    # At least one byte so the pointer is a real allocation even when none is needed.
    return torch.empty(max(int(nbytes), 1), dtype=torch.uint8, device=device)


def _stream(device):
    return torch.cuda.current_stream(device).cuda_stream or None  # 0 is the legacy default stream


def _check_class_weight(class_weight, valid_count=None):
    """The operators' own check of what the kernels read as float*: the functional layer converts
    class weights to fp32, a direct operator call must pass them so; the backward's valid_count
    must hold the three counts then."""
    if class_weight is None:
        return
    if class_weight.dtype != torch.float32:
        raise InvalidArgumentError(f"lfce operators: class_weight must be torch.float32, got {class_weight.dtype}")
    if valid_count is not None and valid_count.numel() < 3:
        raise InvalidArgumentError("lfce::backward: with class_weight, valid_count must hold 3 counts (as "
                                   f"lfce::forward returns it), got {valid_count.numel()}")


_DIFFERENTIABLE_OUTPUTS = _lib.OUTPUT_ENTROPY | _lib.OUTPUT_LOGPROB


def _eager(mode, reduction, outputs):
    """Whether the forward computes the gradients: mode "eager" needs a scalar loss and no entropy
    or logprob row (their gradients come after the forward); otherwise it recomputes."""
    return mode == "eager" and reduction != "none" and not outputs & _DIFFERENTIABLE_OUTPUTS


# Eager mode's default token chunk: every token at once when the chunk's [N, V] exponentials
# (in the dtype) fit in an eighth of the device memory free now, else chunks of that budget,
# rounded down to a power of two so that nearby sizes share one plan.
_EAGER_MEMORY_SHARE = 8


def _eager_budget(hidden, weight):
    """workspace_budget for an eager call that set neither chunk_size nor workspace_budget: None
    (one chunk) when the [N, V] workspace fits, else the power of two under the free share."""
    free, _ = torch.cuda.mem_get_info(hidden.device)
    # Memory the caching allocator holds but no tensor uses is free to this call too.
    reserved, allocated = _allocator_bytes(hidden.device)
    free += reserved - allocated
    share = max(free // _EAGER_MEMORY_SHARE, 1)
    needed = hidden.shape[0] * weight.shape[0] * hidden.element_size()
    return None if needed <= share else 1 << (share.bit_length() - 1)


def _allocator_bytes(device):
    """(reserved, allocated) bytes of the caching allocator on ``device``. torch.cuda.memory_reserved
    and memory_allocated each flatten the allocator's whole statistics dictionary in Python (1 ms of
    host time an eager call at llama3-8b, docs/measurements.md#eager-scaling): its two counters are read from the
    nested dictionary itself where this PyTorch has it."""
    try:
        stats = torch._C._cuda_memoryStats(device.index if device.index is not None else torch.cuda.current_device())
        return int(stats["reserved_bytes"]["all"]["current"]), int(stats["allocated_bytes"]["all"]["current"])
    except (AttributeError, KeyError, TypeError, RuntimeError):
        return torch.cuda.memory_reserved(device), torch.cuda.memory_allocated(device)


def _problem(hidden, weight, bias, targets, class_weight, ignore_index, reduction, mode, chunk_size,
             workspace_budget, softcap, temperature, z_loss_scale, label_smoothing, token_scaling, outputs,
             sequence_length, accumulate=(False, False)):
    return _lib.make_problem(
        hidden.shape[0], hidden.shape[1], weight.shape[0], DTYPES[hidden.dtype],
        target_dtype=INDEX_DTYPES[targets.dtype], has_bias=bias is not None,
        reduction=_lib.REDUCTIONS[reduction], mode=_lib.MODES[mode], ignore_index=ignore_index,
        chunk_size=chunk_size, workspace_budget=workspace_budget, softcap=softcap, temperature=temperature,
        z_loss_scale=z_loss_scale, label_smoothing=label_smoothing, has_class_weight=class_weight is not None,
        accumulate_grad_weight=accumulate[0], accumulate_grad_bias=accumulate[1], token_scaling=token_scaling,
        outputs=outputs, sequence_length=sequence_length)


def _accumulated(wanted, accumulators):
    """(accumulate grad_weight, accumulate grad_bias): an accumulator given for a wanted gradient."""
    return tuple(want and acc is not None for want, acc in zip(wanted[1:], accumulators))


def _accumulator(name, tensor, like):
    """``tensor`` as the kernels add into it: fp32, contiguous, like's shape (the Python layer
    checks this with the user's names; here it guards direct calls of the operator). Never a copy:
    the sum would be lost."""
    if tensor.dtype != _F32 or not tensor.is_contiguous() or tuple(tensor.shape) != tuple(like.shape):
        raise InvalidArgumentError(f"{name} must be a contiguous torch.float32 tensor of shape {tuple(like.shape)}, "
                                   f"got {tensor.dtype} of shape {tuple(tensor.shape)} and strides {tensor.stride()}")
    return tensor


def _lse_size(n, token_scaling, outputs):
    """The forward's lse: the N LSEs, then with token scaling the N scales p(target), then the N
    entropies and the N logprobs where asked for (lfce.h)."""
    return _lib.lse_rows(token_scaling, outputs) * n


def _check_lse(hidden, lse, grad_lse, token_scaling, outputs):
    """The backward's lse and grad_lse as lfce::forward made lse: the kernels would read past a
    shorter one, or one row as another; and grad_lse not with fp16 (the library refuses it)."""
    n = hidden.shape[0]
    expected = _lse_size(n, token_scaling, outputs)
    if lse.numel() != expected:
        raise InvalidArgumentError(f"lfce::backward: lse must hold {expected} values for {n} tokens with "
                                   f"token_scaling={token_scaling} and outputs={outputs} (as lfce::forward returns "
                                   f"it), got {lse.numel()}")
    if grad_lse is None:
        return
    if grad_lse.numel() != expected or grad_lse.dtype != _F32:
        raise InvalidArgumentError(f"lfce::backward: grad_lse must be torch.float32 with {expected} values, like lse, "
                                   f"got {grad_lse.dtype} with {grad_lse.numel()}")
    if hidden.dtype == torch.float16:
        raise InvalidArgumentError("lfce::backward: grad_lse (a gradient of the lse, entropy or logprob outputs) is "
                                   "not supported with torch.float16 inputs; use torch.bfloat16 or torch.float32")


def _valid_count(hidden, class_weight):
    """The forward's valid_count: [1], or [3] with class weights. Zeroed then: the library writes
    the last (the sum of all class weights) only with label smoothing, and an output must not
    carry stale memory."""
    if class_weight is None:
        return hidden.new_empty(1, dtype=_F32)
    return hidden.new_zeros(3, dtype=_F32)


# Problems whose kernels this process has loaded, per device and pass: the only ones a CUDA graph
# capture may run (loading a module is not a stream operation and cannot be captured).
_loaded = set()


def _key(problem, device, *which):
    return (device.index,) + tuple(getattr(problem, name) for name, _ in _lib.Problem._fields_) + which


def _require_loaded(key, problem, what):
    if key in _loaded or not torch.cuda.is_current_stream_capturing():
        return
    dtype = {code: name for name, code in _lib.DTYPES.items()}[problem.dtype]
    raise UsageError(
        f"lfce: the first {what} for N={problem.tokens}, H={problem.hidden}, V={problem.vocab}, {dtype} "
        "runs inside CUDA graph capture, where its kernels cannot be loaded or compiled; run the same "
        "step once outside the capture first (a warm-up call with the same shapes and options)")


def backward_kernels(problem, hidden, weight, bias, targets, class_weight, lse, valid_count, grad_loss, wanted,
                     accumulators=(None, None), grad_lse=None):
    """Enqueue lfce_backward for the gradients ``wanted`` (need_hidden, need_weight, need_bias);
    return (grad_hidden, grad_weight, grad_bias), None for each one not wanted or added into its
    accumulator (weight_grad_accumulator, bias_grad_accumulator: fp32 buffers, or None; the
    problem's accumulate flags must match what _accumulated() says). grad_lse: None, or the fp32
    gradient of lse's rows (lfce_backward_args.grad_lse).

    A gradient not wanted is never allocated and its kernel never runs (NULL in the C API).
    """
    need_hidden, need_weight, need_bias = wanted
    need_bias = need_bias and bias is not None
    if not (need_hidden or need_weight or need_bias):
        return None, None, None
    device = hidden.device
    add_weight, add_bias = problem.accumulate_grad_weight, problem.accumulate_grad_bias
    grad_hidden = hidden.new_empty(hidden.shape) if need_hidden else None
    grad_weight = None
    if need_weight:
        grad_weight = (_accumulator("weight_grad_accumulator", accumulators[0], weight) if add_weight
                       else weight.new_empty(weight.shape))
    grad_bias = None
    if need_bias:
        grad_bias = (_accumulator("bias_grad_accumulator", accumulators[1], bias) if add_bias
                     else bias.new_empty(bias.shape))
    workspace = _workspace(_lib.backward_workspace_size(problem), device)
    args = _lib.BackwardArgs(
        hidden=_ptr(hidden), weight=_ptr(weight), bias=_ptr(bias), targets=_ptr(targets),
        class_weight=_ptr(class_weight), lse=_ptr(lse), valid_count=_ptr(valid_count), grad_loss=_ptr(grad_loss),
        grad_lse=_ptr(grad_lse), grad_hidden=_ptr(grad_hidden), grad_weight=_ptr(grad_weight),
        grad_bias=_ptr(grad_bias),
        workspace=_ptr(workspace), workspace_bytes=workspace.numel(),
        device=device.index, stream=_stream(device),
    )
    _lib.check(_lib.load().lfce_backward(ctypes.byref(problem), ctypes.byref(args)))
    # The workspace goes back to the caching allocator here; reuse is ordered on this stream.
    return grad_hidden, None if add_weight else grad_weight, None if add_bias else grad_bias


def _or_empty(grads, like):
    """The operators' form of optional gradients: an empty [0] tensor for None."""
    return tuple(like.new_empty(0) if g is None else g for g in grads)


def _forward_impl(hidden: Tensor, weight: Tensor, bias: OptionalTensor, targets: Tensor, class_weight: OptionalTensor,
                  weight_grad_accumulator: OptionalTensor, bias_grad_accumulator: OptionalTensor, ignore_index: int,
                  reduction: str, mode: str, chunk_size: OptionalInt, workspace_budget: OptionalInt,
                  softcap: OptionalFloat, temperature: float, z_loss_scale: float, label_smoothing: float,
                  token_scaling: bool, need_hidden: bool, need_weight: bool, need_bias: bool, outputs: int = 0,
                  sequence_length: int = 0) -> tuple[Tensor, Tensor, Tensor, Tensor, Tensor, Tensor, Tensor]:
    eager = _eager(mode, reduction, outputs)
    if eager and (weight_grad_accumulator is not None or bias_grad_accumulator is not None):
        # The accumulators are the backward's; eager mode has no backward kernels to add in (as the library).
        raise InvalidArgumentError("lfce::forward: gradient accumulators need mode 'recompute', got mode 'eager'")
    _check_class_weight(class_weight)
    hidden, weight = _rows_aligned(hidden), _rows_aligned(weight)
    bias, targets, class_weight = _aligned(bias), _aligned(targets), _aligned(class_weight)
    wanted = (need_hidden, need_weight, need_bias and bias is not None) if eager else (False, False, False)
    eager = eager and any(wanted)  # no gradient wanted: the forward alone
    if eager and chunk_size is None and workspace_budget is None:
        workspace_budget = _eager_budget(hidden, weight)
    problem = _problem(hidden, weight, bias, targets, class_weight, ignore_index, reduction,
                       "eager" if eager else "recompute", chunk_size, workspace_budget, softcap, temperature,
                       z_loss_scale, label_smoothing, token_scaling, outputs, sequence_length)
    device = hidden.device
    key = _key(problem, device, "forward", wanted)
    _require_loaded(key, problem, "forward")
    n = problem.tokens
    with torch.cuda.device(device):
        lse = hidden.new_empty(_lse_size(n, token_scaling, outputs), dtype=_F32)
        token_loss = hidden.new_empty(n, dtype=_F32)
        predicted = hidden.new_empty(_predicted_size(n, outputs), dtype=torch.int64)
        loss = token_loss if reduction == "none" else hidden.new_empty((), dtype=_F32)
        valid_count = _valid_count(hidden, class_weight)
        # Eager: the gradients for an upstream gradient of 1 in the same call (lfce_forward_backward);
        # autograd's backward rescales them.
        grads = (None, None, None)
        if eager:
            grads = (hidden.new_empty(hidden.shape) if wanted[0] else None,
                     weight.new_empty(weight.shape) if wanted[1] else None,
                     bias.new_empty(bias.shape) if wanted[2] else None)
            workspace = _workspace(_lib.forward_backward_workspace_size(problem), device)
        else:
            workspace = _workspace(_lib.forward_workspace_size(problem), device)
        args = _lib.ForwardArgs(
            hidden=_ptr(hidden), weight=_ptr(weight), bias=_ptr(bias), targets=_ptr(targets),
            class_weight=_ptr(class_weight), lse=_ptr(lse), token_loss=_ptr(token_loss),
            loss=None if reduction == "none" else _ptr(loss), valid_count=_ptr(valid_count),
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
    return (loss, lse, valid_count) + _or_empty(grads, hidden) + (predicted,)


def _backward_impl(hidden: Tensor, weight: Tensor, bias: OptionalTensor, targets: Tensor, class_weight: OptionalTensor,
                   lse: Tensor, valid_count: Tensor, grad_loss: Tensor, weight_grad_accumulator: OptionalTensor,
                   bias_grad_accumulator: OptionalTensor, ignore_index: int, reduction: str,
                   chunk_size: OptionalInt, workspace_budget: OptionalInt, softcap: OptionalFloat,
                   temperature: float, z_loss_scale: float, label_smoothing: float, token_scaling: bool,
                   need_hidden: bool, need_weight: bool, need_bias: bool, grad_lse: OptionalTensor = None,
                   outputs: int = 0, sequence_length: int = 0) -> tuple[Tensor, Tensor, Tensor]:
    _check_class_weight(class_weight, valid_count)
    _check_lse(hidden, lse, grad_lse, token_scaling, outputs)
    hidden, weight = _rows_aligned(hidden), _rows_aligned(weight)
    bias, targets, class_weight, grad_loss, grad_lse = (_aligned(t) for t in (bias, targets, class_weight, grad_loss,
                                                                             grad_lse))
    wanted = (need_hidden, need_weight, need_bias and bias is not None)
    accumulators = (weight_grad_accumulator, bias_grad_accumulator)
    problem = _problem(hidden, weight, bias, targets, class_weight, ignore_index, reduction, "recompute", chunk_size,
                       workspace_budget, softcap, temperature, z_loss_scale, label_smoothing, token_scaling, outputs,
                       sequence_length, _accumulated(wanted, accumulators))
    key = _key(problem, hidden.device, "backward", wanted)
    _require_loaded(key, problem, "backward")
    with torch.cuda.device(hidden.device):
        grads = backward_kernels(problem, hidden, weight, bias, targets, class_weight, lse.contiguous(),
                                 valid_count.contiguous(), grad_loss, wanted, accumulators, grad_lse)
    _loaded.add(key)
    return _or_empty(grads, hidden)


# --- fake implementations: the exact shapes and dtypes, nothing run ---------------------------

def _empty_unless(wanted, like):
    return like.new_empty(like.shape) if wanted else like.new_empty(0)


def _predicted_size(n, outputs):
    return n if outputs & _lib.OUTPUT_PREDICTED else 0


def _forward_fake(hidden, weight, bias, targets, class_weight, weight_grad_accumulator, bias_grad_accumulator,
                  ignore_index, reduction, mode, chunk_size, workspace_budget, softcap, temperature, z_loss_scale,
                  label_smoothing, token_scaling, need_hidden, need_weight, need_bias, outputs=0, sequence_length=0):
    n = hidden.shape[0]
    eager = _eager(mode, reduction, outputs)
    loss = hidden.new_empty((n,) if reduction == "none" else (), dtype=_F32)
    grad_bias = _empty_unless(eager and need_bias, bias) if bias is not None else hidden.new_empty(0)
    valid_count = hidden.new_empty(1 if class_weight is None else 3, dtype=_F32)
    return (loss, hidden.new_empty(_lse_size(n, token_scaling, outputs), dtype=_F32), valid_count,
            _empty_unless(eager and need_hidden, hidden), _empty_unless(eager and need_weight, weight), grad_bias,
            hidden.new_empty(_predicted_size(n, outputs), dtype=torch.int64))


def _backward_fake(hidden, weight, bias, targets, class_weight, lse, valid_count, grad_loss, weight_grad_accumulator,
                   bias_grad_accumulator, ignore_index, reduction, chunk_size, workspace_budget, softcap, temperature,
                   z_loss_scale, label_smoothing, token_scaling, need_hidden, need_weight, need_bias, grad_lse=None,
                   outputs=0, sequence_length=0):
    # A gradient added into its accumulator is returned as [0], as one not needed.
    need_weight = need_weight and weight_grad_accumulator is None
    need_bias = need_bias and bias_grad_accumulator is None
    grad_bias = _empty_unless(need_bias, bias) if bias is not None else hidden.new_empty(0)
    return _empty_unless(need_hidden, hidden), _empty_unless(need_weight, weight), grad_bias


# --- autograd ---------------------------------------------------------------------------------

def _setup_context(ctx, inputs, output):
    hidden, weight, bias, targets, class_weight = inputs[:5]
    ignore_index, reduction, mode, chunk_size, workspace_budget = inputs[7:12]
    loss_options = inputs[12:17]  # softcap, temperature, z_loss_scale, label_smoothing, token_scaling
    outputs, sequence_length = (tuple(inputs[20:]) + (0, 0))[:2]  # a direct call may leave the defaults out
    _, lse, valid_count, grad_hidden, grad_weight, grad_bias, _ = output
    ctx.options = (ignore_index, reduction, chunk_size, workspace_budget) + tuple(loss_options)
    ctx.outputs, ctx.sequence_length = outputs, sequence_length
    ctx.eager = _eager(mode, reduction, outputs)
    ctx.has_bias = bias is not None
    # An output that no gradient reaches gets None, not zeros: no grad_lse for a loss alone (and
    # none with fp16, which the library refuses), no loss gradient to run for an entropy alone.
    ctx.set_materialize_grads(False)
    # Kept on ctx, not saved: save_for_backward's version check would fail a second forward into
    # the same buffer before this backward (and any in-place write to a view of its storage, such
    # as Megatron's flat gradient buffer). Under torch.compile AOTAutograd saves it with the check.
    ctx.accumulators = inputs[5:7]
    if ctx.eager:
        # Only the gradients of inputs that required one at forward time were computed.
        ctx.computed = inputs[17:20]
        ctx.save_for_backward(grad_hidden, grad_weight, grad_bias)
    else:
        ctx.save_for_backward(hidden, weight, bias, targets, class_weight, lse, valid_count)


def _backward_rule(ctx, grad_loss, grad_lse, *unused):
    """Gradients of lfce::forward's 22 inputs from the upstream gradients of the loss and of lse
    (fp32; either None where no gradient reached it); none for weight (bias) when its gradient
    was added into weight_grad_accumulator (bias_grad_accumulator)."""
    need_hidden, need_weight, need_bias = ctx.needs_input_grad[:3]
    need_bias = need_bias and ctx.has_bias
    wanted = (need_hidden, need_weight, need_bias)
    if ctx.eager:
        # grad_lse is dropped: these gradients were computed in the forward, before it was known
        # (torch.compile and opcheck hand every output a gradient, zeros included, so it is no error).
        grad_lse = None
    if (grad_loss is None and grad_lse is None) or not any(wanted):
        grads = (None, None, None)
    elif ctx.eager:
        # grad_loss is 0-dim (mean / sum): scaling by it needs no host sync. Each gradient is
        # multiplied by it in fp32 and rounded once to its dtype (torch.mul would round grad_loss
        # to a 16-bit gradient's dtype first: up to 2^-9 more relative error). Outside torch.compile
        # lfce's own kernel does it in place in the held gradients, which become the returned ones
        # (PyTorch's for a 16-bit tensor and an fp32 0-dim tensor is unvectorised: 2.45 of eager's
        # 42.7 ms at llama3-8b, docs/measurements.md#eager-scaling); with an upstream gradient of 1 it
        # writes nothing. So a second backward through the same forward (retain_graph) would see
        # scaled gradients: it is refused. torch.compile fuses _scaled_reference's out-of-place product into one kernel.
        if _compiling() or _tracing(*ctx.saved_tensors):
            scale = _scaled_reference
        else:
            if getattr(ctx, "scaled_in_place", False):
                raise UsageError("lfce: eager mode's backward scales the gradients it held since the forward in "
                                   "place, so it runs once per forward; a second backward through the same "
                                   "forward (retain_graph=True) needs mode='recompute'")
            ctx.scaled_in_place = True
            scale = _scaled_in_place
        grads = tuple(scale(g, grad_loss) if need and computed else None
                      for g, need, computed in zip(ctx.saved_tensors, wanted, ctx.computed))
    else:
        hidden, weight, bias, targets, class_weight, lse, valid_count = ctx.saved_tensors
        if grad_loss is None:  # only lse's rows get a gradient (NULL would mean 1)
            grad_loss = hidden.new_zeros(hidden.shape[0] if ctx.options[1] == "none" else 1, dtype=_F32)
        grad_loss = grad_loss.to(_F32).reshape(-1)  # [1] or [N]
        if grad_lse is not None:
            grad_lse = grad_lse.to(_F32).contiguous()
        backward_op = _backward_impl if getattr(ctx, "direct", False) else _backward_op
        grads = backward_op(hidden, weight, bias, targets, class_weight, lse, valid_count, grad_loss,
                            *ctx.accumulators, *ctx.options, need_hidden, need_weight, need_bias, grad_lse,
                            ctx.outputs, ctx.sequence_length)
        returned = (need_hidden, need_weight and ctx.accumulators[0] is None,
                    need_bias and ctx.accumulators[1] is None)
        grads = tuple(g if want else None for g, want in zip(grads, returned))
    return grads + (None,) * 19  # none for targets, class_weight, the accumulators (not differentiable), options


def _scaled_reference(gradient, grad_loss):
    """gradient · grad_loss in fp32, rounded once to the gradient's dtype (what lfce_scale_gradient
    computes)."""
    return (gradient.to(_F32) * grad_loss.to(_F32)).to(gradient.dtype)


def _scaled(gradient, grad_loss, out=None):
    """gradient · grad_loss (a 0-dim CUDA tensor) through lfce_scale_gradient, into ``out`` (a new
    tensor where None; ``gradient`` itself in place): the fp32 product rounded once to the
    gradient's dtype; _scaled_reference for what the kernel does not take (another device, a
    non-contiguous or misaligned tensor)."""
    g = grad_loss.to(_F32).reshape(1)
    if (not gradient.is_cuda or not gradient.is_contiguous() or g.device != gradient.device
            or gradient.data_ptr() % 16 or gradient.dtype not in DTYPES):
        return _scaled_reference(gradient, grad_loss)
    g = g.contiguous()
    out = torch.empty_like(gradient) if out is None else out
    device = gradient.device
    with torch.cuda.device(device):
        _lib.check(_lib.load().lfce_scale_gradient(DTYPES[gradient.dtype], gradient.data_ptr(), out.data_ptr(),
                                                   gradient.numel(), g.data_ptr(), device.index, _stream(device)))
    return out


def _scaled_in_place(gradient, grad_loss):
    """_scaled into ``gradient`` itself (nothing written for an upstream gradient of 1)."""
    return _scaled(gradient, grad_loss, out=gradient)


# --- registration (once per process) ----------------------------------------------------------

def _registered(name):
    return hasattr(torch.ops.lfce, name)  # False until this process defines lfce::<name>


def _register():
    """Define lfce::forward and lfce::backward unless this process already has them."""
    if not _registered("backward"):
        op = torch.library.custom_op("lfce::backward", mutates_args=("weight_grad_accumulator", "bias_grad_accumulator"),
                                     device_types="cuda")(_backward_impl)
        op.register_fake(_backward_fake)
    if not _registered("forward"):
        op = torch.library.custom_op("lfce::forward", mutates_args=(), device_types="cuda")(_forward_impl)
        op.register_fake(_forward_fake)
        op.register_autograd(_backward_rule, setup_context=_setup_context)
    return torch.ops.lfce.forward.default, torch.ops.lfce.backward.default


class _LinearCrossEntropy(torch.autograd.Function):
    """The same implementations and autograd rule as lfce::forward, without the operator.

    Used outside torch.compile (and on a PyTorch without torch.library.custom_op): calling a
    custom op that has an autograd formula makes PyTorch import torch._dynamo on the first call
    (3.6 s on an H200 host, three times lfce's own cold start), which eager training never needs.
    """

    @staticmethod
    def forward(ctx, *inputs):
        output = _forward_impl(*inputs)
        _setup_context(ctx, inputs, output)
        ctx.direct = True  # its backward calls the implementation, not lfce::backward
        return output

    @staticmethod
    @torch.autograd.function.once_differentiable
    def backward(ctx, *grads):
        return _backward_rule(ctx, *grads)


def _tracing(*tensors):
    """Whether these tensors are traced rather than computed (fake tensors, or a dispatch mode such
    as make_fx's or opcheck's is active): lfce's own kernels on their pointers would escape the
    trace. False where this PyTorch cannot tell."""
    try:
        from torch._subclasses.fake_tensor import is_fake
        from torch.utils._python_dispatch import _get_current_dispatch_mode
    except ImportError:
        return False
    return _get_current_dispatch_mode() is not None or any(is_fake(t) for t in tensors)


def _compiling():
    """Whether torch.compile is tracing (False when this PyTorch cannot tell, or cannot compile)."""
    is_compiling = getattr(getattr(torch, "compiler", None), "is_compiling", None)
    return bool(is_compiling()) if is_compiling is not None else False


if HAVE_CUSTOM_OPS:
    _forward_op, _backward_op = _register()

    def forward(*inputs):
        """lfce::forward while torch.compile traces (no graph break), else the autograd.Function."""
        return _forward_op(*inputs) if _compiling() else _LinearCrossEntropy.apply(*inputs)
else:
    def forward(*inputs):
        """lfce::forward through torch.autograd.Function."""
        return _LinearCrossEntropy.apply(*inputs)

    _backward_op = _backward_impl
