"""Hugging Face transformers: causal language models whose training loss is computed by lfce.

    import lfce.transformers
    model = AutoModelForCausalLM.from_pretrained(...)
    lfce.transformers.apply_lfce(model)       # any class in lfce.transformers.supported()
    out = model(input_ids, labels=labels)     # out.loss from lfce; out.logits is None

In training mode (``model.train()``) a call with ``labels`` (or ``shift_labels``) runs the model's
own forward without its loss: its ``lm_head`` (the same module, parameters and hooks) computes
the loss with ``lfce.linear_cross_entropy`` from the hidden states it is given, in place of the
[tokens, vocab] logits, which are never materialised (``logits`` in the output is None). The loss
is the one the model's own loss function computes: labels shifted by one position (token i
predicts label i + 1), -100 ignored, the mean over the labels that count, or the sum divided by
``num_items_in_batch`` when the trainer passes it (gradient accumulation); plus the router's
auxiliary loss (``router_aux_loss_coef * aux_loss``) of a mixture-of-experts model asked for its
router logits. In eval mode, or without labels, the model's own forward runs unchanged.

Which models: no model is named here. ``apply_lfce`` reads the model class's source (``forward``
and ``__init__``, with ``ast``) and serves it when the head is a ``torch.nn.Linear`` assigned to
``self.lm_head``, called once in ``forward``, followed only by transforms lfce computes (a tanh
softcap, ``c * tanh(logits / c)``: lfce's ``softcap``; a division by s: ``temperature=s``; a
multiplication by s: ``temperature=1/s``; a scale before the softcap, ``c * tanh((logits / T) / c)``:
``softcap=T*c, temperature=T``, the same function; an fp32 upcast), then by the model's own causal-LM loss
function (``self.loss_function``, transformers' ``ForCausalLMLoss``), and at most by the router's
auxiliary loss. The values (the cap, the scale, the coefficient) are read from the model at each
call, so a config edited after ``apply_lfce`` is honoured. Anything else (a vocabulary sliced
after the head, a z-loss over every position, a head that is a module of several layers, a list
of heads, a loss of its own) is refused, naming the class and what was not recognised.
transformers is an optional dependency: this module imports it only in ``supported()``.
"""

from __future__ import annotations

import ast
import functools
import inspect
import textwrap
from typing import NamedTuple

import torch

from .errors import (
    ArgumentTypeError,
    InternalError,
    InvalidArgumentError,
    UnsupportedError,
    UsageError,
)
from .functional import _autocast_dtype, linear_cross_entropy, validate_options

__all__ = ["apply_lfce", "refusal", "supported"]

IGNORE_INDEX = -100  # transformers' label to ignore
# The loss types (transformers' LOSS_MAPPING keys) whose loss function is ForCausalLMLoss, the loss lfce computes.
_CAUSAL_LM_LOSS_TYPES = (None, "ForCausalLM", "ForConditionalGeneration")
_TANH = {"torch.tanh", "nn.functional.tanh", "torch.nn.functional.tanh", "F.tanh"}
_LINEAR = {"nn.Linear", "torch.nn.Linear", "Linear"}
_UPCASTS = {"float", "contiguous"}  # methods on the logits that leave lfce's fp32 loss unchanged


class _Recipe(NamedTuple):
    """What a model class's forward does from its head to its loss (expressions to evaluate on the model)."""

    softcap: ast.expr | None      # the c of c * tanh(logits / c), or None
    optional_softcap: bool        # the cap is skipped when c is None
    scale: ast.expr | None        # s of logits / s or logits * s
    divide: bool                  # logits / s (else logits * s)
    aux_coefficient: ast.expr | None  # what multiplies outputs.aux_loss
    vocab_size: ast.expr | None   # the vocab_size given to the loss function
    aliases: dict                 # local names bound to expressions of self between the head and the loss
    scale_first: bool = False     # the scale comes before the softcap: c * tanh((logits * s) / c)


class _Refused(Exception):
    """A class's forward is not one apply_lfce recognises (the message says what)."""


def _name(node):
    """'a.b.c' for a dotted name, else None."""
    if isinstance(node, ast.Name):
        return node.id
    if isinstance(node, ast.Attribute):
        inner = _name(node.value)
        return None if inner is None else f"{inner}.{node.attr}"
    return None


