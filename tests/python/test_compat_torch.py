"""lfce.compat.torch (PyTorch's torch.nn.functional.linear_cross_entropy and torch.nn.LinearCrossEntropyLoss
signatures) on CPU tensors against PyTorch's definition in fp64: F.cross_entropy(F.linear(input,
linear_weight, linear_bias), target, weight, ignore_index (None: -100), reduction, label_smoothing),
for every combination of the arguments it accepts, loss and gradients; and its refusals (probability
targets, the K-dimensional loss, more than 2-D input, options that are not lfce's), each naming the
limitation.
"""

import itertools
import re

import pytest
import torch
import torch.nn.functional as F
from checks import make_inputs

import lfce
from lfce.compat import torch as lfce_torch

N, H, C = 23, 16, 97
REDUCTIONS = ["mean", "sum", "none"]
# fp64 inputs: lfce's CPU path agrees with F.cross_entropy's to ~1e-15 (measured over every combination:
# up to 2.7e-16 of the largest loss, 1.3e-15 of the largest gradient); the tolerance is about 4x.
TOL = {"rtol": 5e-15, "atol": 5e-15}


def raises(exception, *fragments):
    return pytest.raises(exception, match=".*".join(re.escape(f) for f in fragments))


def problem(bias, ignore_index, seed=0):
    """fp64 (input, linear_weight, bias or None, target, class weights in [0.5, 1.5]); every fifth
    target is the ignore_index in force (-100 for None)."""
    x, w, b, y = make_inputs(N, H, C, torch.float64, bias=bias, seed=seed,
                             ignore_index=-100 if ignore_index is None else ignore_index, device="cpu")
    class_weight = torch.rand(C, generator=torch.Generator().manual_seed(seed + 1), dtype=torch.float64) + 0.5
    return x, w, b, y, class_weight


def leaves(*tensors):
    return [None if t is None else t.detach().clone().requires_grad_() for t in tensors]


def backward_of(loss, seed=2):
    g = torch.rand(loss.shape, generator=torch.Generator().manual_seed(seed), dtype=torch.float64) + 0.5
    (loss * g).sum().backward()


COMBINATIONS = list(itertools.product(REDUCTIONS, [False, True], [False, True], [None, -100, 3], [0.0, 0.1, 1.0]))


@pytest.mark.parametrize("reduction, bias, weighted, ignore_index, label_smoothing", COMBINATIONS,
                         ids=lambda v: str(v))
def test_matches_torch_cross_entropy_of_the_logits(reduction, bias, weighted, ignore_index, label_smoothing):
    x, w, b, y, class_weight = problem(bias, ignore_index)
    cw = class_weight if weighted else None
    ours_in, theirs_in = leaves(x, w, b), leaves(x, w, b)
    ours = lfce_torch.linear_cross_entropy(ours_in[0], ours_in[1], y, linear_bias=ours_in[2], weight=cw,
                                           reduction=reduction, ignore_index=ignore_index,
                                           label_smoothing=label_smoothing)
    theirs = F.cross_entropy(F.linear(*theirs_in), y, weight=cw, reduction=reduction,
                             ignore_index=-100 if ignore_index is None else ignore_index,
                             label_smoothing=label_smoothing)
    assert ours.dtype == torch.float64 and ours.shape == theirs.shape
    torch.testing.assert_close(ours, theirs, **TOL)
    backward_of(ours)
    backward_of(theirs)
    for name, a, e in zip(("input", "linear_weight", "linear_bias"), ours_in, theirs_in):
        if e is not None:
            torch.testing.assert_close(a.grad, e.grad, **TOL, msg=f"grad of {name}")


@pytest.mark.parametrize("reduction", REDUCTIONS)
def test_an_unbatched_input_is_one_token(reduction):
    x, w, _, y, class_weight = problem(False, None)
    ours = lfce_torch.linear_cross_entropy(x[0], w, y[0], weight=class_weight, reduction=reduction,
                                           label_smoothing=0.1)
    theirs = F.cross_entropy(F.linear(x[0], w), y[0], weight=class_weight, reduction=reduction, label_smoothing=0.1)
    assert ours.shape == theirs.shape == ()
    torch.testing.assert_close(ours, theirs, **TOL)


@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float32])
def test_low_precision_inputs_give_an_fp32_loss_near_torchs(dtype):
    x, w, b, y, class_weight = problem(True, None)
    x, w, b = (t.to(dtype) for t in (x, w, b))
    ours = lfce_torch.linear_cross_entropy(x, w, y, linear_bias=b, weight=class_weight.to(dtype), label_smoothing=0.1)
    theirs = F.cross_entropy(F.linear(x.double(), w.double(), b.double()), y, weight=class_weight.to(dtype).double(),
                             label_smoothing=0.1)
    assert ours.dtype == torch.float32
    torch.testing.assert_close(ours.double(), theirs, rtol=2e-6, atol=2e-6)


def test_all_targets_ignored_gives_nan_for_mean_as_torch():
    x, w, _, y, _ = problem(False, None)
    y = torch.full_like(y, -100)
    ours = lfce_torch.linear_cross_entropy(x, w, y)
    assert ours.isnan() and F.cross_entropy(F.linear(x, w), y).isnan()


