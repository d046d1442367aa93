"""``linear_cross_entropy``: the fused loss as a differentiable PyTorch function.

The loss is ``F.cross_entropy(F.linear(hidden, weight, bias), targets)`` computed
without ever materialising the [tokens, vocab] logits. Two modes:

* ``"recompute"`` (default) keeps only the per-token log-sum-exp (4 bytes a token)
  between forward and backward; the backward recomputes the logits chunk by chunk.
* ``"eager"`` computes the gradients during the forward (upstream gradient 1) and
  keeps them until the backward, which only scales them. Faster backward, but it
  holds grad_hidden and grad_weight in between. The forward runs three GEMMs, not
  four (lfce_forward_backward: the logits once, dz formed from them once the LSE is
  known, then dz·W and dzᵀ·x), over chunks of tokens whose [chunk, V] workspace fits in
  an eighth of the free device memory (all tokens at once, usually), as exact as
  recompute mode; problems it cannot form dz for from the stored exponentials run
  the recompute schedule inside the forward instead (the library decides which:
  lfce_eager_schedule). Reduction "none" runs recompute mode: a per-token upstream
  gradient cannot scale a grad_weight summed over the tokens.

The options can be given as keyword arguments or as one ``lfce.LossOptions`` (``options=``),
checked once when it is made; the keyword arguments build one.

In both modes only the gradients autograd can ask for are computed: a frozen weight
(``requires_grad=False``: a frozen LM head, LoRA) gets no [V, H] grad_weight, a frozen
hidden no grad_hidden; their kernels never run. In recompute mode that is decided at
backward time (``ctx.needs_input_grad``), in eager mode at forward time (the inputs'
``requires_grad``).

On CUDA tensors every call only enqueues work on the current CUDA stream: nothing here waits for
the GPU or reads a device value on the host.

The work is done by the operators ``torch.ops.lfce.forward`` / ``lfce.backward`` (``_ops.py``), so
``torch.compile(fullgraph=True)`` traces this function without a graph break. The loss is fp32
whatever the input dtype (fp64 for fp64 CPU inputs); the gradients are in the inputs' dtypes. Under
``torch.autocast("cuda")`` hidden, weight and bias are cast to the autocast dtype first, as
``F.linear`` would cast them, so fp32 parameters get fp32 gradients.

``weight_grad_accumulator`` / ``bias_grad_accumulator`` (recompute mode) make the backward add
grad_weight / grad_bias in place into fp32 buffers, such as Megatron's ``main_grad``, instead of
returning them: the kernel that computes each gradient row adds it there, no [V, H] temporary.

Extra per-token outputs (``return_lse``, ``return_entropy``, ``return_logprob``,
``return_accuracy``, ``return_predicted``) come from the same passes over the vocabulary, with the
loss in a ``LossOutput``; the first three are rows of the operator's lse output and differentiable
(recompute mode: their gradients reach the backward kernels with the loss's).
"""

from __future__ import annotations

import dataclasses
import logging
import sys
from typing import NamedTuple

import torch
from torch import Tensor

from . import _ops
from ._bridge import compiling as _compiling
from .errors import ArgumentTypeError, InvalidArgumentError, UnsupportedError
from .options import EXTRA_OUTPUTS, LossOptions, Mode, Reduction
from .options import resolve as loss_options

__all__ = ["LossOutput", "check_class_weight", "linear_cross_entropy", "validate_options"]

logger = logging.getLogger("lfce")

_DTYPES = _ops.DTYPES
_INDEX_DTYPES = _ops.INDEX_DTYPES

# The device of lfce.distributed's shard kernels (its CPU tests, with a model of them, change it);
# linear_cross_entropy also takes CPU tensors (_cpu.py).
_DEVICE_TYPE = "cuda"

_logged_once: set[tuple[int, str]] = set()


def _log_once(level, message, *args):
    key = (level, message)
    if not _compiling() and key not in _logged_once:  # a traced function logs in eager runs only
        _logged_once.add(key)
        logger.log(level, message, *args)


