"""The extra per-token outputs without a GPU (PyTorch 2.4+; skipped before, failed in ctest's
python.cpu.torch): return_lse, return_entropy, return_logprob, return_accuracy and return_predicted
through the Python layer and the operators on CPU tensors (lfce's CPU implementation,
python/lfce/_cpu.py), called eagerly and under torch.compile(fullgraph=True), against an fp64 reference
written here from the definitions (u = softcap-capped logits / T):

    lse = logsumexp(u), entropy = -sum_v p_v log p_v with p = softmax(u), logprob = log_softmax(u)[y]
    (0 for ignored tokens), predicted = argmax u (-1 for ignored tokens), accuracy = [predicted == y]
    over the counted tokens (Liger-Kernel's return_token_accuracy),

differentiated by autograd: the gradients of loss * g + sum(w1 * lse + w2 * entropy + w3 * logprob)
with random per-token weights w, elementwise. Also: the named tuple, argument checks with their
messages, the fallback of mode "eager", shift, ties in the argmax, opcheck of the new schemas and
that the distributed module takes every option. The GPU side is test_gpu_extra_outputs.py.
"""

import logging
import re

import pytest
import torch
import torch.nn.functional as F
from conftest import missing_dependency

from lfce import _cpu, _lib, _ops

if not _ops.HAVE_CUSTOM_OPS:
    pytest.skip(missing_dependency(f"torch {torch.__version__} has no torch.library.custom_op (PyTorch 2.4+): "
                                   "lfce runs through torch.autograd.Function there"), allow_module_level=True)

import torch._dynamo.testing
from cpu_model import inputs
from torch._subclasses.fake_tensor import FakeTensorMode

import lfce
import lfce.distributed
from lfce import functional
from lfce.compat import liger

REDUCTIONS = ["mean", "sum", "none"]
IGNORE = -100
ROWS = ("lse", "entropy", "logprob")  # the differentiable outputs, rows of the operator's lse
# The CPU model's fp32 against fp64 over these cases (N = 9, V = 40, logits of a few units, up to
# 30 / T): the loss and the outputs within 1e-6 relative, except where the entropy is the small
# difference LSE - sum_v p_v u_v (as lfce computes it): there an absolute error up to 5e-6, 2e-7 of
# the largest LSE; gradients within 2e-6 of the largest gradient, except through the entropy at
# T = 0.6 (a peaked softmax): its S = LSE - H in fp32 is off by 2^-24 |LSE|, which p_v (u_v - S)
# carries into every gradient, up to 1.2e-5 of the largest. About 2.5x those:
VALUE_TOL = {"rtol": 2.5e-6, "atol": 1e-6}
ENTROPY_ATOL_OF_MAX_LSE = 5e-7
GRAD_RTOL, GRAD_ATOL_OF_MAX = 2e-5, 3e-5


def raises(exception, *fragments):
    """pytest.raises matching every fragment literally, in order."""
    return pytest.raises(exception, match=".*".join(re.escape(f) for f in fragments))


def reference(x, w, b, y, softcap=None, temperature=1.0, ignore_index=IGNORE):
    """fp64 {loss per token, lse, entropy, logprob, predicted} of the logits the softmax sees, from the
    definitions; differentiable w.r.t. x, w, b (fp64 leaves in the caller's graph)."""
    logits = F.linear(x.reshape(-1, x.shape[-1]), w, b)
    if softcap is not None:
        logits = softcap * torch.tanh(logits / softcap)
    u = logits / temperature
    targets = y.reshape(-1)
    counted = targets != ignore_index
    log_p = F.log_softmax(u, dim=-1)
    picked = log_p.gather(1, torch.where(counted, targets, 0)[:, None])[:, 0]
    return {
        "loss": F.cross_entropy(u, targets, ignore_index=ignore_index, reduction="none"),
        "lse": torch.logsumexp(u, dim=-1),
        "entropy": -(log_p.exp() * log_p).sum(-1),
        "logprob": torch.where(counted, picked, torch.zeros_like(picked)),
        "predicted": torch.where(counted, u.argmax(-1), torch.full_like(targets, -1)),
    }