def _is_head_call(node):
    return isinstance(node, ast.Call) and _name(node.func) == "self.lm_head"


def _strip_upcasts(node):
    while (isinstance(node, ast.Call) and isinstance(node.func, ast.Attribute) and node.func.attr in _UPCASTS
           and not node.args and not node.keywords):
        node = node.func.value
    return node


def _is_none_test(test, value_ok):
    """``X is not None`` (X accepted by value_ok); returns X's expression (a walrus's value) or None."""
    if (isinstance(test, ast.Compare) and len(test.ops) == 1 and isinstance(test.ops[0], ast.IsNot)
            and isinstance(test.comparators[0], ast.Constant) and test.comparators[0].value is None):
        left = test.left
        if isinstance(left, ast.NamedExpr):
            return left.target.id, left.value
        if value_ok(left):
            return None, left
    return None


def _softcap_of(statements, logits):
    """c when statements are ``logits = logits / c; logits = tanh(logits); logits = logits * c``."""
    if len(statements) != 3 or not all(isinstance(s, ast.Assign) and _name(s.targets[0]) == logits
                                       for s in statements):
        return None
    first, second, third = (s.value for s in statements)
    if not (isinstance(first, ast.BinOp) and isinstance(first.op, ast.Div)
            and _name(_strip_upcasts(first.left)) == logits):
        return None
    if not (isinstance(second, ast.Call) and _name(second.func) in _TANH and _name(second.args[0]) == logits):
        return None
    if not (isinstance(third, ast.BinOp) and isinstance(third.op, ast.Mult) and _name(third.left) == logits
            and ast.dump(third.right) == ast.dump(first.right)):
        return None
    return first.right


def _source_tree(function):
    try:
        return ast.parse(textwrap.dedent(inspect.getsource(function))).body[0]
    except (OSError, TypeError) as error:
        raise _Refused(f"the source of its {function.__name__} cannot be read ({error})") from None


def _check_head_is_linear(cls):
    """The first __init__ in cls's method order that assigns self.lm_head assigns it a torch.nn.Linear."""
    for klass in cls.__mro__:
        if not inspect.isfunction(vars(klass).get("__init__")) or klass.__module__.startswith("torch."):
            continue
        for node in ast.walk(_source_tree(klass.__init__)):
            if isinstance(node, ast.Assign) and any(_name(t) == "self.lm_head" for t in node.targets):
                if isinstance(node.value, ast.Call) and _name(node.value.func) in _LINEAR:
                    return
                raise _Refused(f"its lm_head is `{ast.unparse(node.value)}`, not a torch.nn.Linear (lfce fuses a "
                               "single linear layer with the loss)")
    raise _Refused("its __init__ assigns no torch.nn.Linear to self.lm_head")


