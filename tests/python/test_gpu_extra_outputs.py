"""The extra per-token outputs on the GPU: lfce against an fp64 reference written here from the
definitions, independent of the kernels and of checks.reference:

    u = c * tanh(z / c) (with a softcap c), then u / T; p = softmax(u);
    lse = logsumexp(u), entropy = -sum_v p_v log p_v (every token), logprob = log p_y (0 for an
    ignored token), predicted = argmax_v u (the lowest index among equal maxima; -1 for an ignored
    token), accuracy = [predicted == y] over the counted tokens (Liger-Kernel's token accuracy);

and the gradients of loss * g + sum_t (w1_t lse_t + w2_t entropy_t + w3_t logprob_t), random
per-token weights w of the loss gradient's size, through autograd, checked elementwise and per row
(checks.assert_close with the GRAD tolerances). The outputs are fp32 values computed from inputs
in the dtype, compared with the OUTPUT tolerance (about ten times what the H200 measured); each
test records what it measured (record_error).

V = 64007 is a multiple of no tile; V = 256000 with peaked logits (p(target) about 0.8: the
entropy small, the accuracy 1) is the large case. Random targets would make the accuracy 0, so
every other counted token's target is the class the reference ranks first. Ties in the argmax
(identical weight rows and biases, in different tiles of the vocabulary) must give the lowest
index; two runs must agree bit for bit.
"""

from dataclasses import replace

import pytest
import torch
import torch.nn.functional as F
from checks import (
    GRAD,
    LOSS,
    Tolerance,
    assert_bitwise_equal,
    assert_close,
    make_inputs,
    peaked_inputs,
    upstream,
)

import lfce

pytestmark = pytest.mark.gpu

IGNORE = -100
ROWS = ("lse", "entropy", "logprob")  # the differentiable outputs
EVERY_OUTPUT = {"return_lse": True, "return_entropy": True, "return_logprob": True, "return_accuracy": True,
                "return_predicted": True}
# Two logits of a token closer than this (in units of u) may come out of the fp32 GEMM in either order.
NEAR_TIE = 1e-3
# The outputs are fp32 values from the same (dtype-rounded) inputs as the reference: only the
# kernels' fp32 sums and exponentials differ from it. Measured on the H200
# (docs/measurements.md#extra-outputs-accuracy): relative L2 up to 2.4e-7 for lse, entropy
# and logprob, and with peaked logits at V = 256000 1.2e-6 for the small entropies and 5.9e-6 for the
# logprobs near 0 (u_y - LSE: about one fp32 ulp of |LSE| ~ 15 absolute); elementwise at most a sixth
# of these bounds (about 2e-6 absolute at |LSE| ~ 11; the entropy as ln s - t / s, no cancellation
# between LSE and sum p u).
OUTPUT = Tolerance(rel_l2=1e-6, rtol=1e-6, atol=1e-5, row=None, row_floor=0.0)
OUTPUT_REL_L2 = {"lse": 1e-6, "entropy": 5e-6, "logprob": 2e-5}
# Random per-token weights of either sign make some tokens' dz a near-cancelling sum of the loss's
# and the rows' terms; its fp32 rounding (p within 2^-24 |LSE| relative) is then a larger fraction of
# a rare class's grad_weight row than the loss alone gives: up to 1.4e-4 on the CPU model, so the
# fp32 row tolerance is 5e-4 here (GRAD's elsewhere).
GRADIENT = {**GRAD, torch.float32: replace(GRAD[torch.float32], row=5e-4)}


def predicted_targets(x, w, b, y, softcap=None, temperature=1.0):
    """y with the target of every other counted token replaced by the class its logits rank first."""
    u = softmax_logits(x.double(), w.double(), None if b is None else b.double(), softcap, temperature)
    counted = y != IGNORE
    chosen = counted & (torch.arange(y.shape[0], device=y.device) % 2 == 0)
    return torch.where(chosen, u.argmax(-1), y)


def softmax_logits(x, w, b, softcap, temperature):
    logits = F.linear(x, w, b)
    if softcap is not None:
        logits = softcap * torch.tanh(logits / softcap)
    return logits / temperature


