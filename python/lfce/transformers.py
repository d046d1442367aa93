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
import types

import torch

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

    Raises NotImplementedError for Gemma2ForCausalLM (logit softcapping) and ValueError for any
    other model, naming its class. Applying it twice changes nothing more.
    """
    validate_options(IGNORE_INDEX, "mean", mode, chunk_size, workspace_budget)
    name = _architecture(model)
    if name in _REFUSED:
        raise NotImplementedError(f"lfce.transformers.apply_lfce: {type(model).__name__}: {_REFUSED[name]}")
    if name is None:
        raise ValueError(f"lfce.transformers.apply_lfce supports {', '.join(SUPPORTED)} (and their subclasses), "
                         f"got {type(model).__name__}")
    if getattr(model, "_lfce_applied", False):
        return model
    head = model.get_output_embeddings()
    if type(head) is not torch.nn.Linear:
        raise ValueError(f"lfce.transformers.apply_lfce needs the model's lm_head to be a torch.nn.Linear, got "
                         f"{type(head).__name__}")
    head.__class__ = _LfceHead
    model._lfce_options = {"mode": mode, "chunk_size": chunk_size, "workspace_budget": workspace_budget}
    # Bound to this model, and finding everything through `self` at call time: a deep copy of the
    # model (its forward rebound to the copy) computes with the copy's own head.
    model.forward = types.MethodType(_lfce_forward(type(model).forward), model)
    model._lfce_applied = True
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