def _recognise(cls):
    """The _Recipe of cls's forward; raises _Refused naming what is not recognised."""
    function = _source_tree(cls.forward)
    calls = [node for node in ast.walk(function) if _is_head_call(node)]
    if len(calls) != 1:
        raise _Refused(f"its forward calls self.lm_head {len(calls)} times, not once (or names its output layer "
                       "otherwise)")
    body = function.body
    start = next(i for i, s in enumerate(body) if any(_is_head_call(n) for n in ast.walk(s)))
    head = body[start]
    if not (isinstance(head, ast.Assign) and len(head.targets) == 1 and isinstance(head.targets[0], ast.Name)):
        raise _Refused(f"its head call is not a plain assignment: {ast.unparse(head)}")
    logits = head.targets[0].id
    value, scale, divide = _strip_upcasts(head.value), None, False
    if isinstance(value, ast.BinOp) and isinstance(value.op, ast.Mult) and _is_head_call(_strip_upcasts(value.left)):
        value, scale = _strip_upcasts(value.left), value.right
    if not _is_head_call(value) or len(value.args) != 1 or value.keywords:
        raise _Refused(f"its head call is not recognised: {ast.unparse(head)}")
    softcap, optional, aliases, scale_first = None, False, {}, False
    position = start + 1
    while position < len(body):
        statement = body[position]
        text = ast.unparse(statement)
        position += 1
        if text == "loss = None":
            break
        cap = _softcap_of(body[position - 1:position + 2], logits) if softcap is None else None
        if cap is not None:  # logits / c; tanh; * c, unconditional, before or after a scale
            softcap, scale_first = cap, scale is not None
            position += 2
            continue
        if isinstance(statement, ast.Assign) and len(statement.targets) == 1:
            target, value = _name(statement.targets[0]), statement.value
            if target == logits and _name(_strip_upcasts(value)) == logits:
                continue  # an upcast
            if (target == logits and isinstance(value, ast.BinOp) and isinstance(value.op, (ast.Div, ast.Mult))
                    and _name(_strip_upcasts(value.left)) == logits and scale is None):
                scale, divide = value.right, isinstance(value.op, ast.Div)
                continue
            if (target == logits and isinstance(value, ast.BinOp) and isinstance(value.op, ast.Mult)
                    and isinstance(value.left, ast.Call) and _name(value.left.func) in _TANH and softcap is None
                    and scale is None):
                inner = value.left.args[0]
                if (isinstance(inner, ast.BinOp) and isinstance(inner.op, ast.Div) and _name(inner.left) == logits
                        and ast.dump(inner.right) == ast.dump(value.right)):
                    softcap = value.right
                    continue
            if isinstance(statement.targets[0], ast.Name) and target != logits and logits not in _names(value):
                aliases[target] = value
                continue
        if isinstance(statement, ast.If) and not statement.orelse and softcap is None and scale is None:
            tested = _is_none_test(statement.test, lambda node: logits not in _names(node))
            cap = _softcap_of(statement.body, logits)
            if tested is not None and cap is not None and ast.dump(cap) in (
                    ast.dump(tested[1]), ast.dump(ast.Name(tested[0], ast.Load()))):
                if tested[0] is not None:
                    aliases[tested[0]] = tested[1]
                softcap, optional = cap, True
                continue
        raise _Refused(f"its forward computes, between the head and the loss, `{text}`, which lfce.transformers "
                       "does not recognise (it serves a tanh softcap, a scale and an fp32 upcast)")
    else:
        raise _Refused("its forward computes no `loss = None` / `self.loss_function(...)` after the head")
    return _recognise_loss(body[position:], logits, softcap, optional, scale, divide, aliases)._replace(
        scale_first=scale_first)


def _names(node):
    return {n.id for n in ast.walk(node) if isinstance(n, ast.Name)}


def _recognise_loss(rest, logits, softcap, optional, scale, divide, aliases):
    """The statements after `loss = None`: `if labels is not None: loss = self.loss_function(...)` and at
    most the router's auxiliary loss."""
    first = rest[0] if rest else None
    if not (isinstance(first, ast.If) and ast.unparse(first.test) == "labels is not None" and len(first.body) == 1
            and not first.orelse):
        text = ast.unparse(first) if first is not None else "nothing"
        raise _Refused(f"its loss is not `if labels is not None: loss = self.loss_function(...)` alone: `{text}`")
    call = first.body[0].value if isinstance(first.body[0], ast.Assign) else None
    if not (isinstance(call, ast.Call) and _name(call.func) == "self.loss_function"):
        raise _Refused(f"its loss is not computed by self.loss_function: `{ast.unparse(first.body[0])}`")
    arguments = dict(zip(("logits", "labels", "vocab_size"), call.args))
    arguments.update({k.arg: k.value for k in call.keywords if k.arg is not None})
    if (_name(arguments.get("logits")) != logits or _name(arguments.get("labels")) != "labels"
            or set(arguments) != {"logits", "labels", "vocab_size"}
            or not any(k.arg is None for k in call.keywords)):
        raise _Refused(f"its loss function is called with other arguments: `{ast.unparse(call)}`")
    aux = None
    for node in ast.walk(ast.Module(rest[1:], [])):
        if isinstance(node, (ast.Assign, ast.AugAssign)):
            targets = node.targets if isinstance(node, ast.Assign) else [node.target]
            if not any(_name(t) in ("loss", logits) for t in targets):
                continue
            value = node.value
            if (isinstance(node, ast.AugAssign) and isinstance(node.op, ast.Add) and aux is None
                    and isinstance(value, ast.BinOp) and isinstance(value.op, ast.Mult)
                    and _names(value.left) == {"self"} and isinstance(value.right, ast.Call)
                    and _name(value.right.func) == "aux_loss.to"):
                aux = value.left
                continue
            raise _Refused(f"its forward changes the loss or the logits after the loss function: "
                           f"`{ast.unparse(node)}`")
    return _Recipe(softcap, optional, scale, divide, aux, arguments["vocab_size"], aliases)