def row_weights(y, reduction, grad, seed=5):
    """Per-token fp32 weights of the differentiable outputs, of either sign and of the size of each
    token's loss gradient (grad / count for "mean"), so that neither part of dz hides the other."""
    g = torch.Generator(device=y.device).manual_seed(seed)
    size = float(grad.float().abs().mean())
    if reduction == "mean":
        size /= int((y != IGNORE).sum())
    return {name: torch.randn(y.shape, device=y.device, generator=g) * size for name in ROWS}


def reference(x, w, b, y, reduction, grad, weights, softcap=None, temperature=1.0, with_loss=True):
    """fp64 ({loss, lse, entropy, logprob, u}, (grad_hidden, grad_weight, grad_bias)) of
    loss * grad + sum of weights[name] * name over the rows in ``weights``, through autograd."""
    x64, w64 = (t.detach().double().requires_grad_() for t in (x, w))
    b64 = None if b is None else b.detach().double().requires_grad_()
    u = softmax_logits(x64, w64, b64, softcap, temperature)
    counted = y != IGNORE
    log_p = F.log_softmax(u, dim=-1)
    picked = log_p.gather(1, torch.where(counted, y, 0)[:, None])[:, 0]
    values = {
        "loss": F.cross_entropy(u, y, ignore_index=IGNORE, reduction=reduction),
        "lse": torch.logsumexp(u, dim=-1),
        "entropy": -(log_p.exp() * log_p).sum(-1),
        "logprob": torch.where(counted, picked, torch.zeros_like(picked)),
    }
    objective = (values["loss"] * grad.double()).sum() if with_loss else 0.0
    objective = objective + sum((values[name] * weight.double()).sum() for name, weight in weights.items())
    objective.backward()
    values = {name: value.detach() for name, value in values.items()}
    values["u"] = u.detach()
    return values, (x64.grad, w64.grad, None if b is None else b64.grad)


def run(x, w, b, y, reduction, grad, weights, with_loss=True, **options):
    """lfce's LossOutput and (grad_hidden, grad_weight, grad_bias) of the same objective, for leaf
    copies of the inputs."""
    x, w = (t.detach().clone().requires_grad_() for t in (x, w))
    b = None if b is None else b.detach().clone().requires_grad_()
    out = lfce.linear_cross_entropy(x, w, y, b, reduction=reduction, **options)
    tensors = ([out.loss] if with_loss else []) + [getattr(out, name) for name in weights]
    gradients = ([grad.to(torch.float32)] if with_loss else []) + list(weights.values())
    torch.autograd.backward(tensors, gradients)
    return out, (x.grad, w.grad, None if b is None else b.grad)


def assert_predicted(predicted, u, y):
    """predicted against the fp64 argmax: -1 for ignored tokens; where the top two logits are within
    NEAR_TIE (the fp32 logits may order them either way) either of the near-maximal classes."""
    counted = y != IGNORE
    assert predicted.dtype == torch.int64 and predicted.shape == y.shape
    assert torch.all(predicted[~counted] == -1), "an ignored token's predicted id is not -1"
    top2 = u.topk(2, dim=-1).values
    clear = counted & (top2[:, 0] - top2[:, 1] > NEAR_TIE)
    expected = u.argmax(-1)
    bad = clear & (predicted != expected)
    if bool(bad.any()):
        t = int(torch.nonzero(bad)[0])
        raise AssertionError(f"predicted: {int(bad.sum())} token(s) differ from the fp64 argmax; first token {t}: "
                             f"expected {int(expected[t])}, got {int(predicted[t])}")
    near = counted & ~clear
    picked = u.gather(1, predicted.clamp(min=0)[:, None])[:, 0]
    assert torch.all(picked[near] >= top2[near, 0] - NEAR_TIE), "a near tie resolved to a class far from the max"


def assert_outputs(out, ref, y, reduction, dtype, extra, record_error):
    """Each field of the LossOutput: None where not asked for; the rows against the reference
    (every token: the ignored ones' lse and entropy are real values, their logprob exactly 0);
    predicted and accuracy as Liger-Kernel defines them."""
    counted = y != IGNORE
    for name in ROWS:
        value = getattr(out, name)
        if not extra.get(f"return_{name}"):
            assert value is None, f"{name} was not asked for"
            continue
        assert value.dtype == torch.float32 and value.shape == y.shape, (name, value.dtype, tuple(value.shape))
        assert_close(name, value, ref[name], output_tolerance(name, dtype, ref), record_error)
    if extra.get("return_logprob"):
        assert int(torch.count_nonzero(out.logprob[~counted])) == 0, "an ignored token's logprob is not 0"
    if extra.get("return_predicted"):
        assert_predicted(out.predicted, ref["u"], y)
    else:
        assert out.predicted is None
    if extra.get("return_accuracy"):
        assert_accuracy(out.accuracy, out.predicted, ref["u"], y, reduction)
    else:
        assert out.accuracy is None


