"""lfce.LossOptions without a GPU: checked once at construction with the keyword path's messages,
canonical values, the same result through ``options=`` as through keywords (CPU tensors), a clash
of both refused, and the one flattening to the operators' schema (every option argument of the
schema carried by name, and back)."""

import dataclasses
import inspect
import re

import pytest
import torch

import lfce
from lfce import _lib, _ops, kernels
from lfce.options import OPTION_NAMES, LossOptions


def raises(exception, *fragments):
    return pytest.raises(exception, match=".*".join(re.escape(f) for f in fragments))


@pytest.mark.parametrize("changes, exception, fragments", [
    ({"softcap": -1.0}, ValueError, ("softcap must be None or a number in (0, 1e6]", "got -1.0")),
    ({"temperature": 0.0}, ValueError, ("temperature must be None or a number in [1e-6, 1e6]", "got 0.0")),
    ({"z_loss_scale": "0.1"}, TypeError, ("z_loss_scale must be None or a number", "str '0.1'")),
    ({"label_smoothing": 1.5}, ValueError, ("label_smoothing must be None or a number in [0, 1]", "got 1.5")),
    ({"reduction": "avg"}, ValueError, ("reduction must be one of 'mean', 'sum', 'none'", "got 'avg'")),
    ({"mode": "fast"}, ValueError, ("mode must be one of 'recompute', 'eager'", "got 'fast'")),
    ({"chunk_size": 0}, ValueError, ("chunk_size must be in [1, 2**63 - 1]", "got 0")),
    ({"workspace_budget": True}, TypeError, ("workspace_budget must be an int or None", "the bool True")),
    ({"ignore_index": 1.5}, TypeError, ("ignore_index must be an int", "float 1.5")),
    ({"token_scaling": 1}, TypeError, ("token_scaling must be a bool", "int 1")),
    ({"return_entropy": "yes"}, TypeError, ("return_entropy must be a bool", "str 'yes'")),
    ({"shift": None}, TypeError, ("shift must be a bool", "NoneType None")),
])
def test_a_bad_option_is_named_at_construction_as_the_keyword_path_names_it(changes, exception, fragments):
    with raises(exception, *fragments):
        LossOptions(**changes)
    x, w, y = inputs()
    with raises(exception, *fragments):
        lfce.linear_cross_entropy(x, w, y, **changes)


def test_values_are_canonical_so_equal_requests_compare_and_hash_equal():
    np = pytest.importorskip("numpy")
    given = LossOptions(ignore_index=np.int32(-1), temperature=np.float32(1.0), z_loss_scale=None,
                        label_smoothing=0, token_scaling=np.True_, chunk_size=np.int64(64))
    plain = LossOptions(ignore_index=-1, temperature=None, z_loss_scale=0.0, label_smoothing=0.0, token_scaling=True,
                        chunk_size=64)
    assert given == plain and hash(given) == hash(plain)
    assert [type(getattr(given, name)) for name in ("ignore_index", "temperature", "label_smoothing",
                                                    "token_scaling", "chunk_size")] == [int, float, float, bool, int]
    assert LossOptions() != LossOptions(temperature=0.5)


def test_options_are_frozen_and_replace_checks_again():
    options = LossOptions(reduction="sum")
    with pytest.raises(dataclasses.FrozenInstanceError):
        options.reduction = "mean"
    assert dataclasses.replace(options, softcap=30.0).softcap == 30.0
    with raises(ValueError, "softcap", "got 0.0"):
        dataclasses.replace(options, softcap=0.0)


def test_output_flags_follow_the_extra_outputs():
    assert LossOptions().outputs == 0
    assert LossOptions(return_lse=True).outputs == 0  # the LSE row is always there
    assert LossOptions(return_entropy=True, return_logprob=True).outputs == _lib.OUTPUT_ENTROPY | _lib.OUTPUT_LOGPROB
    assert LossOptions(return_accuracy=True).outputs == _lib.OUTPUT_PREDICTED  # accuracy needs the argmax ids


def inputs(n=6, h=8, v=11, dtype=torch.float32):
    g = torch.Generator().manual_seed(0)
    x = torch.randn(n, h, generator=g).to(dtype).requires_grad_()
    w = torch.randn(v, h, generator=g).to(dtype).requires_grad_()
    y = torch.randint(0, v, (n,), generator=g)
    y[::3] = -100
    return x, w, y


def loss_and_grads(options=None, **keywords):
    x, w, y = inputs()
    out = lfce.linear_cross_entropy(x, w, y, options=options, **keywords)
    loss = out[0] if isinstance(out, tuple) else out
    loss.backward()
    return out, x.grad, w.grad


@pytest.mark.parametrize("keywords", [
    {}, {"reduction": "sum", "mode": "eager"}, {"softcap": 3.0, "temperature": 0.7, "z_loss_scale": 1e-3,
                                                "return_z_loss": True},
    {"label_smoothing": 0.1, "token_scaling": True, "return_entropy": True, "return_accuracy": True}])