class LossOutput(NamedTuple):
    """What ``linear_cross_entropy`` returns when an extra per-token output is asked for: each field
    not asked for is None. Per-token tensors have the shape of ``targets``."""

    loss: torch.Tensor
    z_loss: torch.Tensor | None = None     # with return_z_loss
    lse: torch.Tensor | None = None        # fp32, differentiable
    entropy: torch.Tensor | None = None    # fp32, differentiable
    logprob: torch.Tensor | None = None    # fp32, differentiable
    accuracy: torch.Tensor | None = None   # fp32, no gradient
    predicted: torch.Tensor | None = None  # int64, no gradient


# The extra outputs (options.EXTRA_OUTPUTS) are in LossOutput's order; the first three are rows of the operator's lse.
_LSE_ROWS = EXTRA_OUTPUTS[:3]


def validate_options(ignore_index: int = -100, reduction: Reduction = "mean", mode: Mode = "recompute",
                     chunk_size: int | None = None, workspace_budget: int | None = None,
                     softcap: float | None = None, temperature: float | None = None,
                     z_loss_scale: float | None = None, return_z_loss: bool = False,
                     label_smoothing: float | None = None, token_scaling: bool = False,
                     extra_outputs: dict[str, bool] | None = None) -> LossOptions:
    """The LossOptions of these values (checked there: ValueError/TypeError naming the bad value).
    extra_outputs: {name in EXTRA_OUTPUTS: value} (each must be a bool)."""
    return LossOptions(ignore_index=ignore_index, reduction=reduction, mode=mode, chunk_size=chunk_size,
                       workspace_budget=workspace_budget, softcap=softcap, temperature=temperature,
                       z_loss_scale=z_loss_scale, return_z_loss=return_z_loss, label_smoothing=label_smoothing,
                       token_scaling=token_scaling, **(extra_outputs or {}))


def check_class_weight(value: object, name: str = "class_weight") -> None:
    """What a class weight tensor can be checked for without the other inputs: None, or a 1-D
    floating torch.Tensor. Its length, its device and the dtype of the inputs are checked with them."""
    if value is None:
        return
    if not isinstance(value, torch.Tensor):
        raise ArgumentTypeError(f"{name} must be None or a torch.Tensor of shape [V], got {type(value).__name__}")
    if not value.is_floating_point():
        raise ArgumentTypeError(f"{name} must have a floating dtype, got {value.dtype}")
    if value.dim() != 1:
        raise InvalidArgumentError(f"{name} must have shape [V], got shape {tuple(value.shape)}")


_ACCUMULATOR_NAMES = ("weight_grad_accumulator", "bias_grad_accumulator")
_ACCUMULATOR_ALIGNMENT = 8  # bytes: grad_weight is added into as fp32 pairs (lfce.h)


def _check_accumulator_mode(mode, accumulators):
    """The accumulators are the backward's: refused in eager mode, which computes the gradients in
    the forward, before the upstream gradient is known (the library refuses it too). Also with
    reduction "none", which runs recompute mode: the request is eager's."""
    for name, value in zip(_ACCUMULATOR_NAMES, accumulators):
        if value is not None and mode == "eager":
            raise InvalidArgumentError(f"{name} needs mode='recompute', got mode='eager' (eager mode computes the "
                                       "gradients in the forward, before the upstream gradient is known)")


def _check_accumulators(accumulators, weight, bias):
    """Types, the bias's presence, shapes, dtype, layout and requires_grad of the accumulators."""
    checked = tuple(zip(_ACCUMULATOR_NAMES, accumulators, ("weight", "bias"), (weight, bias), ("[V, H]", "[V]")))
    for name, value, _, _, shape in checked:
        if value is not None and not isinstance(value, torch.Tensor):
            raise ArgumentTypeError(f"{name} must be None or an fp32 torch.Tensor of shape {shape}, got "
                                    f"{type(value).__name__}")
    if accumulators[1] is not None and bias is None:
        raise InvalidArgumentError("bias_grad_accumulator needs a bias: bias is None, so there is no bias gradient")
    for name, value, like_name, like, shape in checked:
        if value is None:
            continue
        if tuple(value.shape) != tuple(like.shape):
            raise InvalidArgumentError(f"{name} must have the shape of {like_name}, {shape} = {tuple(like.shape)}, got "
                                       f"shape {tuple(value.shape)}")
        if value.dtype != torch.float32:
            raise ArgumentTypeError(f"{name} must be torch.float32 (an fp32 gradient buffer such as Megatron's "
                                    f"main_grad, whatever the inputs' dtype), got {value.dtype}")
        if not value.is_contiguous():
            raise InvalidArgumentError(f"{name} must be contiguous (the backward adds into it in place: a copy would "
                                       f"lose the sum), got strides {value.stride()} for shape {tuple(value.shape)}")
        if value.requires_grad:
            raise InvalidArgumentError(f"{name} must not require grad: it is a gradient buffer the backward writes "
                                       "outside autograd (use a detached tensor or one made under torch.no_grad())")


