"""The logit softcap (Gemma 2): lfce against an fp64 reference independent of the kernels:
F.cross_entropy of c * tanh(z / c) through autograd (checks.reference with softcap=c).

The cap is small (c = 3 against logits of std 2.5), so most logits are bent and an ignored
softcap, or a backward without the chain rule, fails by far more than the tolerance (checked in
each test against the uncapped reference). V = 64007 is a multiple of no tile; bias on and off
covers both forms of the sm_90a forward epilogue (registers without a bias, staged with one).
"""

import pytest
import torch
from checks import (
    GRAD,
    LOSS,
    assert_bitwise_equal,
    assert_gradients_match,
    make_inputs,
    reference,
    run_lfce,
    upstream,
)

import lfce

pytestmark = pytest.mark.gpu

CAP = 3.0


def rel_l2(a, b):
    a, b = a.double(), b.double()
    return float((a - b).norm() / b.norm())


@pytest.mark.parametrize("bias", [False, True], ids=["no_bias", "bias"])
@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float32], ids=["bf16", "fp32"])
@pytest.mark.parametrize("reduction", ["mean", "sum", "none"])
@pytest.mark.parametrize("mode", ["recompute", "eager"])
def test_softcap_matches_an_fp64_reference(mode, reduction, dtype, bias, record_error):
    x, w, b, y = make_inputs(300, 512, 64007, dtype, bias=bias)
    grad = upstream(reduction, y.shape, dtype)
    ours = run_lfce(x, w, b, y, reduction, grad, mode=mode, softcap=CAP)
    ref = reference(x, w, b, y, reduction, grad, softcap=CAP)
    assert_gradients_match(ours, ref, dtype, reduction, record_error)
    # The cap matters here: the uncapped answer is far outside the tolerances.
    plain = reference(x, w, b, y, reduction, grad)
    assert rel_l2(plain[0], ref[0]) > 10 * LOSS[dtype].rel_l2
    assert rel_l2(plain[1], ref[1]) > 10 * GRAD[dtype].rel_l2


def test_softcap_at_a_large_vocabulary(record_error):
    x, w, b, y = make_inputs(128, 256, 256000, torch.bfloat16, bias=False)
    grad = upstream("mean", (), torch.bfloat16)
    ours = run_lfce(x, w, b, y, "mean", grad, softcap=30.0)
    ref = reference(x, w, b, y, "mean", grad, softcap=30.0)
    assert_gradients_match(ours, ref, torch.bfloat16, "mean", record_error)


@pytest.mark.parametrize("mode", ["recompute", "eager"])
def test_softcap_is_deterministic_and_independent_of_the_vocab_chunk(mode):
    """Run to run bit-identical; with a narrower chunk, grad_weight and grad_bias bit-identical
    (each row is computed whole inside one chunk) and grad_hidden within fp32 reassociation."""
    x, w, b, y = make_inputs(64, 2304, 151937, torch.bfloat16, bias=True)
    grad = upstream("mean", (), torch.bfloat16)
    first = run_lfce(x, w, b, y, "mean", grad, mode=mode, softcap=CAP)
    again = run_lfce(x, w, b, y, "mean", grad, mode=mode, softcap=CAP)
    for name, a, e in zip(("loss", "grad_hidden", "grad_weight", "grad_bias"), again, first):
        assert_bitwise_equal(name, a, e)
    chunked = run_lfce(x, w, b, y, "mean", grad, mode=mode, softcap=CAP, chunk_size=256)
    assert_bitwise_equal("loss", chunked[0], first[0])
    assert_bitwise_equal("grad_weight", chunked[2], first[2])
    assert_bitwise_equal("grad_bias", chunked[3], first[3])
    assert rel_l2(chunked[1], first[1]) < 1e-2


def test_softcap_reaches_the_module_and_the_compat_entry_points():
    from lfce.compat import cce, liger

    x, w, _, y = make_inputs(96, 256, 5000, torch.bfloat16, bias=False)
    expected = lfce.linear_cross_entropy(x, w, y, softcap=CAP)
    assert_bitwise_equal("module", lfce.LinearCrossEntropyLoss(softcap=CAP)(x, w, y), expected)
    assert_bitwise_equal("cce", cce.linear_cross_entropy(x, w, y, softcap=CAP), expected)
    assert_bitwise_equal("liger", liger.liger_fused_linear_cross_entropy(x, w, y, softcap=CAP), expected)
    assert not torch.equal(lfce.linear_cross_entropy(x, w, y), expected)