def test_options_give_what_the_same_keywords_give(keywords):
    by_options = loss_and_grads(LossOptions(**keywords))
    by_keywords = loss_and_grads(**keywords)
    for a, b in zip(by_options, by_keywords):
        a, b = (a, b) if isinstance(a, tuple) else ((a,), (b,))
        for u, v in zip(a, b):
            assert (u is None and v is None) or torch.equal(u, v)


def test_the_module_keeps_its_options_as_one_value():
    module = lfce.LinearCrossEntropyLoss(options=LossOptions(reduction="sum", softcap=3.0))
    assert module.options == LossOptions(reduction="sum", softcap=3.0)
    assert "reduction='sum'" in repr(module) and "softcap=3.0" in repr(module)
    x, w, y = inputs()
    assert torch.equal(module(x, w, y), lfce.linear_cross_entropy(x, w, y, reduction="sum", softcap=3.0))


@pytest.mark.parametrize("call", [
    lambda options, **kw: lfce.linear_cross_entropy(*inputs(), options=options, **kw),
    lambda options, **kw: lfce.LinearCrossEntropyLoss(options=options, **kw),
    lambda options, **kw: kernels.problem_for(1000, 64, options=options, **kw)], ids=["function", "module", "problem"])
def test_options_and_a_keyword_option_together_are_refused_naming_the_keyword(call):
    with raises(lfce.UsageError, "options=LossOptions(...) and the keyword options reduction='sum'", "or none"):
        call(LossOptions(softcap=3.0), reduction="sum")
    with raises(TypeError, "options must be None or an lfce.LossOptions, got dict"):
        call({"softcap": 3.0})


def test_problem_for_builds_the_same_problem_from_options_as_from_keywords():
    keywords = {"reduction": "sum", "mode": "eager", "chunk_size": 128, "softcap": 30.0, "temperature": 0.5,
                "z_loss_scale": 1e-4, "label_smoothing": 0.1, "token_scaling": True, "shift": True}
    by_keywords = kernels.problem_for(1000, 64, tokens=512, outputs=("entropy", "predicted"), **keywords)
    by_options = kernels.problem_for(1000, 64, tokens=512, options=LossOptions(
        **keywords, return_entropy=True, return_predicted=True))
    fields = [name for name, *_ in _lib.Problem._fields_]
    assert [getattr(by_options, f) for f in fields] == [getattr(by_keywords, f) for f in fields]
    assert by_options.sequence_length == 512 and by_options.outputs == _lib.OUTPUT_ENTROPY | _lib.OUTPUT_PREDICTED


# --- the operators' schema ---------------------------------------------------------------------------

EVERY_OPTION = LossOptions(ignore_index=-7, reduction="sum", mode="eager", chunk_size=64, workspace_budget=1 << 20,
                           softcap=3.0, temperature=0.5, z_loss_scale=1e-3, label_smoothing=0.2, token_scaling=True,
                           return_entropy=True, return_logprob=True, return_predicted=True)


def test_forward_inputs_carry_every_option_argument_of_the_schema_by_name_and_back():
    x, w, y = inputs()
    args = _ops.forward_inputs(x, w, None, y, EVERY_OPTION, wanted=(True, False, False), sequence_length=3)
    assert args._fields == tuple(inspect.signature(_ops._forward_impl).parameters)
    carried = [name for name in OPTION_NAMES if name in args._fields]
    assert carried == ["ignore_index", "reduction", "mode", "chunk_size", "workspace_budget", "softcap",
                       "temperature", "z_loss_scale", "label_smoothing", "token_scaling"]
    assert all(getattr(args, name) == getattr(EVERY_OPTION, name) for name in carried)
    assert args.outputs == EVERY_OPTION.outputs and args.sequence_length == 3 and args.need_hidden
    assert _ops._options_of(args._asdict()) == EVERY_OPTION
    # lfce::backward takes the same options under the same names (no mode: it always recomputes).
    backward = _ops._backward_inputs(args, lse=None, valid_count=None, grad_loss=None, grad_lse=None)
    assert _ops._options_of(backward._asdict()) == dataclasses.replace(EVERY_OPTION, mode="recompute")


def test_the_registered_schemas_are_the_implementations_signatures():
    if not _ops.HAVE_CUSTOM_OPS:
        pytest.skip("this PyTorch has no torch.library.custom_op")
    for op, names in ((torch.ops.lfce.forward.default, _ops.ForwardInputs._fields),
                      (torch.ops.lfce.backward.default, _ops.BackwardInputs._fields)):
        assert tuple(a.name for a in op._schema.arguments) == names


def test_the_autograd_rule_answers_every_input_of_the_forward():
    """One gradient (or None) per lfce::forward argument, counted from the schema: a forward argument
    added to the schema needs no change here."""
    x, w, y = inputs()
    args = _ops.forward_inputs(x, w, None, y, LossOptions())

    class Context:
        needs_input_grad = (True, True, False) + (False,) * (len(args) - 3)
        saved_tensors = ()
        eager = has_bias = False

    grads = _ops._backward_rule(Context(), None, None)  # no upstream gradient reached the outputs
    assert len(grads) == len(args) == len(_ops.ForwardInputs._fields) and all(g is None for g in grads)