def _check_accumulator_devices(accumulators, hidden):
    for name, value in zip(_ACCUMULATOR_NAMES, accumulators):
        if value is None:
            continue
        if value.device != hidden.device:
            raise InvalidArgumentError(f"{name} is on {value.device} but hidden is on {hidden.device}; it must be on "
                                       "hidden's device")
        # data_ptr() has no value while torch.compile traces; the library checks it again.
        if not _compiling() and value.data_ptr() % _ACCUMULATOR_ALIGNMENT:
            raise InvalidArgumentError(f"{name} must start on an {_ACCUMULATOR_ALIGNMENT}-byte boundary (the kernels "
                                       f"add fp32 pairs), got data_ptr() % {_ACCUMULATOR_ALIGNMENT} = "
                                       f"{value.data_ptr() % _ACCUMULATOR_ALIGNMENT} (storage offset "
                                       f"{value.storage_offset()})")


def _refuse_dtensor(name, value):
    """A DTensor (FSDP2's sharded parameter, a tensor-parallel shard) is refused: lfce's kernels
    compute on one device's whole tensors. Without torch.distributed.tensor imported there is none."""
    module = sys.modules.get("torch.distributed.tensor")
    dtensor = getattr(module, "DTensor", None)
    if dtensor is None or not isinstance(value, dtensor):
        return
    raise UnsupportedError(
        f"{name} is a DTensor (placements {tuple(value.placements)}, as FSDP2's fully_shard leaves a parameter "
        "outside its module's forward); lfce computes on whole local tensors. Call lfce inside the forward of the module that owns the "
        "weight, where FSDP2 has gathered it (lfce.transformers.apply_lfce does, in the lm_head's forward), or pass "
        f"{name}.full_tensor() (an all-gather); for a vocabulary-sharded weight use lfce.distributed")


