"""Hugging Face transformers: causal language models whose training loss is computed by lfce.

    import lfce.transformers
    model = AutoModelForCausalLM.from_pretrained(...)
    lfce.transformers.apply_lfce(model)       # LlamaForCausalLM, MistralForCausalLM, Qwen2ForCausalLM
    out = model(input_ids, labels=labels)     # out.loss from lfce; out.logits is None

In training mode (``model.train()``) a call with ``labels`` (or ``shift_labels``) runs the model
up to the last hidden states, skips the output projection and computes the loss with
``lfce.linear_cross_entropy`` from the hidden states and ``lm_head.weight``: the [tokens, vocab]
logits are never materialised, and ``logits`` in the output is None. The loss is the one the
model's own loss function computes: labels shifted by one position (token i predicts label
i + 1), -100 ignored, the mean over the labels that count, or the sum divided by
``num_items_in_batch`` when the trainer passes it (gradient accumulation). In eval mode, or
without labels, the model's own forward runs unchanged (logits computed).

Gemma 2 caps its final logits (``final_logit_softcapping``). ``lfce.linear_cross_entropy`` has
that cap (``softcap``), but a patched Gemma 2's gradients did not yet match the model's own on an
H200 (one layer-norm weight 1.2% off; the loss matched): ``apply_lfce`` refuses it until they do. transformers is an optional
dependency: this module does not import it (it works on the model it is given).
"""

import functools
import inspect

import torch

from .errors import (
    ArgumentTypeError,
    InvalidArgumentError,
    UnsupportedError,
    UsageError,
)
from .functional import _autocast_dtype, linear_cross_entropy, validate_options

__all__ = ["SUPPORTED", "apply_lfce"]

SUPPORTED = ("LlamaForCausalLM", "MistralForCausalLM", "Qwen2ForCausalLM")
_REFUSED = {
    "Gemma2ForCausalLM": "Gemma 2 caps its final logits with tanh (final_logit_softcapping); lfce's softcap "
                         "computes that cap, but the patched model's gradients are not yet verified to match",
}
IGNORE_INDEX = -100  # transformers' label to ignore


class _LfceHead(torch.nn.Linear):
    """The model's lm_head (same parameters, same state_dict keys), which hands back its input
    unchanged while the patched forward asks for the last hidden states."""

    _lfce_pass_hidden = False

    def forward(self, input):
        return input if self._lfce_pass_hidden else super().forward(input)


def _architecture(model):
    for cls in type(model).__mro__:
        if cls.__name__ in SUPPORTED or cls.__name__ in _REFUSED:
            return cls.__name__
    return None


def apply_lfce(model, *, mode="recompute", chunk_size=None, workspace_budget=None):
    """Make ``model`` compute its training loss through lfce; returns the model (patched in place).

    model: a LlamaForCausalLM, MistralForCausalLM or Qwen2ForCausalLM (or a subclass).
    mode, chunk_size, workspace_budget: as for lfce.linear_cross_entropy.

    The patch is the model's class: the instance's class becomes a subclass of its own (same name
    and module) whose forward computes the training loss with lfce, so it survives copy.copy,
    copy.deepcopy, pickle and torch.save (a copy computes with its own head and its own training
    flag). Applying it again replaces the options with the new ones.

    Raises NotImplementedError for Gemma2ForCausalLM (logit softcapping) and ValueError for any
    other model, naming its class.
    """
    validate_options(IGNORE_INDEX, "mean", mode, chunk_size, workspace_budget)
    name = _architecture(model)
    if name in _REFUSED:
        raise UnsupportedError(f"lfce.transformers.apply_lfce: {type(model).__name__}: {_REFUSED[name]}")
    if name is None:
        raise InvalidArgumentError(f"lfce.transformers.apply_lfce supports {', '.join(SUPPORTED)} (and their "
                                   f"subclasses), got {type(model).__name__}")
    if not isinstance(model, torch.nn.Module) or not callable(getattr(model, "get_output_embeddings", None)):
        raise ArgumentTypeError(f"lfce.transformers.apply_lfce: {type(model).__name__} is named like a transformers "
                                "model but is not one (a torch.nn.Module with get_output_embeddings, as transformers' "
                                "PreTrainedModel); pass the model transformers built")
    head = model.get_output_embeddings()
    if not isinstance(head, torch.nn.Linear):  # a model lfce does not serve, not a wrong type of argument
        raise InvalidArgumentError("lfce.transformers.apply_lfce needs the model's lm_head to be a torch.nn.Linear, "
                                   f"got {type(head).__name__}")
    if type(head) is torch.nn.Linear:
        head.__class__ = _LfceHead
    elif not isinstance(head, _LfceHead):
        raise InvalidArgumentError("lfce.transformers.apply_lfce needs the model's lm_head to be a torch.nn.Linear, "
                                   f"got the subclass {type(head).__name__} (its forward may differ from a Linear's)")
    model._lfce_options = {"mode": mode, "chunk_size": chunk_size, "workspace_budget": workspace_budget}
    if "forward" in vars(model):
        # An instance attribute (accelerate's prepare wraps forward so) would hide the class's.
        raise InvalidArgumentError(f"lfce.transformers.apply_lfce: this {type(model).__name__} has its own "
                                   "forward attribute (a wrapper set on the instance, as accelerate's prepare or "
                                   "an earlier patch sets), which would hide lfce's; call apply_lfce on the model "
                                   "before wrapping it (before accelerator.prepare or the Trainer)")
    if not getattr(type(model), "_lfce_patched", False):
        model.__class__ = _patched_class(type(model))
    return model


