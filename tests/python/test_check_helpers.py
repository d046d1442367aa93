"""The comparison helpers of checks.py catch what the GPU tests rely on them to catch (CPU only).

lfce itself needs a GPU, so its roundings are modelled here on CPU: logits in float64
(lfce's fp32 logits are far more precise than any bf16 step), dz rounded to the dtype,
each gradient rounded to the dtype. The same model with the logits rounded to bf16 is
the broken kernel the peaked-logits test must reject.
"""

from dataclasses import replace

import checks
import pytest
import torch
from checks import (
    GRAD,
    LOSS,
    PEAKED_REL_L2,
    assert_close,
    assert_gradients_match,
    chunked_reference,
)

BF16 = torch.bfloat16


def rounded_to(dtype):
    return lambda t: t.to(dtype).double()


def lfce_model(x, w, b, y, reduction, grad, dtype, round_logits=False, ignore_index=-100):
    hook = rounded_to(dtype)
    out = chunked_reference(x, w, b, y, reduction, grad, ignore_index=ignore_index, tokens_per_chunk=256,
                            logits_hook=hook if round_logits else None, dz_hook=hook)
    loss, *grads = out
    return (loss.to(torch.float32),) + tuple(None if t is None else t.to(dtype) for t in grads)  # lfce's loss is fp32


def small_problem(reduction="mean", dtype=BF16, bias=True):
    x, w, b, y = checks.make_inputs(96, 128, 1000, dtype, bias=bias, device="cpu")
    grad = checks.upstream(reduction, y.shape, dtype, device="cpu")
    return x, w, b, y, grad


@pytest.mark.parametrize("reduction", ["mean", "sum", "none"])
def test_chunked_reference_matches_autograd_reference(reduction):
    x, w, b, y, grad = small_problem(reduction)
    expected = checks.reference(x, w, b, y, reduction, grad)
    chunked = chunked_reference(x, w, b, y, reduction, grad, tokens_per_chunk=40)
    for name, a, e in zip(("loss", "grad_hidden", "grad_weight", "grad_bias"), chunked, expected):
        assert torch.allclose(a, e, rtol=1e-12, atol=1e-15), name


@pytest.mark.parametrize("reduction", ["mean", "none"])
def test_lfce_roundings_pass(reduction):
    x, w, b, y, grad = small_problem(reduction)
    assert_gradients_match(lfce_model(x, w, b, y, reduction, grad, BF16), checks.reference(x, w, b, y, reduction, grad),
                           BF16, reduction)


def test_zeroed_grad_weight_row_fails_the_row_check_only():
    x, w, b, y, grad = small_problem()
    ref = checks.reference(x, w, b, y, "mean", grad)
    ours = list(lfce_model(x, w, b, y, "mean", grad, BF16))
    norms = ref[2].norm(dim=1)
    row = int((norms - 5e-4 * ref[2].norm()).abs().argmin())  # a row holding 5e-4 of the norm
    ours[2] = ours[2].clone()
    ours[2][row] = 0
    metrics = checks.measure(ours[2], ref[2], GRAD[BF16])
    assert metrics["rel_l2"] <= GRAD[BF16].rel_l2, "the whole-tensor rel. L2 alone would have caught it"
    with pytest.raises(AssertionError, match=r"grad_weight \(bfloat16\): 1 row\(s\) .*first: row %d," % row):
        assert_close("grad_weight", ours[2], ref[2], GRAD[BF16])