def _value(node, model, aliases, what):
    """_evaluate, its failures as lfce's error naming the model's class and the expression."""
    try:
        return _evaluate(node, model, aliases)
    except (_Refused, AttributeError) as error:
        raise UnsupportedError(f"lfce.transformers: this {type(model).__name__}'s {what} `{ast.unparse(node)}` "
                               f"cannot be read from the model ({error})") from None


def _evaluate(node, model, aliases):
    """The value of an expression of self (attributes, argument-less method calls, getattr with a default)."""
    if isinstance(node, ast.Constant):
        return node.value
    if isinstance(node, ast.Name):
        if node.id == "self":
            return model
        if node.id in aliases:
            return _evaluate(aliases[node.id], model, aliases)
    if isinstance(node, ast.Attribute):
        return getattr(_evaluate(node.value, model, aliases), node.attr)
    if isinstance(node, ast.Call) and not node.keywords:
        if _name(node.func) == "getattr" and len(node.args) in (2, 3):
            values = [_evaluate(a, model, aliases) for a in node.args]
            return getattr(*values)
        if isinstance(node.func, ast.Attribute) and not node.args:
            return _evaluate(node.func, model, aliases)()
    raise _Refused(f"`{ast.unparse(node)}` is not an expression of the model lfce.transformers evaluates")


@functools.cache
def _recipe(cls):
    """(recipe, None) for a class apply_lfce serves, (None, reason) for one it refuses."""
    try:
        _check_head_is_linear(cls)
        return _recognise(cls), None
    except _Refused as refused:
        return None, " ".join(str(refused).split())


def refusal(cls):
    """Why apply_lfce refuses the model class ``cls`` (a transformers PreTrainedModel class), or None if it serves it."""
    return _recipe(getattr(cls, "_lfce_base", cls))[1]


def supported():
    """The names of the causal-LM and image-text-to-text classes of the installed transformers that
    apply_lfce serves (the registry's AutoModelForCausalLM and AutoModelForImageTextToText classes it
    recognises), sorted."""
    import transformers
    from transformers.models.auto import modeling_auto

    names = set(modeling_auto.MODEL_FOR_CAUSAL_LM_MAPPING_NAMES.values())
    names |= set(modeling_auto.MODEL_FOR_IMAGE_TEXT_TO_TEXT_MAPPING_NAMES.values())
    served = []
    for name in sorted(names):
        try:
            cls = getattr(transformers, name)
        except (AttributeError, ImportError):  # a class whose optional dependencies are missing
            continue
        if refusal(cls) is None:
            served.append(name)
    return served


class _LfceHead(torch.nn.Linear):
    """The model's lm_head (same parameters, same state_dict keys, same hooks). While the patched
    forward has given it a loss to compute (``_lfce_call``), its forward computes the loss from its
    input with lfce, records it in the call, and returns in place of the logits an empty [..., 0]
    tensor that depends on the loss: whatever the model does to its logits then costs nothing, and
    the patched forward adds that tensor's sum (0) to the loss, so that the backward passes through
    the head's output as it would through the logits (hooks on it, such as FSDP2's pre-backward
    unshard, run before the loss's backward)."""

    _lfce_call = None

    def forward(self, input):
        call = self._lfce_call
        if call is None:
            return super().forward(input)
        self._lfce_call = None  # one loss a call
        hidden = input
        if hidden.dtype != self.weight.dtype and _autocast_dtype() is None:
            hidden = hidden.to(self.weight.dtype)  # as an upcast model's hidden states
        call["loss"] = loss = linear_cross_entropy(hidden, self.weight, call["targets"].to(hidden.device), self.bias,
                                                   **call["options"])
        return loss.expand(*input.shape[:-1], 0)