_PATCHED_CLASSES = {}  # a model class -> its patched subclass


def _patched_class(base):
    """The subclass of ``base`` whose forward takes the training loss from lfce (one per class)."""
    patched = _PATCHED_CLASSES.get(base)
    if patched is None:
        patched = type(base.__name__, (base,), {
            "forward": _lfce_forward(base.forward), "__reduce_ex__": _reduce_ex, "_lfce_patched": True,
            "_lfce_base": base, "__module__": base.__module__, "__qualname__": base.__qualname__,
            "__doc__": base.__doc__})
        _PATCHED_CLASSES[base] = patched
    return patched


def _reduce_ex(self, protocol):
    """Pickle (and copy) a patched model as its base class's object plus the patch: the patched class
    itself is made at run time and cannot be found by name. A class made from the patched one (as
    FSDP2's fully_shard makes one) is its own: it is reduced as Python would, never as the patched
    class, which would drop it."""
    reduced = object.__reduce_ex__(self, max(protocol, 2))
    if type(self) is not _PATCHED_CLASSES.get(type(self)._lfce_base):
        return reduced
    return (_restore, (type(self)._lfce_base,)) + tuple(reduced[2:])


def _restore(base):
    """A new, empty object of ``base``'s patched class (its state is set afterwards, by pickle or copy)."""
    model = base.__new__(base)
    model.__class__ = _patched_class(base)
    return model


def _lfce_forward(class_forward):
    """The model class's forward, with the training loss from lfce."""
    signature = inspect.signature(class_forward)
    var_keyword = next((p.name for p in signature.parameters.values() if p.kind is p.VAR_KEYWORD), None)

    @functools.wraps(class_forward)
    def forward(self, *args, **kwargs):
        original = class_forward.__get__(self)
        head = self.get_output_embeddings()
        bound = signature.bind(self, *args, **kwargs)
        arguments = bound.arguments
        extra = arguments.get(var_keyword, {}) if var_keyword else {}
        labels = arguments.get("labels")
        shift_labels = extra.get("shift_labels")
        if not self.training or (labels is None and shift_labels is None):
            return original(*args, **kwargs)
        if not isinstance(head, _LfceHead):
            raise UsageError(f"lfce.transformers: the lm_head of this {type(self).__name__} was replaced after "
                             f"apply_lfce (by resize_token_embeddings, say: it is now a {type(head).__name__}); "
                             "call lfce.transformers.apply_lfce(model) again")
        num_items_in_batch = extra.pop("num_items_in_batch", None)
        extra.pop("shift_labels", None)
        if "labels" in arguments:
            arguments["labels"] = None
        head._lfce_pass_hidden = True
        try:
            outputs = original(*bound.args[1:], **bound.kwargs)
        finally:
            head._lfce_pass_hidden = False
        as_tuple = isinstance(outputs, tuple)
        hidden = outputs[0] if as_tuple else outputs.logits  # the last hidden states, [batch, seq, H]
        if hidden.dtype != head.weight.dtype and _autocast_dtype() is None:
            hidden = hidden.to(head.weight.dtype)  # a model that upcast its "logits" to fp32
        # labels are shifted in place by the kernels (shift=True: no shifted copy); shift_labels,
        # already shifted by the caller, are taken as they are.
        shift = shift_labels is None
        targets = labels if shift else shift_labels
        reduction = "mean" if num_items_in_batch is None else "sum"
        loss = linear_cross_entropy(hidden, head.weight, targets.to(hidden.device), head.bias,
                                    ignore_index=IGNORE_INDEX, reduction=reduction, shift=shift, **self._lfce_options)
        if num_items_in_batch is not None:
            if isinstance(num_items_in_batch, torch.Tensor):
                num_items_in_batch = num_items_in_batch.to(loss.device)
            loss = loss / num_items_in_batch
        if as_tuple:
            return (loss,) + tuple(outputs[1:])
        fields = {key: value for key, value in outputs.items() if key not in ("loss", "logits")}
        return type(outputs)(loss=loss, logits=None, **fields)

    return forward