def _validate_tensors(hidden, weight, targets, bias, class_weight=None, accumulators=(None, None), extra_outputs=None,
                      cpu=False):
    """Check types, shapes, dtypes, then devices; return (tokens, hidden size, vocab). cpu: CPU
    tensors are taken too (fp64 among them), as linear_cross_entropy takes them (_cpu.py).

    Devices come last so that every other mistake is reported the same way on a
    machine without a GPU.
    """
    named = [("hidden", hidden), ("weight", weight), ("targets", targets)]
    if bias is not None:
        named.append(("bias", bias))
    for name, value in named:
        if not isinstance(value, torch.Tensor):
            raise ArgumentTypeError(f"{name} must be a torch.Tensor, got {type(value).__name__}")
        _refuse_dtensor(name, value)
    check_class_weight(class_weight)

    if hidden.dim() < 1:
        raise InvalidArgumentError("hidden must have shape [..., H], got a 0-dim tensor")
    H = hidden.shape[-1]
    if H < 1:
        raise InvalidArgumentError(f"hidden must have H >= 1, got shape {tuple(hidden.shape)}")
    N = hidden.numel() // H
    if N < 1:
        raise InvalidArgumentError(f"hidden holds no tokens: shape {tuple(hidden.shape)} has N = 0 rows of H = {H}")
    if weight.dim() != 2:
        raise InvalidArgumentError(f"weight must have shape [V, H], got shape {tuple(weight.shape)}")
    V = weight.shape[0]
    if weight.shape[1] != H:
        raise InvalidArgumentError(f"weight must have shape [V, H] with H = {H} from hidden, got shape "
                                   f"{tuple(weight.shape)} (H = {weight.shape[1]})")
    if V < 1:
        raise InvalidArgumentError(f"weight must have V >= 1 rows, got shape {tuple(weight.shape)}")
    if bias is not None and tuple(bias.shape) != (V,):
        raise InvalidArgumentError(f"bias must have shape [V] = ({V},), got shape {tuple(bias.shape)}")
    if tuple(targets.shape) != tuple(hidden.shape[:-1]):
        raise InvalidArgumentError(f"targets must have shape hidden.shape[:-1] = {tuple(hidden.shape[:-1])}, got shape "
                                   f"{tuple(targets.shape)}")
    if class_weight is not None and tuple(class_weight.shape) != (V,):
        raise InvalidArgumentError(f"class_weight must have shape [V] = ({V},) with V from weight, got shape "
                                   f"{tuple(class_weight.shape)}")

    if targets.dtype not in _INDEX_DTYPES:
        raise ArgumentTypeError(f"targets must be torch.int64 or torch.int32, got {targets.dtype}")
    if hidden.dtype not in _DTYPES and not (cpu and hidden.dtype == torch.float64 and hidden.device.type == "cpu"):
        on_cpu = " (or torch.float64 on CPU tensors)" if cpu else ""
        raise ArgumentTypeError(f"hidden must be torch.bfloat16, torch.float16 or torch.float32{on_cpu}, got "
                                f"{hidden.dtype}")
    for name, value in named[1:]:
        if name != "targets" and value.dtype != hidden.dtype:
            raise ArgumentTypeError(f"{name} must have the dtype of hidden ({hidden.dtype}), got {value.dtype}")
    if class_weight is not None and hidden.dtype == torch.float16:
        # lfce keeps fp16's dz scaled for unweighted tokens (the C library refuses it too).
        raise InvalidArgumentError("class_weight is not supported with torch.float16 inputs (lfce's fp16 gradient "
                                   "scaling assumes unweighted tokens); use torch.bfloat16 or torch.float32")
    if hidden.dtype == torch.float16:
        for name in _LSE_ROWS:
            if (extra_outputs or {}).get(name):  # the C library refuses their gradient with fp16 too
                raise InvalidArgumentError(f"{name} is not supported with torch.float16 inputs (lfce has no fp16 "
                                           "gradient path for lse, entropy and logprob); use torch.bfloat16 or "
                                           "torch.float32")
    _check_accumulators(accumulators, weight, bias)

    devices = (_DEVICE_TYPE, "cpu") if cpu else (_DEVICE_TYPE,)
    for name, value in named:
        if value.device.type not in devices:
            where = "CUDA or CPU tensors" if cpu else "CUDA tensors only"
            raise InvalidArgumentError(f"lfce runs on {where}; {name} is on {value.device}")
    for name, value in named[1:]:
        if value.device != hidden.device:
            raise InvalidArgumentError(f"{name} is on {value.device} but hidden is on {hidden.device}; all tensors "
                                       "must be on one device")
    if class_weight is not None and class_weight.device != hidden.device:
        raise InvalidArgumentError(f"class_weight is on {class_weight.device} but hidden is on {hidden.device}; it "
                                   "must be on hidden's device")
    _check_accumulator_devices(accumulators, hidden)
    return N, H, V


def _fp32_class_weight(class_weight, dtype=torch.float32):
    """The class weights as the kernels read them: fp32 (``dtype``: fp64 for fp64 inputs on CPU),
    contiguous (a copy only when needed), detached (they get no gradient, as PyTorch's cross_entropy
    ``weight``)."""
    return None if class_weight is None else class_weight.detach().to(dtype).contiguous()


def _autocast_dtype(device_type="cuda"):
    """The autocast dtype of `device_type` ("cuda" or "cpu") when autocast is on there, else None."""
    if hasattr(torch, "get_autocast_dtype"):  # PyTorch 2.4+
        return torch.get_autocast_dtype(device_type) if torch.is_autocast_enabled(device_type) else None
    if device_type == "cpu":
        return torch.get_autocast_cpu_dtype() if torch.is_autocast_cpu_enabled() else None
    return torch.get_autocast_gpu_dtype() if torch.is_autocast_enabled() else None