def apply_lfce(model, *, mode="recompute", chunk_size=None, workspace_budget=None):
    """Make ``model`` compute its training loss through lfce; returns the model (patched in place).

    model: a transformers model of a class in ``supported()`` (or a subclass whose forward is recognised).
    mode, chunk_size, workspace_budget: as for lfce.linear_cross_entropy.

    The patch is the model's class: the instance's class becomes a subclass of its own (same name
    and module) whose forward computes the training loss with lfce, so it survives copy.copy,
    copy.deepcopy, pickle and torch.save (a copy computes with its own head and its own training
    flag). Applying it again replaces the options with the new ones.

    Raises NotImplementedError (lfce.UnsupportedError) for a transformers model that apply_lfce does
    not serve, naming its class and the reason; ValueError for an object that is not a transformers
    causal language model.
    """
    validate_options(IGNORE_INDEX, "mean", mode, chunk_size, workspace_budget)
    name = type(model).__name__
    if not isinstance(model, torch.nn.Module):
        if name.endswith(("ForCausalLM", "ForConditionalGeneration", "LMHeadModel")):
            raise ArgumentTypeError(f"lfce.transformers.apply_lfce: {name} is named like a transformers model but "
                                    "is not one (a torch.nn.Module with get_output_embeddings, as transformers' "
                                    "PreTrainedModel); pass the model transformers built")
        raise InvalidArgumentError(f"lfce.transformers.apply_lfce needs a transformers causal language model, got {name}")
    if not callable(getattr(model, "get_output_embeddings", None)) or not hasattr(model, "config"):
        raise InvalidArgumentError("lfce.transformers.apply_lfce needs a transformers causal language model (a "
                                   f"PreTrainedModel with get_output_embeddings), got {name}")
    base = getattr(type(model), "_lfce_base", type(model))
    recipe, reason = _recipe(base)
    if reason is not None:
        raise UnsupportedError(f"lfce.transformers.apply_lfce: {name} is not served: {reason}. "
                               "lfce.transformers.supported() lists the classes it serves")
    loss_type = getattr(model, "loss_type", None)
    if loss_type not in _CAUSAL_LM_LOSS_TYPES or "_loss_function" in vars(model):
        own = "a loss_function set on the model" if "_loss_function" in vars(model) else f"loss_type={loss_type!r}"
        raise UnsupportedError(f"lfce.transformers.apply_lfce: this {name} computes its loss with {own}, not "
                               "transformers' causal-LM loss (ForCausalLMLoss), which is the loss lfce computes")
    head = model.get_output_embeddings()
    if head is not getattr(model, "lm_head", None) or not isinstance(head, torch.nn.Linear):
        raise InvalidArgumentError(f"lfce.transformers.apply_lfce needs the lm_head of this {name} to be a "
                                   f"torch.nn.Linear and its output embeddings, got {type(head).__name__}")
    if type(head) is torch.nn.Linear:
        head.__class__ = _LfceHead
    elif not isinstance(head, _LfceHead):
        raise InvalidArgumentError("lfce.transformers.apply_lfce needs the model's lm_head to be a torch.nn.Linear, "
                                   f"got the subclass {type(head).__name__} (its forward may differ from a Linear's)")
    vocab = _value(recipe.vocab_size, model, recipe.aliases, "vocabulary size")
    if isinstance(vocab, int) and vocab != head.out_features:
        raise UnsupportedError(f"lfce.transformers.apply_lfce: this {name}'s lm_head has {head.out_features} "
                               f"outputs but its loss takes a vocabulary of {vocab} (a padded or resized head); "
                               "resize the head and the config's vocab_size together (resize_token_embeddings)")
    if "forward" in vars(model):
        # An instance attribute (accelerate's prepare wraps forward so) would hide the class's.
        raise InvalidArgumentError(f"lfce.transformers.apply_lfce: this {name} has its own "
                                   "forward attribute (a wrapper set on the instance, as accelerate's prepare or "
                                   "an earlier patch sets), which would hide lfce's; call apply_lfce on the model "
                                   "before wrapping it (before accelerator.prepare or the Trainer)")
    model._lfce_options = {"mode": mode, "chunk_size": chunk_size, "workspace_budget": workspace_budget}
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