def test_zeroed_grad_bias_block_fails():
    x, w, b, y, grad = small_problem()
    ref = checks.reference(x, w, b, y, "mean", grad)
    ours = lfce_model(x, w, b, y, "mean", grad, BF16)[3].clone()
    ours[-8:] = 0  # a missing edge tile: the last 8 vocabulary entries
    with pytest.raises(AssertionError, match=r"grad_bias \(bfloat16\): .*1 row\(s\) with relative L2 .* first: row %d,"
                                             % (999 // checks.BIAS_ROW)):
        assert_close("grad_bias", ours, ref[3], GRAD[BF16])


def test_wrong_element_names_index_expected_and_actual():
    x, w, b, y, grad = small_problem()
    ref = checks.reference(x, w, b, y, "mean", grad)
    ours = lfce_model(x, w, b, y, "mean", grad, BF16)[1].clone()
    ours[5, 7] = -ours[5, 7] + float(ref[1].abs().max())  # off by about max |expected|
    with pytest.raises(AssertionError, match=r"1 element\(s\) off by more than atol .* first at \(5, 7\): "
                                             rf"expected {float(ref[1][5, 7])!r}, got {float(ours[5, 7])!r}"):
        assert_close("grad_hidden", ours, ref[1], GRAD[BF16])


def test_nan_fails_every_measure():
    x, w, b, y, grad = small_problem()
    ref = checks.reference(x, w, b, y, "mean", grad)
    ours = lfce_model(x, w, b, y, "mean", grad, BF16)[2].clone()
    ours[3, 3] = float("nan")
    metrics = checks.measure(ours, ref[2], GRAD[BF16])
    assert metrics["rel_l2"] == float("inf") and metrics["bad_elements"] == 1 and metrics["bad_rows"] == 1


def test_bf16_rounded_logits_fail_the_peaked_case():
    """At V = 2048 the target logits (ln V + 2, about 9.6) lie in the same binade [8, 16) as at
    V = 256000 (14.4), so their bf16 rounding is the one the GPU test sees."""
    x, w, b, y = checks.peaked_inputs(64, 128, 2048, BF16, device="cpu")
    grad = checks.upstream("mean", (), BF16, device="cpu")
    ref = chunked_reference(x, w, b, y, "mean", grad)
    tol = replace(GRAD[BF16], rel_l2=PEAKED_REL_L2)
    good = lfce_model(x, w, b, y, "mean", grad, BF16)
    broken = lfce_model(x, w, b, y, "mean", grad, BF16, round_logits=True)
    assert_close("loss", good[0], ref[0], LOSS[BF16])
    for name, a, e in zip(("grad_hidden", "grad_weight"), good[1:3], ref[1:3]):
        assert_close(name, a, e, tol)
    for name, a, e in zip(("grad_hidden", "grad_weight"), broken[1:3], ref[1:3]):
        with pytest.raises(AssertionError, match="rel L2"):
            assert_close(name, a, e, tol)
        rel = checks.measure(a, e, tol)["rel_l2"]
        assert rel > 2 * PEAKED_REL_L2, f"{name}: the broken kernel fails only narrowly ({rel:.3g})"


def test_fp16_underflowing_dz_fails():
    """dz = p / N rounded to fp16 as it is (most entries below fp16's range at this N) fails;
    scaled by a power of two before the rounding and unscaled after (as the kernels do) passes."""
    x, w, b, y = checks.make_inputs(256, 64, 2048, torch.float16, device="cpu")
    grad = checks.upstream("mean", (), torch.float16, device="cpu")
    ref = chunked_reference(x, w, b, y, "mean", grad)

    def model(dz_hook):
        out = chunked_reference(x, w, b, y, "mean", grad, tokens_per_chunk=256, dz_hook=dz_hook)
        return tuple(None if t is None else t.to(torch.float16) for t in out)

    flushed = model(rounded_to(torch.float16))
    kept = model(lambda d: (d * 2.0 ** 8).to(torch.float16).double() / 2.0 ** 8)
    kept_metrics = checks.measure(kept[2], ref[2], GRAD[torch.float16])
    assert kept_metrics["bad_rows"] == 0 and kept_metrics["bad_elements"] == 0
    with pytest.raises(AssertionError, match=r"grad_weight \(float16\): .*row\(s\) with relative L2"):
        assert_close("grad_weight", flushed[2], ref[2], GRAD[torch.float16])


def test_bitwise_and_one_ulp_comparisons():
    a = torch.tensor([1.0, 2.0, -3.0, 0.0]).to(BF16)
    b = a.clone()
    checks.assert_bitwise_equal("t", a, b)
    b[2] = -3.0 - 2.0 ** -6  # one bf16 step away
    with pytest.raises(AssertionError, match=r"t: 1 of 4 elements differ; first at \(2,\)"):
        checks.assert_bitwise_equal("t", b, a)
    checks.assert_within_one_ulp("t", b, a, atol=0.0)
    b[2] = -3.05  # two steps of 2^-6
    with pytest.raises(AssertionError, match=r"1 element\(s\) more than one bfloat16 step"):
        checks.assert_within_one_ulp("t", b, a, atol=0.0)