def assert_grad_close(name, ours, theirs):
    torch.testing.assert_close(ours.double(), theirs, rtol=GRAD_RTOL, atol=GRAD_ATOL_OF_MAX * float(theirs.abs().max()),
                               msg=lambda m: f"grad_{name}: {m}")


def reduce(loss, counted, reduction):
    return {"none": loss, "sum": loss.sum(), "mean": loss.sum() / counted.sum()}[reduction]


def accuracy_reference(predicted, targets, reduction, ignore_index=IGNORE):
    counted = targets != ignore_index
    correct = ((predicted == targets) & counted).double()
    return correct if reduction == "none" else correct.sum() / counted.sum()


def leaves(x, w, b, dtype=torch.float64):
    return tuple(None if t is None else t.detach().to(dtype).requires_grad_() for t in (x, w, b))


def row_weights(shape, seed=3):
    """Random weights of each differentiable output's tokens, of either sign."""
    g = torch.Generator().manual_seed(seed)
    return {name: torch.randn(shape, generator=g) for name in ROWS}


# name: (extra outputs asked for, softcap, temperature); every case has ignored tokens.
CASES = {
    "lse": ({"return_lse": True}, None, 1.0),
    "entropy": ({"return_entropy": True}, None, 1.0),
    "logprob": ({"return_logprob": True}, None, 1.0),
    "accuracy": ({"return_accuracy": True}, None, 1.0),
    "predicted": ({"return_predicted": True}, None, 1.0),
    "temperature_entropy": ({"return_entropy": True}, None, 0.6),
    "softcap_entropy": ({"return_entropy": True}, 3.0, 1.0),
    "together": ({"return_lse": True, "return_logprob": True, "return_accuracy": True, "return_predicted": True},
                 None, 1.0),
    "every_output_softcap_temperature": ({name: True for name in functional.EXTRA_OUTPUTS}, 3.0, 1.7),
}


def batch_inputs(seed=0):
    """inputs(9) with a bias, as a [3, 3] batch, logits of a few units (every third target ignored)."""
    x, w, b, y = inputs(9, bias=True, seed=seed)
    w.data *= 4
    return x.detach().reshape(3, 3, -1).requires_grad_(), w, b, y.reshape(3, 3)


def assert_outputs_match(out, ref, extra, y, reduction):
    """Each field of the LossOutput against the reference: None where not asked for, shaped like y."""
    asked = {name[len("return_"):] for name, value in extra.items() if value}
    for name in ROWS:
        value = getattr(out, name)
        if name not in asked:
            assert value is None, f"{name} was not asked for"
            continue
        assert value.dtype == torch.float32 and value.shape == y.shape, (name, value.dtype, value.shape)
        tol = dict(VALUE_TOL)
        if name == "entropy":
            tol["atol"] = max(tol["atol"], ENTROPY_ATOL_OF_MAX_LSE * float(ref["lse"].detach().abs().max()))
        torch.testing.assert_close(value.double(), ref[name].detach().reshape(y.shape), **tol,
                                   msg=lambda m, name=name: f"{name}: {m}")
    if "predicted" in asked:
        assert out.predicted.dtype == torch.int64 and out.predicted.shape == y.shape
        assert torch.equal(out.predicted, ref["predicted"].reshape(y.shape))
    else:
        assert out.predicted is None
    if "accuracy" in asked:
        expected = accuracy_reference(ref["predicted"].reshape(y.shape), y, reduction)
        assert out.accuracy.dtype == torch.float32 and out.accuracy.shape == expected.shape
        torch.testing.assert_close(out.accuracy.double(), expected, rtol=1e-7, atol=0)
        assert not out.accuracy.requires_grad
    else:
        assert out.accuracy is None


