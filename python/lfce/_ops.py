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

The implementations' signatures are the schemas: ``ForwardInputs`` / ``BackwardInputs`` name their
arguments, ``forward_inputs`` flattens a ``LossOptions`` into lfce::forward's (the one place that
does), and the autograd rule passes lfce::forward's options on to lfce::backward by name. The
ctypes calls (problems, workspaces, launches) are ``_bridge.py``'s; CPU tensors take ``_cpu.py``.
"""

import collections
import inspect
from collections.abc import Mapping
from typing import Any, Optional

import torch
from torch import Tensor

from . import _bridge, _cpu, _lib
from ._contract import check_class_weight as _check_class_weight
from ._contract import check_lse as _check_lse
from ._contract import eager as _eager
from ._contract import lse_size as _lse_size
from .errors import InvalidArgumentError
from .options import OPTION_NAMES, LossOptions

__all__ = ["HAVE_CUSTOM_OPS", "ForwardInputs", "forward", "forward_inputs"]

HAVE_CUSTOM_OPS = all(hasattr(torch.library, name) for name in ("custom_op", "register_fake", "register_autograd"))

DTYPES = _bridge.DTYPES  # the input dtypes the operators take on CUDA tensors (lfce_dtype codes)
INDEX_DTYPES = _bridge.INDEX_DTYPES
_F32 = torch.float32
# The operators' schemas are inferred from these annotations (at run time: no string annotations).
OptionalTensor = Optional[Tensor]
OptionalInt = Optional[int]
OptionalFloat = Optional[float]

_statistics_dtype = _bridge.statistics_dtype
_accumulated = _bridge.accumulated


# --- the operators' contract: checks of a direct call, and the shapes of the outputs ---------------

def _or_empty(grads, like):
    """The operators' form of optional gradients: an empty [0] tensor for None."""
    return tuple(like.new_empty(0) if g is None else g for g in grads)


# The operator arguments that are LossOptions fields, under the same names; the extra outputs travel
# as lfce_problem.outputs flags, the causal shift as sequence_length.
_OUTPUT_FIELDS = {"return_entropy": _lib.OUTPUT_ENTROPY, "return_logprob": _lib.OUTPUT_LOGPROB,
                  "return_predicted": _lib.OUTPUT_PREDICTED}


def _options_of(arguments: Mapping[str, Any]) -> LossOptions:
    """The LossOptions an operator call carries (checked again: a direct call is checked too), from
    its arguments by name: every argument named as a LossOptions field, and the output flags."""
    named: dict[str, Any] = {name: arguments[name] for name in OPTION_NAMES if name in arguments}
    flags = arguments.get("outputs", 0)
    named.update((name, bool(flags & flag)) for name, flag in _OUTPUT_FIELDS.items())
    return LossOptions(**named)


# --- the real implementations (liblfce.so through _bridge) -----------------------------------------

def _forward_impl(hidden: Tensor, weight: Tensor, bias: OptionalTensor, targets: Tensor, class_weight: OptionalTensor,
                  weight_grad_accumulator: OptionalTensor, bias_grad_accumulator: OptionalTensor, ignore_index: int,
                  reduction: str, mode: str, chunk_size: OptionalInt, workspace_budget: OptionalInt,
                  softcap: OptionalFloat, temperature: float, z_loss_scale: float, label_smoothing: float,
                  token_scaling: bool, need_hidden: bool, need_weight: bool, need_bias: bool, outputs: int = 0,
                  sequence_length: int = 0) -> tuple[Tensor, Tensor, Tensor, Tensor, Tensor, Tensor, Tensor]:
    options = _options_of(locals())  # first: locals() holds the arguments only
    eager = _eager(mode, reduction, outputs)
    if eager and (weight_grad_accumulator is not None or bias_grad_accumulator is not None):
        # The accumulators are the backward's; eager mode has no backward kernels to add in (as the library).
        raise InvalidArgumentError("lfce::forward: gradient accumulators need mode 'recompute', got mode 'eager'")
    _check_class_weight(class_weight)
    out = _bridge.forward(hidden, weight, bias, targets, options, class_weight=class_weight, eager=eager,
                          wanted=(need_hidden, need_weight, need_bias), sequence_length=sequence_length)
    grads = _or_empty((out.grad_hidden, out.grad_weight, out.grad_bias), hidden)
    return (out.loss, out.lse, out.valid_count) + grads + (out.predicted,)