def _autocast(tensors):
    """Cast the floating tensors to the autocast dtype of their device (CUDA, or CPU for CPU tensors), as
    autocast casts F.linear's inputs; fp64 stays fp64, as autocast leaves it.

    The casts are differentiable: the gradients come back in each tensor's own dtype.
    """
    first = tensors[0]
    device_type = "cuda" if isinstance(first, torch.Tensor) and first.is_cuda else "cpu"
    dtype = _autocast_dtype(device_type)
    if dtype is None:
        return tensors
    return tuple(t.to(dtype) if isinstance(t, torch.Tensor) and t.device.type == device_type and t.is_floating_point()
                 and t.dtype not in (dtype, torch.float64) else t for t in tensors)


def linear_cross_entropy(hidden: Tensor, weight: Tensor, targets: Tensor, bias: Tensor | None = None, *,
                         ignore_index: int = -100, reduction: Reduction = "mean", mode: Mode = "recompute",
                         chunk_size: int | None = None, workspace_budget: int | None = None,
                         softcap: float | None = None, temperature: float | None = None,
                         z_loss_scale: float | None = None, label_smoothing: float | None = None,
                         class_weight: Tensor | None = None, return_z_loss: bool = False,
                         weight_grad_accumulator: Tensor | None = None,
                         bias_grad_accumulator: Tensor | None = None, shift: bool = False,
                         token_scaling: bool = False, return_lse: bool = False, return_entropy: bool = False,
                         return_logprob: bool = False, return_accuracy: bool = False, return_predicted: bool = False,
                         options: LossOptions | None = None
                         ) -> Tensor | tuple[Tensor, Tensor] | LossOutput:
    """Cross-entropy of ``hidden @ weight.T + bias`` against ``targets``, fused.

    Same result as ``F.cross_entropy(F.linear(hidden, weight, bias).flatten(0, -2),
    targets.flatten(), weight=class_weight, ignore_index=ignore_index, reduction=reduction,
    label_smoothing=label_smoothing)`` (with the "none" loss shaped like ``targets``),
    differentiable w.r.t. hidden, weight and bias.

    Args:
        hidden: [..., H] CUDA tensor, bfloat16, float16 or float32; or a CPU tensor, float64 too
            (computed in PyTorch, chunked over the vocabulary: python/lfce/_cpu.py; the loss and
            the extra outputs are then fp64 for fp64 inputs).
        weight: [V, H], same dtype and device as hidden.
        targets: hidden.shape[:-1], int64 or int32, class indices in [0, V) or ignore_index.
        bias: optional [V], same dtype and device as hidden.
        ignore_index: targets equal to this give no loss and no gradient.
        reduction: "mean" (over non-ignored tokens; NaN if all are ignored, like PyTorch),
            "sum" or "none".
        mode: "recompute" (hold 4 bytes a token until backward) or "eager" (compute the
            gradients in the forward and hold them; "none" reduction, return_lse,
            return_entropy and return_logprob fall back to recompute, logged once at INFO).
        chunk_size: vocabulary chunk width of the backward; None derives it from the budget.
            In eager mode: tokens per chunk of its three-GEMM forward instead.
        workspace_budget: bytes for the backward's logit-gradient chunk; None means 256 MiB.
            In eager mode: bytes for one token chunk's [chunk, V] exponentials (None: all tokens
            at once when that fits in an eighth of the free device memory, else that eighth).
        softcap: logit softcap c (Gemma 2's final_logit_softcapping, e.g. 30.0): the softmax is
            taken over ``c * tanh(z / c)`` of the logits z (bias included), with the chain rule
            in the backward; None for none.
        temperature: T in [1e-6, 1e6]: the softmax is taken over the logits (capped first, with
            a softcap: Gemma 2 caps its own logits, a sampling or RL temperature divides what
            the model returns) divided by T, so the loss is ``LSE(z / T) - z_y / T``, with 1 / T
            in the backward; None or 1.0 for none.
        z_loss_scale: s in [0, 1e6]: each counted token's loss gains ``s * LSE**2`` (PaLM's
            z-loss, Liger-Kernel's lse_square_scale; LSE of the logits the softmax sees), with
            its gradient ``2 s LSE softmax``; reduced with the loss ("mean": over the counted
            tokens, also with class weights). None or 0.0 for none. (The defaults are None, not
            floats: torch.compile traces a float default as an input and then retraces to
            specialise it.)
        label_smoothing: eps in [0, 1], PyTorch's cross_entropy ``label_smoothing``: each
            counted token's cross-entropy becomes ``(1 - eps) * (LSE - z_y) + eps / V *
            sum_v (LSE - z_v)``. None or 0.0 for none.
        class_weight: None, or the per-class weights w [V] (PyTorch's cross_entropy ``weight``,
            Liger-Kernel's ce_weight): any floating dtype, on hidden's device; used as fp32 (a
            copy only when it is not fp32 and contiguous), and gets no gradient. Each counted
            token's cross-entropy is scaled by w_y (with label smoothing, the smoothing term
            is ``eps / V * sum_v w_v (LSE - z_v)``), and "mean" divides the cross-entropy by
            the sum of w_y over the counted tokens (the z-loss still by their count, as
            Liger-Kernel). Not with float16 inputs (ValueError). The values are not checked
            (that would wait for the GPU): they must be finite and >= 0; a NaN gives NaN
            losses.
        return_z_loss: also return the z-loss term alone, reduced as the loss, without a
            gradient (for logging, as Liger-Kernel's): ``(loss, z_loss)``; with token_scaling,
            each token's term times its scale, as Liger-Kernel's.
        weight_grad_accumulator: None, or an fp32 [V, H] contiguous tensor on hidden's device
            that does not require grad (Megatron's ``weight.main_grad``): the backward ADDS
            grad_weight to it in place, in fp32 whatever the inputs' dtype, and gives weight
            no gradient: ``weight.grad`` is left untouched (None stays None). No [V, H]
            gradient is allocated. It is filled exactly when autograd would have given weight
            a gradient: weight requires grad (and grad mode was on at this call); otherwise it
            is left as it is. Mode "recompute" only (ValueError with "eager"). It must start on
            8 bytes (an even storage offset). Hooks on weight's AccumulateGrad node still run,
            with no gradient (Megatron's own fused layers return a dummy gradient instead, so
            that its DDP hooks run on autograd's main thread). Under torch.compile,
            AOTAutograd saves the buffer with autograd's version check: a second compiled call
            into it (or an in-place write to any view of its storage) before this call's
            backward makes that backward raise "modified by an inplace operation"; call
            backward once per call, or put both calls' tokens in one. Outside torch.compile
            the buffer is held without that check.
        bias_grad_accumulator: likewise for grad_bias, an fp32 [V] tensor; needs a bias.
        shift: causal shift for language modelling (Cut Cross-Entropy's ``shift``, Hugging Face's
            label shift): hidden [..., T, H] and targets [..., T] as the model and the batch give
            them, position t scored against target t + 1 of its sequence (the last dimension of
            targets), the last position of each sequence against nothing (ignored: loss 0, no
            gradient, not counted by "mean"). Neither hidden nor targets is sliced or copied: the
            kernels read target t + 1 in place. The "none" loss keeps the shape of targets (0 at
            the last positions).
        token_scaling: Liger-Kernel's ``use_token_scaling``: each counted token's loss (z-loss,
            class weight and smoothing included) and its gradient are multiplied by its
            predicted probability of the target, ``p_y = exp(z_y - LSE)`` of the logits the
            softmax sees (after softcap and temperature), detached: no gradient flows through
            the scale. "mean" still divides by the count (or the sum of w_y with class weights).

        The extra per-token outputs, each asked for by a bool and computed in the loss's own passes
        (none materialises [N, V]). "The softmax" p below is that of the logits the loss's softmax
        sees, u = (softcap-capped logits) / T, with no label smoothing, class weight or token scale.
        Each comes back shaped like ``targets``; with shift=True each belongs to its position of
        hidden (the last position of a sequence is an ignored token). Not with float16 inputs for
        the three differentiable ones (ValueError: lfce has no fp16 gradient path for them).
        return_lse: each token's log-sum-exp of u (every token, ignored ones too), fp32,
            differentiable (d LSE / du = p), as Cut Cross-Entropy's LSE.
        return_entropy: each token's entropy ``-sum_v p_v log p_v`` (every token), fp32,
            differentiable (RL trainers use it as a regulariser).
        return_logprob: ``log p_y`` of each counted token's target (0 for an ignored token, with no
            gradient; NaN for a target outside [0, V)), fp32, differentiable.
        return_accuracy: Liger-Kernel's return_token_accuracy: 1.0 where the argmax of u equals the
            target, else 0.0 (0 for an ignored token); "none" returns that per token, "mean" and
            "sum" its mean over the counted tokens (NaN when none is counted). No gradient.
        return_predicted: Liger-Kernel's return_predicted_tokens: each token's argmax of u (the
            lowest index among equal maxima), -1 for an ignored token; int64, no gradient.

    Returns:
        The loss in fp32: 0-dim for mean/sum, shape hidden.shape[:-1] for none; with
        return_z_loss, ``(loss, z_loss)`` of those shapes. With any return_lse, return_entropy,
        return_logprob, return_accuracy or return_predicted: a ``LossOutput(loss, z_loss, lse,
        entropy, logprob, accuracy, predicted)`` named tuple, None in each field not asked for
        (z_loss with return_z_loss). Gradients are in the dtypes of hidden, weight and bias
        (those added into an accumulator: in it, in fp32); a gradient reaching lse, entropy or
        logprob is added to the loss's in the same backward kernels.

    Under ``torch.autocast("cuda", dtype=...)`` hidden, weight and bias are first cast to the
    autocast dtype (as for F.linear); their gradients come back in their own dtypes.

    Raises:
        TypeError / ValueError naming the bad argument; lfce.CompileError if a kernel
        fails to compile; lfce.CudaError if the driver fails.
    """
    options = loss_options(
        options, ignore_index=ignore_index, reduction=reduction, mode=mode, chunk_size=chunk_size,
        workspace_budget=workspace_budget, softcap=softcap, temperature=temperature, z_loss_scale=z_loss_scale,
        label_smoothing=label_smoothing, return_z_loss=return_z_loss, shift=shift, token_scaling=token_scaling,
        return_lse=return_lse, return_entropy=return_entropy, return_logprob=return_logprob,
        return_accuracy=return_accuracy, return_predicted=return_predicted)
    return _linear_cross_entropy(hidden, weight, targets, bias, options, class_weight,
                                 (weight_grad_accumulator, bias_grad_accumulator))