@pytest.mark.parametrize("case", list(CASES))
@pytest.mark.parametrize("reduction", REDUCTIONS)
@pytest.mark.parametrize("compiled", [False, True], ids=["eager_call", "compiled"])
@pytest.mark.parametrize("mode", ["recompute", "eager"])
def test_extra_outputs_and_their_gradients_match_an_fp64_reference(mode, compiled, reduction, case):
    extra, softcap, temperature = CASES[case]

    def call(x, w, b, y):
        return lfce.linear_cross_entropy(x, w, y, b, reduction=reduction, mode=mode, softcap=softcap,
                                         temperature=temperature, **extra)

    if compiled:
        torch._dynamo.reset()  # one code object, many sets of closure values: past the recompile limit
    fn = torch.compile(call, backend="aot_eager", fullgraph=True) if compiled else call
    x, w, b, y = batch_inputs()
    out = fn(x, w, b, y)
    assert isinstance(out, lfce.LossOutput) and out.z_loss is None
    grad = torch.linspace(0.5, 2.0, 9).reshape(3, 3) if reduction == "none" else torch.tensor(1.5)
    weights = row_weights(y.shape)
    asked = [name for name in ROWS if extra.get(f"return_{name}")]
    torch.autograd.backward([out.loss] + [getattr(out, name) for name in asked],
                            [grad] + [weights[name] for name in asked])

    xr, wr, br = leaves(x, w, b)
    ref = reference(xr, wr, br, y, softcap, temperature)
    counted = y.reshape(-1) != IGNORE
    ref_loss = reduce(ref["loss"], counted, reduction)
    ref_loss = ref_loss.reshape(y.shape) if reduction == "none" else ref_loss
    torch.testing.assert_close(out.loss.double(), ref_loss.detach(), **VALUE_TOL)
    assert_outputs_match(out, ref, extra, y, reduction)
    objective = (ref_loss * grad.double()).sum()
    loss_only = torch.autograd.grad(objective, wr, retain_graph=True)[0]
    extra_terms = sum((ref[name].reshape(y.shape) * weights[name].double()).sum() for name in asked)
    (objective + extra_terms).backward()
    for name, ours, theirs in (("hidden", x, xr), ("weight", w, wr), ("bias", b, br)):
        assert_grad_close(name, ours.grad, theirs.grad)
    if asked:  # the outputs' own terms move the gradient far past the tolerance
        gap = float((loss_only - wr.grad).abs().max() / wr.grad.abs().max())
        assert gap > 100 * GRAD_ATOL_OF_MAX, f"the outputs' gradients barely change grad_weight ({gap:.3g})"


@pytest.mark.parametrize("compiled", [False, True], ids=["eager_call", "compiled"])
@pytest.mark.parametrize("token_scaling", [False, True])
def test_a_gradient_of_the_outputs_alone_reaches_the_inputs(compiled, token_scaling):
    """Backward from the entropy and logprob alone (the loss unused: no loss gradient), with token
    scaling too (its scale row sits between the LSEs and the entropies and gets no gradient)."""
    def call(x, w, y):
        return lfce.linear_cross_entropy(x, w, y, reduction="none", token_scaling=token_scaling, return_entropy=True,
                                         return_logprob=True)

    if compiled:
        torch._dynamo.reset()
    fn = torch.compile(call, backend="aot_eager", fullgraph=True) if compiled else call
    x, w, _, y = inputs(9)
    w.data *= 4
    out = fn(x, w, y)
    weights = row_weights(y.shape)
    (out.entropy * weights["entropy"] + out.logprob * weights["logprob"]).sum().backward()
    xr, wr, _ = leaves(x, w, None)
    ref = reference(xr, wr, None, y)
    assert_outputs_match(out, ref, {"return_entropy": True, "return_logprob": True}, y, "none")
    (ref["entropy"] * weights["entropy"].double() + ref["logprob"] * weights["logprob"].double()).sum().backward()
    assert_grad_close("hidden", x.grad, xr.grad)
    assert_grad_close("weight", w.grad, wr.grad)