def _backward_impl(hidden: Tensor, weight: Tensor, bias: OptionalTensor, targets: Tensor, class_weight: OptionalTensor,
                   lse: Tensor, valid_count: Tensor, grad_loss: Tensor, weight_grad_accumulator: OptionalTensor,
                   bias_grad_accumulator: OptionalTensor, ignore_index: int, reduction: str,
                   chunk_size: OptionalInt, workspace_budget: OptionalInt, softcap: OptionalFloat,
                   temperature: float, z_loss_scale: float, label_smoothing: float, token_scaling: bool,
                   need_hidden: bool, need_weight: bool, need_bias: bool, grad_lse: OptionalTensor = None,
                   outputs: int = 0, sequence_length: int = 0) -> tuple[Tensor, Tensor, Tensor]:
    options = _options_of(locals())  # first: locals() holds the arguments only
    _check_class_weight(class_weight, valid_count)
    _check_lse(hidden, lse, grad_lse, token_scaling, outputs)
    grads = _bridge.backward(hidden, weight, bias, targets, options, lse=lse, valid_count=valid_count,
                             grad_loss=grad_loss, wanted=(need_hidden, need_weight, need_bias),
                             class_weight=class_weight, grad_lse=grad_lse,
                             weight_grad_accumulator=weight_grad_accumulator,
                             bias_grad_accumulator=bias_grad_accumulator, sequence_length=sequence_length)
    return _or_empty(grads, hidden)


def _arguments_of(function):
    """A named tuple of ``function``'s parameters (its defaults too): an operator's arguments by name."""
    parameters = inspect.signature(function).parameters.values()
    defaults = [p.default for p in parameters if p.default is not inspect.Parameter.empty]
    return collections.namedtuple(function.__name__.strip("_").replace("_impl", "").title() + "Inputs",
                                  [p.name for p in parameters], defaults=defaults)


# lfce::forward's and lfce::backward's arguments, named as their schemas (the implementations' signatures).
ForwardInputs = _arguments_of(_forward_impl)
BackwardInputs = _arguments_of(_backward_impl)
_FORWARD_OPTIONS = tuple(name for name in OPTION_NAMES if name in ForwardInputs._fields)


def forward_inputs(hidden: Tensor, weight: Tensor, bias: OptionalTensor, targets: Tensor, options: LossOptions, *,
                   class_weight: OptionalTensor = None, weight_grad_accumulator: OptionalTensor = None,
                   bias_grad_accumulator: OptionalTensor = None,
                   wanted: tuple[bool, bool, bool] = _bridge.NO_GRADIENTS, sequence_length: int = 0) -> Any:
    """lfce::forward's arguments (a ForwardInputs) for ``options``: the one place a LossOptions is
    flattened to the operator's schema. Every option argument of the schema takes the field of the
    same name; the extra outputs become the ``outputs`` flags. wanted: (need_hidden, need_weight,
    need_bias); sequence_length: T > 0 for a causal shift."""
    named = {name: getattr(options, name) for name in _FORWARD_OPTIONS}
    return ForwardInputs(hidden=hidden, weight=weight, bias=bias, targets=targets, class_weight=class_weight,
                         weight_grad_accumulator=weight_grad_accumulator, bias_grad_accumulator=bias_grad_accumulator,
                         need_hidden=wanted[0], need_weight=wanted[1], need_bias=wanted[2], outputs=options.outputs,
                         sequence_length=sequence_length, **named)


def _backward_inputs(forward, **given):
    """lfce::backward's arguments (a BackwardInputs): those ``given``, the rest from lfce::forward's
    arguments ``forward`` by name (the options, the accumulators, outputs, sequence_length)."""
    shared = {name: getattr(forward, name) for name in BackwardInputs._fields
              if name in ForwardInputs._fields and name not in given}
    return BackwardInputs(**shared, **given)


# --- fake implementations: the exact shapes and dtypes, nothing run ---------------------------

def _empty_unless(wanted, like):
    return like.new_empty(like.shape) if wanted else like.new_empty(0)


def _predicted_size(n, outputs):
    return n if outputs & _lib.OUTPUT_PREDICTED else 0


def _forward_fake(*args, **kwargs):
    a = ForwardInputs(*args, **kwargs)
    hidden, bias = a.hidden, a.bias
    n = hidden.shape[0]
    eager = _eager(a.mode, a.reduction, a.outputs)
    statistics = _statistics_dtype(hidden)
    loss = hidden.new_empty((n,) if a.reduction == "none" else (), dtype=statistics)
    grad_bias = _empty_unless(eager and a.need_bias, bias) if bias is not None else hidden.new_empty(0)
    valid_count = hidden.new_empty(1 if a.class_weight is None else 3, dtype=statistics)
    return (loss, hidden.new_empty(_lse_size(n, a.token_scaling, a.outputs), dtype=statistics), valid_count,
            _empty_unless(eager and a.need_hidden, hidden), _empty_unless(eager and a.need_weight, a.weight), grad_bias,
            hidden.new_empty(_predicted_size(n, a.outputs), dtype=torch.int64))


def _backward_fake(*args, **kwargs):
    a = BackwardInputs(*args, **kwargs)
    # A gradient added into its accumulator is returned as [0], as one not needed.
    need_weight = a.need_weight and a.weight_grad_accumulator is None
    need_bias = a.need_bias and a.bias_grad_accumulator is None
    grad_bias = _empty_unless(need_bias, a.bias) if a.bias is not None else a.hidden.new_empty(0)
    return _empty_unless(a.need_hidden, a.hidden), _empty_unless(need_weight, a.weight), grad_bias


# --- autograd ---------------------------------------------------------------------------------