def output_tolerance(name, dtype, ref):
    """The outputs' tolerance (OUTPUT, OUTPUT_REL_L2), whatever the dtype: the reference rounds the
    inputs alike."""
    return replace(OUTPUT, rel_l2=OUTPUT_REL_L2[name])


def assert_accuracy(accuracy, predicted, u, y, reduction):
    """Liger-Kernel's token accuracy: [argmax == y] for counted tokens (0 for ignored ones), per token
    for "none", else its mean over the counted tokens. From lfce's predicted ids where returned
    (checked against the reference by assert_predicted), else from the fp64 argmax, where a token
    whose top two logits are within NEAR_TIE may go either way."""
    counted = y != IGNORE
    top2 = u.topk(2, dim=-1).values
    unsure = counted & (top2[:, 0] - top2[:, 1] <= NEAR_TIE) if predicted is None else torch.zeros_like(counted)
    correct = ((u.argmax(-1) if predicted is None else predicted) == y) & counted
    assert 0 < int(correct.sum()), "no target predicted: the accuracy is not exercised"
    assert accuracy.dtype == torch.float32 and not accuracy.requires_grad
    if reduction == "none":
        assert accuracy.shape == y.shape
        differ = (accuracy.double() != correct.double()) & ~unsure
        assert not bool(differ.any()), f"accuracy differs at token {int(torch.nonzero(differ)[0])}"
    else:
        assert accuracy.shape == ()
        expected = correct.double().sum() / counted.sum()
        slack = (int(unsure.sum()) + 1e-3) / int(counted.sum())
        assert abs(float(accuracy) - float(expected)) <= slack, f"accuracy {float(accuracy)}, expected {float(expected)}"


def assert_gradients(ours, ref, dtype, record_error):
    for name, actual, expected in zip(("grad_hidden", "grad_weight", "grad_bias"), ours, ref):
        if expected is not None:
            assert_close(name, actual, expected, GRADIENT[dtype], record_error)


def rel_l2(a, b):
    a, b = a.double(), b.double()
    return float((a - b).norm() / b.norm())


# name: (extra outputs, softcap, temperature, bias)
CASES = {
    "lse": ({"return_lse": True}, None, 1.0, True),
    "entropy": ({"return_entropy": True}, None, 1.0, False),
    "logprob": ({"return_logprob": True}, None, 1.0, True),
    "accuracy": ({"return_accuracy": True}, None, 1.0, False),
    "predicted": ({"return_predicted": True}, None, 1.0, True),
    # T > 1: at T = 0.6 the fp32 error of S = LSE - H (8e-6 of |LSE| on the CPU model) moves a few
    # rare classes' grad_weight rows by just over the fp32 row tolerance.
    "temperature_entropy": ({"return_entropy": True}, None, 1.7, True),
    "together": ({"return_lse": True, "return_logprob": True, "return_accuracy": True, "return_predicted": True},
                 None, 1.0, False),
}


@pytest.mark.parametrize("case", list(CASES))
@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float32], ids=["bf16", "fp32"])
@pytest.mark.parametrize("reduction", ["mean", "sum", "none"])
@pytest.mark.parametrize("mode", ["recompute", "eager"])
def test_extra_outputs_and_their_gradients_match_an_fp64_reference(mode, reduction, dtype, case, record_error):
    check_case(case, 192, 64007, mode, reduction, dtype, record_error)


@pytest.mark.parametrize("case", ["temperature_entropy", "together"])
@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float32], ids=["bf16", "fp32"])
@pytest.mark.parametrize("reduction", ["mean", "sum", "none"])
@pytest.mark.parametrize("mode", ["recompute", "eager"])
def test_output_combinations_at_a_large_vocabulary(mode, reduction, dtype, case, record_error):
    """The two named combinations of outputs (temperature with the entropy; lse, logprob, accuracy and
    predicted together) at V = 256000, in the whole matrix."""
    check_case(case, 64, 256000, mode, reduction, dtype, record_error)