@pytest.mark.parametrize("reduction", REDUCTIONS)
@pytest.mark.parametrize("compiled", [False, True], ids=["eager_call", "compiled"])
def test_with_shift_each_output_belongs_to_its_position_of_hidden(compiled, reduction):
    """shift=True: position t scored against target t + 1; the last position of each sequence is an
    ignored token (lse and entropy real, logprob 0, predicted -1), the others match the reference
    of the shifted targets."""
    def call(x, w, y):
        return lfce.linear_cross_entropy(x, w, y, reduction=reduction, shift=True,
                                         **{name: True for name in functional.EXTRA_OUTPUTS})

    if compiled:
        torch._dynamo.reset()
    fn = torch.compile(call, backend="aot_eager", fullgraph=True) if compiled else call
    b_, t_ = 3, 5
    x, w, _, y = inputs(b_ * t_)
    w.data *= 4
    x, y = x.detach().reshape(b_, t_, -1).requires_grad_(), y.reshape(b_, t_)
    out = fn(x, w, y)
    shifted = torch.cat([y[:, 1:], torch.full((b_, 1), IGNORE)], dim=1)
    xr, wr, _ = leaves(x, w, None)
    ref = reference(xr, wr, None, shifted)
    assert_outputs_match(out, ref, {name: True for name in functional.EXTRA_OUTPUTS}, shifted, reduction)
    assert torch.all(out.predicted[:, -1] == -1) and torch.all(out.logprob[:, -1] == 0)
    assert torch.all(out.lse[:, -1] > 0) and torch.all(out.entropy[:, -1] > 0)
    weights = row_weights(y.shape)
    sum(getattr(out, name) * weights[name] for name in ROWS).sum().backward()
    sum(ref[name].reshape(b_, t_) * weights[name].double() for name in ROWS).sum().backward()
    assert_grad_close("hidden", x.grad, xr.grad)
    assert_grad_close("weight", w.grad, wr.grad)


@pytest.mark.parametrize("reduction", REDUCTIONS)
def test_shift_hands_the_operator_the_targets_in_place(monkeypatch, reduction):
    """shift=True passes targets itself (same storage: no shifted copy) with the sequence length,
    and the z-loss computed outside the kernels counts the positions that have a next target."""
    seen = []
    forward = _cpu.forward

    def recording(*args):
        seen.append((args[3].data_ptr(), args[3].shape, args[21]))
        return forward(*args)

    monkeypatch.setattr(_cpu, "forward", recording)
    b_, t_ = 2, 6
    x, w, _, y = inputs(b_ * t_)
    x, y = x.detach().reshape(b_, t_, -1), y.reshape(b_, t_)
    loss, z_loss = lfce.linear_cross_entropy(x, w, y, reduction=reduction, shift=True, z_loss_scale=0.1,
                                             return_z_loss=True)
    assert seen == [(y.data_ptr(), (b_ * t_,), t_)]
    shifted = torch.cat([y[:, 1:], torch.full((b_, 1), IGNORE)], dim=1)
    lse = (x.double() @ w.detach().double().T).logsumexp(-1)
    counted = shifted != IGNORE
    term = torch.where(counted, 0.1 * lse * lse, torch.zeros_like(lse))
    expected = {"none": term, "sum": term.sum(), "mean": term.sum() / counted.sum()}[reduction]
    assert torch.allclose(z_loss.double(), expected, rtol=1e-5, atol=1e-6)
    plain = lfce.linear_cross_entropy(x, w, shifted, reduction=reduction, z_loss_scale=0.1)
    assert torch.allclose(loss, plain, rtol=1e-6, atol=1e-6)


def test_argmax_ties_give_the_lowest_index():
    """Classes 7 and 3 share one weight row, the largest logit of every token: predicted is 3."""
    x, w, _, y = inputs(6, v=12)
    w = w.detach().clone()
    w[3] = w[7] = x.detach().mean(0) * 40
    y = torch.tensor([3, 7, IGNORE, 3, 7, 0])
    out = lfce.linear_cross_entropy(x, w, y, reduction="none", return_predicted=True, return_accuracy=True)
    assert F.linear(x.detach(), w).argmax(-1).tolist() == [3] * 6, "the case lost its tie"
    assert out.predicted.tolist() == [3, 3, -1, 3, 3, 3]
    assert out.accuracy.tolist() == [1.0, 0.0, 0.0, 1.0, 0.0, 0.0]