_TENSOR_INPUTS = ("hidden", "weight", "bias", "targets", "class_weight")


def _setup_context(ctx, inputs, output):
    args = ForwardInputs(*inputs)  # a direct call may leave the defaults out
    _, lse, valid_count, grad_hidden, grad_weight, grad_bias, _ = output
    ctx.eager = _eager(args.mode, args.reduction, args.outputs)
    ctx.has_bias = args.bias is not None
    # An output that no gradient reaches gets None, not zeros: no grad_lse for a loss alone (and
    # none with fp16, which the library refuses), no loss gradient to run for an entropy alone.
    ctx.set_materialize_grads(False)
    # The options and the accumulators are kept on ctx; the accumulators are not saved:
    # save_for_backward's version check would fail a second forward into the same buffer before
    # this backward (and any in-place write to a view of its storage, such as Megatron's flat
    # gradient buffer). Under torch.compile AOTAutograd saves them with the check.
    ctx.inputs = args._replace(**dict.fromkeys(_TENSOR_INPUTS))
    if ctx.eager:
        # Only the gradients of inputs that required one at forward time were computed.
        ctx.computed = (args.need_hidden, args.need_weight, args.need_bias)
        ctx.save_for_backward(grad_hidden, grad_weight, grad_bias)
    else:
        ctx.save_for_backward(*(getattr(args, name) for name in _TENSOR_INPUTS), lse, valid_count)


def _backward_rule(ctx, grad_loss, grad_lse, *unused):
    """Gradients of lfce::forward's inputs from the upstream gradients of the loss and of lse
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
        # multiplied by it in fp32 and rounded once to its dtype (_bridge.scaled). Outside
        # torch.compile lfce's own kernel does it in place in the held gradients, which become the
        # returned ones (PyTorch's for a 16-bit tensor and an fp32 0-dim tensor is unvectorised: 2.45
        # of eager's 42.7 ms at llama3-8b, docs/measurements.md#eager-scaling); so a second backward
        # through the same forward (retain_graph) is refused. torch.compile fuses scaled_reference's
        # out-of-place product into one kernel.
        held = tuple(g if need and computed else None
                     for g, need, computed in zip(ctx.saved_tensors, wanted, ctx.computed))
        if _bridge.compiling() or _tracing(*ctx.saved_tensors):
            grads = tuple(None if g is None else _bridge.scaled_reference(g, grad_loss) for g in held)
        else:
            grads = _bridge.scale_held_gradients(ctx, held, grad_loss)
    else:
        hidden, weight, bias, targets, class_weight, lse, valid_count = ctx.saved_tensors
        statistics = _statistics_dtype(hidden)
        if grad_loss is None:  # only lse's rows get a gradient (NULL would mean 1)
            grad_loss = hidden.new_zeros(hidden.shape[0] if ctx.inputs.reduction == "none" else 1, dtype=statistics)
        grad_loss = grad_loss.to(statistics).reshape(-1)  # [1] or [N]
        if grad_lse is not None:
            grad_lse = grad_lse.to(statistics).contiguous()
        backward_op = _backward_op
        if getattr(ctx, "direct", False):  # the autograd.Function: the implementation for the tensors' device
            backward_op = _cpu.backward if hidden.device.type == "cpu" else _backward_impl
        grads = backward_op(*_backward_inputs(
            ctx.inputs, hidden=hidden, weight=weight, bias=bias, targets=targets, class_weight=class_weight, lse=lse,
            valid_count=valid_count, grad_loss=grad_loss, grad_lse=grad_lse, need_hidden=need_hidden,
            need_weight=need_weight, need_bias=need_bias))
        returned = (need_hidden, need_weight and ctx.inputs.weight_grad_accumulator is None,
                    need_bias and ctx.inputs.bias_grad_accumulator is None)
        grads = tuple(g if want else None for g, want in zip(grads, returned))
    # None for every other input: targets, class_weight, the accumulators (not differentiable), the options.
    return tuple(grads) + (None,) * (len(ForwardInputs._fields) - len(grads))


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
        output = (_cpu.forward if inputs[0].device.type == "cpu" else _forward_impl)(*inputs)
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


if HAVE_CUSTOM_OPS:
    _forward_op, _backward_op = _register()

    def forward(inputs):
        """lfce::forward on ``inputs`` (a ForwardInputs, from forward_inputs): the operator while
        torch.compile traces (no graph break), else the autograd.Function."""
        return _forward_op(*inputs) if _bridge.compiling() else _LinearCrossEntropy.apply(*inputs)
else:
    def forward(inputs):
        """lfce::forward on ``inputs`` (a ForwardInputs) through torch.autograd.Function."""
        return _LinearCrossEntropy.apply(*inputs)

    _backward_op = _backward_impl

if HAVE_CUSTOM_OPS:  # the operators' CPU kernels (torch.compile, opcheck)
    torch.library.register_kernel("lfce::forward", "cpu", _cpu.forward)
    torch.library.register_kernel("lfce::backward", "cpu", _cpu.backward)