def _linear_cross_entropy(hidden, weight, targets, bias, options, class_weight, accumulators):
    """linear_cross_entropy once its options are a LossOptions."""
    extra = options.extra_outputs
    reduction, z_loss_scale = options.reduction, options.z_loss_scale
    _check_accumulator_mode(options.mode, accumulators)
    hidden, weight, bias = _autocast((hidden, weight, bias))
    N, H, _ = _validate_tensors(hidden, weight, targets, bias, class_weight, accumulators, extra, cpu=True)
    if z_loss_scale != 0.0 and hidden.dtype == torch.float16:
        raise InvalidArgumentError(f"z_loss_scale={z_loss_scale!r} is not supported with torch.float16 inputs (lfce's "
                                   "fp16 gradient scaling bounds |p - onehot| by 1, and the z-loss multiplies p by 1 "
                                   "+ 2 * z_loss_scale * LSE, which only the data bound); use torch.bfloat16 or "
                                   "torch.float32")
    class_weight = _fp32_class_weight(class_weight, _ops._statistics_dtype(hidden))
    batch_shape = hidden.shape[:-1]
    sequence_length = 0
    if options.shift:
        if targets.dim() == 0:
            raise InvalidArgumentError("shift=True needs a sequence dimension: hidden [..., T, H] and targets [..., "
                                       f"T], got hidden of shape {tuple(hidden.shape)}")
        # Position t against target t + 1 of its sequence (the kernels read it in place), the
        # sequence's last position against none.
        sequence_length = targets.shape[-1]

    hidden = hidden.reshape(N, H)
    targets = targets.reshape(N)
    if options.mode == "eager" and reduction == "none":
        _log_once(logging.INFO, "lfce: mode 'eager' needs a scalar loss; reduction 'none' uses 'recompute'")
        options = dataclasses.replace(options, mode="recompute")
    if options.mode == "eager" and any(extra[name] for name in _LSE_ROWS):
        _log_once(logging.INFO, "lfce: mode 'eager' computes the gradients before those of lse, entropy and logprob "
                                "are known; return_lse, return_entropy and return_logprob use 'recompute'")
        options = dataclasses.replace(options, mode="recompute")

    # Which gradients a backward can ask for is known here (inside the operator grad mode is
    # off); eager mode computes only those (none when grad mode is off).
    wanted = tuple(torch.is_grad_enabled() and t is not None and t.requires_grad for t in (hidden, weight, bias))
    out = _ops.forward(_ops.forward_inputs(
        hidden, weight, bias, targets, options, class_weight=class_weight, weight_grad_accumulator=accumulators[0],
        bias_grad_accumulator=accumulators[1], wanted=wanted, sequence_length=sequence_length))
    loss = out[0].reshape(batch_shape) if reduction == "none" else out[0]
    z_loss = None
    ignore_index, token_scaling = options.ignore_index, options.token_scaling
    if options.return_z_loss:
        counted = _per_position(lambda y: y != ignore_index, targets, sequence_length)
        z_loss = _z_loss(out[1], out[2], counted, z_loss_scale, reduction, token_scaling)  # (lse, count)
        z_loss = z_loss.reshape(batch_shape) if reduction == "none" else z_loss
    if not any(extra.values()):
        return (loss, z_loss) if options.return_z_loss else loss
    # (lse, valid_count, predicted) of the operator
    return LossOutput(loss, z_loss, *_extra_outputs(out[1], out[2], out[6], targets, ignore_index, sequence_length,
                                                    reduction, token_scaling, extra, batch_shape))