def test_accuracy_over_the_counted_tokens_as_liger_kernel_has_it():
    """"mean" and "sum" both give the mean over the counted tokens; an ignore_index of -1 (the
    predicted id of an ignored token) counts no ignored token as correct; NaN when none is counted."""
    x, w, _, y = inputs(9)
    predicted = lfce.linear_cross_entropy(x, w, y, return_predicted=True).predicted
    y = torch.where(torch.arange(9) % 2 == 0, predicted, y)  # some targets predicted
    y[::3] = -1
    counted = y != -1
    expected = float(((predicted == y) & counted).sum()) / float(counted.sum())
    assert 0 < expected < 1
    for reduction in ("mean", "sum"):
        out = lfce.linear_cross_entropy(x, w, y, ignore_index=-1, reduction=reduction, return_accuracy=True)
        assert out.accuracy.shape == () and float(out.accuracy) == pytest.approx(expected, rel=1e-6)
    per_token = lfce.linear_cross_entropy(x, w, y, ignore_index=-1, reduction="none", return_accuracy=True).accuracy
    assert per_token.tolist() == ((predicted == y) & counted).float().tolist()
    none_counted = torch.full((9,), -1)
    assert torch.isnan(lfce.linear_cross_entropy(x, w, none_counted, ignore_index=-1, return_accuracy=True).accuracy)


def test_logprob_of_a_target_outside_the_vocabulary_is_nan():
    x, w, _, y = inputs(6)
    y = y.clone()
    y[1] = 40  # V = 40
    out = lfce.linear_cross_entropy(x.detach(), w.detach(), y, reduction="none", return_logprob=True)
    assert torch.isnan(out.logprob[1]) and not torch.isnan(out.logprob[torch.arange(6) != 1]).any()


# --- the return value ---------------------------------------------------------------------------------

def test_loss_output_names_its_fields_in_order():
    assert lfce.LossOutput._fields == ("loss", "z_loss", "lse", "entropy", "logprob", "accuracy", "predicted")
    assert lfce.LossOutput(torch.tensor(1.0)).predicted is None


def test_without_extra_outputs_the_return_value_is_unchanged():
    x, w, _, y = inputs(6)
    assert isinstance(lfce.linear_cross_entropy(x, w, y), torch.Tensor)
    loss, z_loss = lfce.linear_cross_entropy(x, w, y, z_loss_scale=0.1, return_z_loss=True)
    assert not isinstance(lfce.linear_cross_entropy(x, w, y, z_loss_scale=0.1, return_z_loss=True), lfce.LossOutput)
    out = lfce.linear_cross_entropy(x, w, y, z_loss_scale=0.1, return_z_loss=True, return_lse=True)
    assert torch.equal(out.loss, loss) and torch.equal(out.z_loss, z_loss)
    assert lfce.linear_cross_entropy(x, w, y, z_loss_scale=0.1, return_lse=True).z_loss is None


def test_module_passes_the_extra_outputs_and_names_them_in_its_repr():
    x, w, _, y = inputs(6)
    module = lfce.LinearCrossEntropyLoss(reduction="none", return_entropy=True, return_predicted=True)
    assert "return_entropy=True" in repr(module) and "return_predicted=True" in repr(module)
    assert "return_lse" not in repr(module)
    got = module(x, w, y)
    expected = lfce.linear_cross_entropy(x, w, y, reduction="none", return_entropy=True, return_predicted=True)
    assert torch.equal(got.entropy, expected.entropy) and torch.equal(got.predicted, expected.predicted)
    assert got.lse is None and got.accuracy is None