def check_case(case, n, vocab, mode, reduction, dtype, record_error):
    """CASES[case] on n tokens (every fifth ignored, every other counted one predicted) at this vocabulary:
    the loss, the outputs and the gradients against the fp64 reference, and the outputs' (and the
    temperature's) terms far from the tolerances."""
    extra, softcap, temperature, bias = CASES[case]
    x, w, b, y = make_inputs(n, 256, vocab, dtype, bias=bias)
    y = predicted_targets(x, w, b, y, softcap, temperature)
    grad = upstream(reduction, y.shape, dtype)
    weights = {name: value for name, value in row_weights(y, reduction, grad).items() if extra.get(f"return_{name}")}
    out, ours = run(x, w, b, y, reduction, grad, weights, mode=mode, softcap=softcap, temperature=temperature, **extra)
    ref, ref_grads = reference(x, w, b, y, reduction, grad, weights, softcap, temperature)
    assert isinstance(out, lfce.LossOutput) and out.z_loss is None
    assert_close(f"loss ({reduction})", out.loss, ref["loss"], LOSS[dtype], record_error)
    assert_outputs(out, ref, y, reduction, dtype, extra, record_error)
    assert_gradients(ours, ref_grads, dtype, record_error)
    if weights:  # the outputs' terms of the gradient matter here: without them it is far off
        _, loss_only = reference(x, w, b, y, reduction, grad, {}, softcap, temperature)
        assert rel_l2(loss_only[0], ref_grads[0]) > 10 * GRAD[dtype].rel_l2, "the outputs barely move grad_hidden"
    if temperature != 1.0 and weights:  # and so does the temperature
        plain, _ = reference(x, w, b, y, reduction, grad, weights, softcap)
        for name in weights:
            assert rel_l2(plain[name], ref[name]) > 10 * LOSS[dtype].rel_l2, f"the temperature barely moves {name}"


@pytest.mark.parametrize("mode", ["recompute", "eager"])
def test_every_output_with_peaked_logits_at_a_large_vocabulary(mode, record_error):
    """V = 256000, p(target) about 0.8 (a small entropy; every target predicted), a softcap and a
    temperature, a few tokens ignored: all five outputs and the gradients through the three rows."""
    x, w, b, y = peaked_inputs(64, 256, 256000, torch.bfloat16)
    y = y.clone()
    y[4::5] = IGNORE
    grad = upstream("mean", (), torch.bfloat16)
    options = {"softcap": 30.0, "temperature": 0.8}
    weights = row_weights(y, "mean", grad)
    out, ours = run(x, w, b, y, "mean", grad, weights, mode=mode, **options, **EVERY_OUTPUT)
    ref, ref_grads = reference(x, w, b, y, "mean", grad, weights, **options)
    assert_close("loss (mean)", out.loss, ref["loss"], LOSS[torch.bfloat16], record_error)
    assert_outputs(out, ref, y, "mean", torch.bfloat16, EVERY_OUTPUT, record_error)
    assert float(out.accuracy) == 1.0, "a peaked target is its token's argmax"
    assert_gradients(ours, ref_grads, torch.bfloat16, record_error)


@pytest.mark.parametrize("token_scaling", [False, True])
def test_a_gradient_of_the_rows_alone_reaches_the_inputs(token_scaling, record_error):
    """An RL-style objective, sum(w * logprob) + sum(w' * entropy) with the loss unused (no loss
    gradient), with token scaling too: its scale row sits between the LSEs and the entropies and
    gets no gradient."""
    x, w, b, y = make_inputs(128, 256, 64007, torch.bfloat16, bias=True)
    y = predicted_targets(x, w, b, y)
    weights = {name: value for name, value in row_weights(y, "sum", torch.ones(())).items() if name != "lse"}
    extra = {"return_entropy": True, "return_logprob": True}
    out, ours = run(x, w, b, y, "none", None, weights, with_loss=False, token_scaling=token_scaling, **extra)
    ref, ref_grads = reference(x, w, b, y, "none", None, weights, with_loss=False)
    assert_outputs(out, ref, y, "none", torch.bfloat16, extra, record_error)
    assert_gradients(ours, ref_grads, torch.bfloat16, record_error)