@pytest.mark.parametrize("reduction, bias, weighted, ignore_index, label_smoothing",
                         [("mean", True, True, None, 0.1), ("none", False, False, 3, 0.0), ("sum", True, False, -1, 1.0)])
def test_the_module_matches_torch_with_its_own_linear_layer(reduction, bias, weighted, ignore_index, label_smoothing):
    torch.manual_seed(0)
    x, _, _, y, class_weight = problem(False, ignore_index)
    module = lfce_torch.LinearCrossEntropyLoss(H, C, bias=bias, dtype=torch.float64, reduction=reduction,
                                               weight=class_weight if weighted else None, ignore_index=ignore_index,
                                               label_smoothing=label_smoothing)
    reference = torch.nn.CrossEntropyLoss(weight=class_weight if weighted else None, reduction=reduction,
                                          ignore_index=-100 if ignore_index is None else ignore_index,
                                          label_smoothing=label_smoothing)
    assert module.linear.weight.shape == (C, H) and (module.linear.bias is not None) == bias
    assert ("weight" in dict(module.named_buffers())) == weighted
    ours = module(x, y)
    theirs = reference(module.linear(x), y)
    torch.testing.assert_close(ours, theirs, **TOL)
    ours.sum().backward()
    grads = [p.grad.clone() for p in module.linear.parameters()]
    module.zero_grad()
    reference(module.linear(x), y).sum().backward()
    for ours_grad, p in zip(grads, module.linear.parameters()):
        torch.testing.assert_close(ours_grad, p.grad, **TOL)


def test_lfce_execution_options_pass_through_options():
    x, w, _, y, _ = problem(False, None)
    plain = lfce_torch.linear_cross_entropy(x, w, y)
    chunked = lfce_torch.linear_cross_entropy(x, w, y, options={"chunk_size": 5, "mode": "eager"})
    torch.testing.assert_close(chunked, plain, **TOL)
    module = lfce_torch.LinearCrossEntropyLoss(H, C, options={"workspace_budget": 1 << 12})
    assert module.options == {"workspace_budget": 1 << 12}


# --- refusals ------------------------------------------------------------------------------------------

def test_probability_targets_are_refused_naming_the_limitation():
    x, w, _, _, _ = problem(False, None)
    probabilities = torch.softmax(torch.randn(N, C, dtype=torch.float64), -1)
    with raises(NotImplementedError, "target holds class probabilities (torch.float64)", "class-index targets only",
                "torch.nn.functional.linear_cross_entropy"):
        lfce_torch.linear_cross_entropy(x, w, probabilities)
    with raises(lfce.UnsupportedError, "class probabilities"):
        lfce_torch.LinearCrossEntropyLoss(H, C, dtype=torch.float64)(x, probabilities)


def test_the_k_dimensional_loss_is_refused():
    x, w, _, y, _ = problem(False, None)
    with raises(NotImplementedError, "linear_weight of shape (97, 1, 16)", "no K-dimensional loss"):
        lfce_torch.linear_cross_entropy(x, w[:, None, :], y)
    with raises(NotImplementedError, "out_features=(4,)", "no K-dimensional loss"):
        lfce_torch.LinearCrossEntropyLoss(H, C, out_features=(4,))


def test_input_of_more_than_two_dimensions_is_refused_naming_the_fix():
    x, w, _, y, _ = problem(False, None)
    with raises(NotImplementedError, "input of shape (1, 23, 16)", "input.flatten(0, -2)"):
        lfce_torch.linear_cross_entropy(x[None], w, y[None])


def test_options_that_are_not_lfces_are_refused():
    x, w, _, y, _ = problem(False, None)
    with raises(NotImplementedError, "options ['chunking_strategy'] are not lfce's", "mode", "chunk_size"):
        lfce_torch.linear_cross_entropy(x, w, y, options={"chunking_strategy": "auto"})
    with raises(TypeError, "options must be None or a dict", "got list"):
        lfce_torch.linear_cross_entropy(x, w, y, options=["mode"])


@pytest.mark.parametrize("argument, value, exception, message", [
    ("reduction", "avg", ValueError, "reduction must be one of 'mean', 'sum', 'none', got 'avg'"),
    ("label_smoothing", 1.5, ValueError, "label_smoothing must be None or a number in [0, 1]"),
    ("ignore_index", 2.5, TypeError, "ignore_index must be an int, got float 2.5"),
    ("weight", torch.ones(C, dtype=torch.int64), TypeError, "weight must have a floating dtype"),
    ("weight", torch.ones(C + 1, dtype=torch.float64), ValueError, "class_weight must have shape [V] = (97,)")])
def test_bad_arguments_are_named(argument, value, exception, message):
    x, w, _, y, _ = problem(False, None)
    with raises(exception, message):
        lfce_torch.linear_cross_entropy(x, w, y, **{argument: value})


def test_the_module_checks_its_arguments_at_construction():
    with raises(ValueError, "reduction must be one of", "got 'avg'"):
        lfce_torch.LinearCrossEntropyLoss(H, C, reduction="avg")
    with raises(ValueError, "weight must have shape [num_classes] = (97,)", "(3,)"):
        lfce_torch.LinearCrossEntropyLoss(H, C, weight=torch.ones(3))
    with raises(ValueError, "num_classes must be in [1,"):
        lfce_torch.LinearCrossEntropyLoss(H, 0)