@pytest.mark.parametrize("reduction", REDUCTIONS)
def test_liger_kernels_accuracy_and_predicted_tokens_are_lfces(reduction):
    x, w, b, y = inputs(9, bias=True)
    expected = lfce.linear_cross_entropy(x, w, y, b, reduction=reduction, return_accuracy=True, return_predicted=True)
    for got in (liger.liger_fused_linear_cross_entropy(x, w, y, b, reduction=reduction, return_token_accuracy=True,
                                                       return_predicted_tokens=True),
                liger.LigerFusedLinearCrossEntropyLoss(reduction=reduction, return_token_accuracy=True,
                                                       return_predicted_tokens=True)(w, x, y, b)):
        assert isinstance(got, liger.CrossEntropyOutput) and got.z_loss is None
        assert torch.equal(got.loss, expected.loss) and torch.equal(got.token_accuracy, expected.accuracy)
        assert torch.equal(got.predicted_tokens, expected.predicted)


# --- modes and the operators -----------------------------------------------------------------------------

def spy_on_forward(monkeypatch):
    """The mode and outputs each lfce::forward call gets."""
    seen = []
    forward = _ops.forward
    monkeypatch.setattr(_ops, "forward", lambda args: seen.append((args.mode, args.outputs)) or forward(args))
    return seen


def test_eager_mode_with_a_differentiable_output_recomputes_and_says_so_once(monkeypatch, caplog):
    seen = spy_on_forward(monkeypatch)
    monkeypatch.setattr(functional, "_logged_once", set())
    x, w, _, y = inputs(6)
    with caplog.at_level(logging.INFO, logger="lfce"):
        for name in ("return_lse", "return_entropy", "return_logprob"):
            lfce.linear_cross_entropy(x, w, y, mode="eager", **{name: True})
    assert [mode for mode, _ in seen] == ["recompute"] * 3
    messages = [r.getMessage() for r in caplog.records if "return_entropy" in r.getMessage()]
    expected = ("lfce: mode 'eager' computes the gradients before those of lse, entropy and logprob are known; "
                "return_lse, return_entropy and return_logprob use 'recompute'")
    assert messages == [expected]


def test_eager_mode_keeps_eager_for_accuracy_and_predicted(monkeypatch):
    seen = spy_on_forward(monkeypatch)
    x, w, _, y = inputs(6)
    lfce.linear_cross_entropy(x, w, y, mode="eager", return_accuracy=True)
    lfce.linear_cross_entropy(x, w, y, mode="eager", return_predicted=True)
    assert seen == [("eager", _lib.OUTPUT_PREDICTED)] * 2


@pytest.mark.parametrize("extra, outputs", [
    ({}, 0), ({"return_lse": True}, 0), ({"return_entropy": True}, _lib.OUTPUT_ENTROPY),
    ({"return_logprob": True}, _lib.OUTPUT_LOGPROB), ({"return_accuracy": True}, _lib.OUTPUT_PREDICTED),
    ({"return_predicted": True, "return_accuracy": True}, _lib.OUTPUT_PREDICTED),
    ({name: True for name in functional.EXTRA_OUTPUTS}, 7)])
def test_each_output_asks_the_operator_for_its_flag(monkeypatch, extra, outputs):
    seen = spy_on_forward(monkeypatch)
    lfce.linear_cross_entropy(*(inputs(6)[i] for i in (0, 1, 3)), **extra)
    assert seen[0][1] == outputs


def output_options(outputs):
    """The LossOptions keywords asking for the extra outputs of lfce.h's OUTPUT_* flags ``outputs``."""
    return {"return_entropy": bool(outputs & _lib.OUTPUT_ENTROPY), "return_logprob": bool(outputs & _lib.OUTPUT_LOGPROB),
            "return_predicted": bool(outputs & _lib.OUTPUT_PREDICTED)}