def _per_position(test, targets, sequence_length, *aligned):
    """test(y, *a) as a bool [N]: y each position's target and a its values of the [N] tensors
    `aligned`; with a causal shift (sequence_length > 0) y is the next position's target (a view
    of targets: no copy) and each sequence's last position, which has none, is False."""
    if not sequence_length:
        return test(targets, *aligned)
    def rows(t):
        return t.reshape(-1, sequence_length)
    hit = test(rows(targets)[:, 1:], *(rows(a)[:, :-1] for a in aligned))
    return torch.nn.functional.pad(hit, (0, 1), value=False).reshape(-1)


def _extra_outputs(lse, valid_count, predicted, targets, ignore_index, sequence_length, reduction, token_scaling,
                   extra, batch_shape):
    """(lse, entropy, logprob, accuracy, predicted), each None unless asked for, from the operator's
    lse [rows * N] (the LSEs, the scales with token scaling, the entropies, the logprobs: views,
    so that their gradients reach the operator as lse's), valid_count and predicted [N]; each
    position's target as _per_position has it."""
    n = targets.shape[0]
    entropy_row = 1 + int(token_scaling)
    logprob_row = entropy_row + int(extra["return_entropy"])
    rows = [lse.narrow(0, row * n, n).reshape(batch_shape) if extra[name] else None
            for name, row in zip(_LSE_ROWS, (0, entropy_row, logprob_row))]
    accuracy = None
    if extra["return_accuracy"]:  # Liger-Kernel's token accuracy, from the argmax ids (no kernel)
        correct = _per_position(lambda y, p: (p == y) & (y != ignore_index), targets, sequence_length,
                                predicted).to(torch.float32)
        accuracy = correct.reshape(batch_shape) if reduction == "none" else correct.sum() / valid_count.detach()[0]
    return (*rows, accuracy, predicted.reshape(batch_shape) if extra["return_predicted"] else None)


def _z_loss(lse, valid_count, counted, z_loss_scale, reduction, token_scaling):
    """s * LSE**2 of the counted tokens, reduced as the loss, from the forward's LSE (no kernel);
    detached: a gradient through it would be dropped, so it has none. "mean" divides by the count
    valid_count[0], class weights or not (they weight the cross-entropy only). With token scaling
    lse's second row holds the scales p(target): each term times its scale, as Liger-Kernel."""
    lse, valid_count = lse.detach(), valid_count.detach()
    n = counted.shape[0]
    term = z_loss_scale * lse[:n] * lse[:n]
    if token_scaling:
        term = term * lse[n:2 * n]
    term = torch.where(counted, term, torch.zeros_like(term))
    if reduction == "none":
        return term
    total = term.sum()
    return total / valid_count[0] if reduction == "mean" else total