@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float32], ids=["bf16", "fp32"])
def test_argmax_ties_give_the_lowest_index(dtype):
    """Two groups of classes in different tiles of the vocabulary (64006 in the last, edge tile) tie
    exactly: their weight rows are zero but for the last hidden coordinate, so their logits are
    exact in any order of summation. Group {3, 40000, 64006} has logit 100 (its bias) for every
    token, group {40001, 40002, 7} 200 for the odd tokens (x[:, -1] = 1) and 0 for the even ones:
    predicted is 7 for odd tokens and 3 for even ones, the lowest index of the winning group."""
    x, w, b, y = make_inputs(96, 256, 64007, dtype, bias=True, ignore="none")
    x, w, b = x.clone(), w.clone(), b.clone()
    first, second = [3, 40000, 64006], [40001, 40002, 7]
    odd = torch.arange(96, device=x.device) % 2 == 1
    x[:, -1] = odd.to(dtype)
    w[first + second] = 0.0
    w[second, -1] = 200.0
    b[first], b[second] = 100.0, 0.0
    out = lfce.linear_cross_entropy(x, w, y, b, reduction="none", return_predicted=True, return_accuracy=True)
    expected = torch.where(odd, 7, 3)
    assert torch.equal(out.predicted, expected), (
        f"ties resolved to {torch.unique(out.predicted).tolist()}, expected the lowest indices 3 and 7")
    y = expected.clone()
    y[::4] = 40000  # a tied class that is not the lowest is no hit
    out = lfce.linear_cross_entropy(x, w, y, b, reduction="none", return_accuracy=True)
    assert torch.equal(out.accuracy, (y == expected).float())


@pytest.mark.parametrize("mode", ["recompute", "eager"])
def test_extra_outputs_are_deterministic_and_independent_of_the_vocab_chunk(mode):
    """Two runs agree bit for bit: every output and every gradient. With a narrower vocab chunk
    (chunk_size 256 instead of the plan's) the outputs and grad_weight, grad_bias are bit-identical
    (each is computed whole inside one chunk) and grad_hidden within fp32 reassociation."""
    x, w, b, y = make_inputs(160, 256, 64007, torch.bfloat16, bias=True)
    y = predicted_targets(x, w, b, y, 3.0, 1.7)
    grad = upstream("sum", (), torch.bfloat16)
    weights = row_weights(y, "sum", grad)
    options = {"softcap": 3.0, "temperature": 1.7, "z_loss_scale": 1e-3, "return_z_loss": True, **EVERY_OUTPUT}
    first, first_grads = run(x, w, b, y, "sum", grad, weights, mode=mode, **options)
    again, again_grads = run(x, w, b, y, "sum", grad, weights, mode=mode, **options)
    for name in lfce.LossOutput._fields:
        assert_bitwise_equal(name, getattr(again, name), getattr(first, name))
    for name, a, e in zip(("grad_hidden", "grad_weight", "grad_bias"), again_grads, first_grads):
        assert_bitwise_equal(name, a, e)
    chunked, chunked_grads = run(x, w, b, y, "sum", grad, weights, mode=mode, chunk_size=256, **options)
    for name in lfce.LossOutput._fields:
        assert_bitwise_equal(name, getattr(chunked, name), getattr(first, name))
    assert_bitwise_equal("grad_weight", chunked_grads[1], first_grads[1])
    assert_bitwise_equal("grad_bias", chunked_grads[2], first_grads[2])
    assert rel_l2(chunked_grads[0], first_grads[0]) < 1e-2


def test_predicted_and_accuracy_work_with_float16_and_the_rows_are_refused():
    x, w, b, y = make_inputs(64, 256, 5000, torch.float16)
    y = predicted_targets(x, w, b, y)
    out = lfce.linear_cross_entropy(x, w, y, return_predicted=True, return_accuracy=True)
    u = F.linear(x.double(), w.double())
    assert_predicted(out.predicted, u, y)
    assert 0 < float(out.accuracy) <= 1
    for name in ROWS:
        with pytest.raises(ValueError, match=f"return_{name} is not supported with torch.float16 inputs"):
            lfce.linear_cross_entropy(x, w, y, **{f"return_{name}": True})