def fake_forward(outputs, token_scaling=False, mode="recompute", reduction="mean", n=7):
    with FakeTensorMode():
        x, w, y = torch.empty(n, 64), torch.empty(100, 64), torch.empty(n, dtype=torch.int64)
        options = lfce.LossOptions(ignore_index=IGNORE, reduction=reduction, mode=mode, token_scaling=token_scaling,
                                   **output_options(outputs))
        out = torch.ops.lfce.forward(*_ops.forward_inputs(x, w, None, y, options, wanted=(True, True, False)))
    return [(tuple(t.shape), t.dtype) for t in out]


@pytest.mark.parametrize("outputs, token_scaling, rows", [(0, False, 1), (1, False, 2), (2, False, 2), (3, False, 3),
                                                          (3, True, 4), (4, False, 1), (7, True, 4)])
def test_fake_forward_gives_one_lse_row_per_output_and_the_predicted_ids(outputs, token_scaling, rows):
    out = fake_forward(outputs, token_scaling)
    assert out[1] == ((rows * 7,), torch.float32)
    assert out[6] == ((7,) if outputs & _lib.OUTPUT_PREDICTED else (0,), torch.int64)


@pytest.mark.parametrize("outputs", [0, _lib.OUTPUT_PREDICTED, _lib.OUTPUT_ENTROPY, _lib.OUTPUT_LOGPROB])
def test_fake_forward_computes_eager_gradients_unless_a_row_needs_a_later_gradient(outputs):
    out = fake_forward(outputs, mode="eager")
    eager = not outputs & (_lib.OUTPUT_ENTROPY | _lib.OUTPUT_LOGPROB)
    assert out[3] == ((7, 64) if eager else (0,), torch.float32)


def test_operator_schemas_take_the_outputs_the_lse_gradient_and_the_sequence_length():
    forward = torch.ops.lfce.forward.default._schema
    backward = torch.ops.lfce.backward.default._schema
    assert [a.name for a in forward.arguments][-2:] == ["outputs", "sequence_length"] and len(forward.returns) == 7
    assert [a.name for a in backward.arguments][-3:] == ["grad_lse", "outputs", "sequence_length"]
    assert [str(a.default_value) for a in forward.arguments[-2:]] == ["0", "0"]
    assert backward.arguments[-3].default_value is None
    assert [str(a.default_value) for a in backward.arguments[-2:]] == ["0", "0"]


@pytest.mark.parametrize("token_scaling", [False, True])
@pytest.mark.parametrize("reduction", REDUCTIONS)
@pytest.mark.parametrize("mode", ["recompute", "eager"])
def test_opcheck_passes_with_every_output(mode, reduction, token_scaling):
    x, w, b, y = inputs(6, bias=True)
    options = lfce.LossOptions(ignore_index=IGNORE, reduction=reduction, mode=mode, softcap=3.0, temperature=0.7,
                               z_loss_scale=1e-2, token_scaling=token_scaling, **output_options(_lib.OUTPUTS_ALL))
    args = _ops.forward_inputs(x, w, b, y, options, wanted=(True, True, True))
    torch.library.opcheck(torch.ops.lfce.forward.default, tuple(args))
    fwd = torch.ops.lfce.forward(*(a.detach() if isinstance(a, torch.Tensor) else a for a in args))
    grad = torch.ones(6 if reduction == "none" else 1)
    grad_lse = torch.randn(fwd[1].shape, generator=torch.Generator().manual_seed(4))
    backward = _ops._backward_inputs(_ops.forward_inputs(x.detach(), w.detach(), b.detach(), y, options,
                                                         wanted=(True, False, True)),
                                     lse=fwd[1], valid_count=fwd[2], grad_loss=grad, grad_lse=grad_lse)
    torch.library.opcheck(torch.ops.lfce.backward.default, tuple(backward))


def test_compiled_extra_outputs_compile_once_for_two_token_counts():
    counter = torch._dynamo.testing.CompileCounterWithBackend("aot_eager")
    fn = torch.compile(lambda x, w, y: lfce.linear_cross_entropy(x, w, y, return_entropy=True, return_accuracy=True),
                       backend=counter, fullgraph=True, dynamic=True)
    for n in (10, 13):
        x, w, _, y = inputs(n, seed=n)
        out = fn(x, w, y)
        (out.loss + out.entropy.sum()).backward()
    assert counter.frame_count == 1, f"{counter.frame_count} compilations for two values of N"


