"""The drop-in entry points compute lfce's loss (needs a CUDA GPU).

* Liger-Kernel's functional and module forms (the module takes the weight first) give the
  loss and gradients of lfce.linear_cross_entropy bit for bit: the same kernels run.
* Cut Cross-Entropy's shift=True scores position i against target i + 1: against the fp64
  reference of the shifted problem, within the numeric tests' tolerances; the last position
  gets no gradient, and a "none" loss has the shape of targets[..., 1:].
"""

import pytest
import torch
from checks import (
    assert_bitwise_equal,
    assert_gradients_match,
    make_inputs,
    reference,
    shifted_problem,
    upstream,
)

import lfce
from lfce.compat import cce, liger

pytestmark = pytest.mark.gpu

BF16 = torch.bfloat16


def leaves(*tensors):
    return [None if t is None else t.detach().clone().requires_grad_() for t in tensors]


def step(fn, x, w, b, y, grad):
    x, w, b = leaves(x, w, b)
    loss = fn(x, w, b, y)
    loss.backward(grad)
    return loss.detach(), x.grad, w.grad, None if b is None else b.grad


@pytest.mark.parametrize("reduction", ["mean", "sum", "none"])
def test_liger_entry_points_equal_lfce_bitwise(reduction):
    x, w, b, y = make_inputs(77, 256, 3000, BF16, bias=True)
    grad = upstream(reduction, y.shape, BF16).float()
    expected = step(lambda x, w, b, y: lfce.linear_cross_entropy(x, w, y, b, reduction=reduction), x, w, b, y, grad)
    module = liger.LigerFusedLinearCrossEntropyLoss(reduction=reduction)
    for name, fn in (("functional", lambda x, w, b, y: liger.liger_fused_linear_cross_entropy(x, w, y, b,
                                                                                             reduction=reduction)),
                     ("module", lambda x, w, b, y: module(w, x, y, b))):
        for what, a, e in zip(("loss", "grad_hidden", "grad_weight", "grad_bias"), step(fn, x, w, b, y, grad),
                              expected):
            assert_bitwise_equal(f"{what} ({name}, {reduction})", a, e)


@pytest.mark.parametrize("reduction", ["mean", "sum", "none"])
def test_cce_shift_scores_each_position_against_the_next_target(reduction, record_error):
    batch, length, h, v = 2, 33, 256, 3000
    x, w, _, y = make_inputs(batch * length, h, v, BF16)
    e, targets = x.reshape(batch, length, h), y.reshape(batch, length)
    grad = upstream(reduction, (batch, length - 1), BF16)
    (e_leaf, c_leaf) = leaves(e, w)
    loss = cce.linear_cross_entropy(e_leaf, c_leaf, targets, reduction=reduction, shift=True)
    expected_shape = (batch, length - 1) if reduction == "none" else ()
    assert tuple(loss.shape) == expected_shape
    loss.backward(grad)
    assert int(torch.count_nonzero(e_leaf.grad[:, -1])) == 0, "the last position has no target but got a gradient"
    shifted_e, shifted_targets = shifted_problem(e, targets)
    ref_grad = grad.reshape(-1) if reduction == "none" else grad
    ref = reference(shifted_e, w, None, shifted_targets, reduction, ref_grad)
    ours = (loss.detach().reshape(ref[0].shape), e_leaf.grad[:, :-1].reshape(-1, h), c_leaf.grad, None)
    assert_gradients_match(ours, ref, BF16, reduction, record_error)