def _number(value, what, model):
    if isinstance(value, torch.Tensor) and value.numel() == 1:
        value = value.item()
    if not isinstance(value, (int, float)) or isinstance(value, bool):
        raise UnsupportedError(f"lfce.transformers: this {type(model).__name__}'s {what} is {value!r}, not a number")
    return float(value)


def _loss_options(model, recipe):
    """lfce's softcap and temperature for the model's transforms of its logits, read from it now."""
    options = {}
    if recipe.softcap is not None:
        cap = _value(recipe.softcap, model, recipe.aliases, "logit softcap")
        if cap is not None or not recipe.optional_softcap:
            options["softcap"] = _number(cap, f"logit softcap `{ast.unparse(recipe.softcap)}`", model)
    if recipe.scale is not None:
        scale = _number(_value(recipe.scale, model, recipe.aliases, "logit scale"),
                        f"logit scale `{ast.unparse(recipe.scale)}`", model)
        temperature = scale if recipe.divide else 1.0 / scale
        if recipe.scale_first and "softcap" in options:
            # c * tanh((z / T) / c) = (T c) * tanh(z / (T c)) / T: lfce caps first, then divides by T.
            options["softcap"] *= temperature
        if temperature != 1.0:
            options["temperature"] = temperature
    return options


def _lfce_forward(class_forward):
    """The model class's forward, with the training loss from lfce."""
    signature = inspect.signature(class_forward)
    var_keyword = next((p.name for p in signature.parameters.values() if p.kind is p.VAR_KEYWORD), None)
    explicit_return_dict = "return_dict" in signature.parameters
    pops_return_dict = hasattr(class_forward, "__wrapped__")  # transformers' can_return_tuple takes it

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
        recipe = _recipe(type(self)._lfce_base)[0]
        num_items_in_batch = extra.pop("num_items_in_batch", None)
        extra.pop("shift_labels", None)
        if "labels" in arguments:
            arguments["labels"] = None
        return_dict = arguments.get("return_dict") if explicit_return_dict else extra.get("return_dict")
        if return_dict is None:
            return_dict = getattr(self.config, "return_dict", True)
        if explicit_return_dict:
            arguments["return_dict"] = True
        elif pops_return_dict and var_keyword:
            extra["return_dict"] = True
        # labels are shifted in place by the kernels (shift=True: no shifted copy); shift_labels,
        # already shifted by the caller, are taken as they are.
        shift = shift_labels is None
        call = {"targets": labels if shift else shift_labels, "options": {
            "ignore_index": IGNORE_INDEX, "reduction": "mean" if num_items_in_batch is None else "sum",
            "shift": shift, **self._lfce_options, **_loss_options(self, recipe)}}
        head._lfce_call = call
        try:
            outputs = original(*bound.args[1:], **bound.kwargs)
        finally:
            head._lfce_call = None
        if "loss" not in call:
            raise InternalError(f"lfce.transformers: the forward of this {type(self).__name__} did not call its "
                                "lm_head")
        as_tuple = isinstance(outputs, tuple)
        logits = outputs[0] if as_tuple else outputs.logits
        loss = call["loss"] + logits.sum()  # the head's output (empty: adds 0) on the loss's backward path
        if num_items_in_batch is not None:
            if isinstance(num_items_in_batch, torch.Tensor):
                num_items_in_batch = num_items_in_batch.to(loss.device)
            loss = loss / num_items_in_batch
        aux_loss = None if as_tuple else getattr(outputs, "aux_loss", None)
        if recipe.aux_coefficient is not None and aux_loss is not None:
            coefficient = _value(recipe.aux_coefficient, self, recipe.aliases, "router auxiliary loss coefficient")
            loss = loss + coefficient * aux_loss.to(loss.device)
        if as_tuple:
            return (loss,) + tuple(outputs[1:])
        fields = {key: value for key, value in outputs.items() if key not in ("loss", "logits")}
        outputs = type(outputs)(loss=loss, logits=None, **fields)
        return outputs if return_dict else outputs.to_tuple()

    return forward