def test_backward_operator_refuses_an_lse_gradient_it_would_misread():
    x, y = torch.randn(4, 16), torch.zeros(4, dtype=torch.int64)
    with raises(ValueError, "lse must hold 12 values for 4 tokens with token_scaling=False and outputs=3", "got 8"):
        _ops._check_lse(x, torch.zeros(8), None, False, 3)
    with raises(ValueError, "grad_lse must be torch.float32 with 8 values, like lse, got torch.float32 with 4"):
        _ops._check_lse(x, torch.zeros(8), torch.zeros(4), False, 1)
    with raises(ValueError, "grad_lse must be torch.float32", "got torch.bfloat16 with 8"):
        _ops._check_lse(x, torch.zeros(8), torch.zeros(8, dtype=torch.bfloat16), False, 1)
    with raises(ValueError, "grad_lse", "is not supported with torch.float16 inputs"):
        _ops._check_lse(x.half(), torch.zeros(8), torch.zeros(8), False, 1)
    _ops._check_lse(x, torch.zeros(8), torch.zeros(8), False, 1)
    del y


# --- misuse ------------------------------------------------------------------------------------------------

@pytest.mark.parametrize("name", functional.EXTRA_OUTPUTS)
def test_an_extra_output_flag_must_be_a_bool(name):
    x, w, _, y = inputs(4)
    with raises(TypeError, f"{name} must be a bool, got int 1"):
        lfce.linear_cross_entropy(x, w, y, **{name: 1})


@pytest.mark.parametrize("name", functional.EXTRA_OUTPUTS)
def test_the_module_checks_an_extra_output_flag_at_construction(name):
    with raises(TypeError, f"{name} must be a bool, got str 'yes'"):
        lfce.LinearCrossEntropyLoss(**{name: "yes"})


@pytest.mark.parametrize("name", ["return_lse", "return_entropy", "return_logprob"])
def test_a_differentiable_output_is_refused_with_float16_naming_the_option_and_the_dtype(name):
    x, w, _, y = inputs(4, dtype=torch.float16)
    with raises(ValueError, f"{name} is not supported with torch.float16 inputs", "use torch.bfloat16 or torch.float32"):
        lfce.linear_cross_entropy(x, w, y, **{name: True})


def test_accuracy_and_predicted_work_with_float16():
    x, w, _, y = inputs(6)
    expected = lfce.linear_cross_entropy(x, w, y, return_predicted=True).predicted
    out = lfce.linear_cross_entropy(x.half(), w.half(), y, return_predicted=True, return_accuracy=True)
    assert out.predicted.dtype == torch.int64 and out.accuracy.dtype == torch.float32
    agree = (out.predicted == expected).float().mean()
    assert agree >= 0.8, "fp16 rounding moved most argmaxes"


@pytest.mark.parametrize("name, value", [("label_smoothing", 0.1), ("token_scaling", True), ("shift", True)])
def test_distributed_takes_every_loss_option(name, value):
    """Every loss option is combined across the ranks (test_distributed.py runs each over gloo)."""
    options = lfce.LossOptions(**{name: value})
    assert lfce.distributed.VocabParallelLinearCrossEntropyLoss(options=options).options == options


@pytest.mark.parametrize("name", [*functional.EXTRA_OUTPUTS, "return_z_loss"])
def test_distributed_takes_every_extra_output_but_checks_it_is_a_bool(name):
    module = lfce.distributed.VocabParallelLinearCrossEntropyLoss(**{name: True})
    assert getattr(module.options, name) is True
    x, w, _, y = inputs(4)
    with raises(TypeError, f"{name} must be a bool, got int 1"):
        lfce.distributed.linear_cross_entropy(x, w, y, **{name: 1})
