"""lfce on CPU tensors (python/lfce/_cpu.py): every loss option, reduction and extra output, in bf16,
fp16, fp32 and fp64, against an fp64 reference written here from the definitions with plain torch
(the whole [N, V] logits, F.cross_entropy, autograd), independent of _cpu.py:

    u = c * tanh(z / c) (with a softcap c), then u / T;
    loss = F.cross_entropy(u, y, weight=w, label_smoothing=eps, ignore_index, reduction="none")
           + s * logsumexp(u)**2 per counted token, each times its detached p(target) with token
           scaling, then reduced ("mean": the cross-entropy over the sum of w_y, the z-loss over the
           count); lse, entropy, logprob, predicted of u;

differentiated by autograd through loss * g + sum(r1 * lse + r2 * entropy + r3 * logprob) with random
upstream g and r. The vocabulary is cut into chunks of 64 (the last one partial) so that the online
log-sum-exp and the per-chunk backward are exercised. Elementwise, per row and relative L2
(checks.assert_close) at tolerances about 2x the error measured here. Also: the operator outputs
against the unchunked model (cpu_model.py), eager mode as the same function as recompute mode, the
library's own check on CPU calls, fp64 through torch.compile, and the largest tensor a V = 128256
call creates (no [N, V] tensor, one [N, chunk] at most).
"""

import ctypes
import math

import pytest
import torch
import torch.nn.functional as F
from checks import Tolerance, assert_close, make_inputs, shifted_problem
from cpu_model import backward_cpu, forward_cpu

import lfce
from lfce import _cpu, _lib, _ops
from lfce.compat import cce, liger
from lfce.compat import torch as lfce_torch

IGNORE = -100
N, H, V, CHUNK = 37, 32, 203, 64
REDUCTIONS = ["mean", "sum", "none"]
MODES = ["recompute", "eager"]
DTYPES = [torch.bfloat16, torch.float16, torch.float32, torch.float64]

# name: the loss options of the case (bias among them)
CASES = {
    "plain": {},
    "bias": {"bias": True},
    "softcap": {"softcap": 3.0, "bias": True},
    "temperature": {"temperature": 0.6},
    "z_loss": {"z_loss_scale": 0.05},
    "label_smoothing": {"label_smoothing": 0.1},
    "class_weight": {"class_weight": True},
    "smoothing_class_weight": {"label_smoothing": 0.2, "class_weight": True, "bias": True},
    "token_scaling": {"token_scaling": True},
    "all": {"softcap": 3.0, "temperature": 1.7, "z_loss_scale": 0.2, "label_smoothing": 0.1, "class_weight": True,
            "token_scaling": True, "bias": True},
}
FP16_REFUSES = ("z_loss_scale", "class_weight")  # lfce's fp16 gradient scaling (ValueError), as on CUDA

# The CPU path against the fp64 reference over every test below (N = 37, H = 32, V = 203, logits of
# std 2.5), worst of all cases, reductions and modes, torch 2.11 and 1.13, measured with rtol = atol
# (atol a fraction of the largest |expected|):
#   loss, lse, entropy, logprob: rel L2 / elementwise: fp64 1.4e-15 / 1.8e-15; fp32 9e-7 / 1.6e-6;
#     bf16 6.9e-7 / 1e-6; fp16 2.7e-7 / 1.6e-7 (fp32 accumulation; the reference takes the
#     16-bit inputs as exact);
#   gradients, rel L2 / elementwise / per row: fp64 1.3e-15 / 1.3e-15 / 4.9e-14; fp32 1.4e-6 / 1e-6
#     / 3.3e-5; bf16 2.7e-3 / 3e-3 / 4.1e-3 (one rounding to bf16); fp16 7.1e-4 / 4e-4 / 4e-2 (rows
#     of small norm, measured against the floor).
# The tolerances are about 2x those.
LOSS_TOL = {
    torch.float64: Tolerance(rel_l2=3e-15, rtol=4e-15, atol=4e-15, row=None, row_floor=0.0),
    torch.float32: Tolerance(rel_l2=2e-6, rtol=3e-6, atol=3e-6, row=None, row_floor=0.0),
    torch.bfloat16: Tolerance(rel_l2=1.4e-6, rtol=2e-6, atol=2e-6, row=None, row_floor=0.0),
    torch.float16: Tolerance(rel_l2=6e-7, rtol=4e-7, atol=4e-7, row=None, row_floor=0.0),
}
GRAD_TOL = {
    torch.float64: Tolerance(rel_l2=3e-15, rtol=3e-15, atol=3e-15, row=1e-13, row_floor=1e-2),
    torch.float32: Tolerance(rel_l2=3e-6, rtol=2e-6, atol=2e-6, row=7e-5, row_floor=1e-2),
    torch.bfloat16: Tolerance(rel_l2=6e-3, rtol=6e-3, atol=6e-3, row=1e-2, row_floor=1e-2),
    torch.float16: Tolerance(rel_l2=1.5e-3, rtol=1e-3, atol=1e-3, row=8e-2, row_floor=1e-2),
}


def dtype_id(dtype):
    return str(dtype).replace("torch.", "")


def case_inputs(dtype, case, n=N, seed=0):
    """(hidden, weight, bias or None, targets, class_weight or None, options) on the CPU, every fifth
    target ignored; class weights in [0.5, 1.5] of the dtype."""
    options = dict(CASES[case])
    x, w, b, y = make_inputs(n, H, V, dtype, bias=options.pop("bias", False), seed=seed, device="cpu")
    class_weight = None
    if options.pop("class_weight", False):
        class_weight = (torch.rand(V, generator=torch.Generator().manual_seed(seed + 7)) + 0.5).to(dtype)
    return x, w, b, y, class_weight, options


def reference(x, w, b, y, class_weight, reduction, softcap=None, temperature=1.0, z_loss_scale=0.0,
              label_smoothing=0.0, token_scaling=False):
    """fp64 {loss, lse, entropy, logprob, predicted} from the whole logits; differentiable w.r.t. the
    fp64 leaves x, w, b (the caller's)."""
    u = F.linear(x, w, b)
    if softcap is not None:
        u = softcap * torch.tanh(u / softcap)
    u = u / temperature
    counted = y != IGNORE
    target = torch.where(counted, y, torch.zeros_like(y))
    weight = None if class_weight is None else class_weight.double()
    ce = F.cross_entropy(u, y, weight=weight, ignore_index=IGNORE, label_smoothing=label_smoothing,
                         reduction="none")
    lse = torch.logsumexp(u, dim=-1)
    zero = torch.zeros_like(lse)
    z_loss = torch.where(counted, z_loss_scale * lse * lse, zero)
    log_p = torch.log_softmax(u, dim=-1)
    logprob = torch.where(counted, log_p.gather(1, target[:, None])[:, 0], zero)
    if token_scaling:
        scale = torch.where(counted, logprob.exp(), zero).detach()
        ce, z_loss = ce * scale, z_loss * scale
    if reduction == "none":
        loss = ce + z_loss
    elif reduction == "sum":
        loss = ce.sum() + z_loss.sum()
    else:
        w_y = counted.double() if weight is None else torch.where(counted, weight[target], zero)
        loss = ce.sum() / w_y.sum() + z_loss.sum() / counted.sum()
    entropy = -(log_p.exp() * log_p).sum(-1)
    predicted = torch.where(counted, u.argmax(-1), torch.full_like(y, -1))
    return {"loss": loss, "lse": lse, "entropy": entropy, "logprob": logprob, "predicted": predicted}


def leaves(*tensors):
    return [None if t is None else t.detach().clone().requires_grad_() for t in tensors]


def upstreams(reduction, n, seed=3):
    """(g for the loss, {row: r}) of random values, fp64."""
    gen = torch.Generator().manual_seed(seed)
    g = torch.rand(() if reduction != "none" else (n,), generator=gen, dtype=torch.float64) + 0.5
    return g, {name: torch.randn(n, generator=gen, dtype=torch.float64) for name in ("lse", "entropy", "logprob")}


def run_both(dtype, case, reduction, mode, extras=False, chunk=CHUNK, n=N):
    """(lfce's {name: value}, its gradients, the reference's {name: value}, its gradients)."""
    x, w, b, y, class_weight, options = case_inputs(dtype, case, n)
    g, r = upstreams(reduction, n)
    xs, ws, bs = leaves(x, w, b)
    wanted = {f"return_{name}": True for name in ("lse", "entropy", "logprob", "predicted")} if extras else {}
    out = lfce.linear_cross_entropy(xs, ws, y, bs, reduction=reduction, mode=mode, chunk_size=chunk,
                                    class_weight=class_weight, **options, **wanted)
    ours = out._asdict() if extras else {"loss": out}
    total = (ours["loss"].double() * g).sum()
    if extras:
        total = total + sum((ours[name].double() * r[name]).sum() for name in ("lse", "entropy", "logprob"))
    total.backward()
    x64, w64, b64 = leaves(*(None if t is None else t.double() for t in (x, w, b)))
    ref = reference(x64, w64, b64, y, class_weight, reduction, **options)
    ref_total = (ref["loss"] * g).sum()
    if extras:
        ref_total = ref_total + sum((ref[name] * r[name]).sum() for name in ("lse", "entropy", "logprob"))
    ref_total.backward()
    grads = {"grad_hidden": xs.grad, "grad_weight": ws.grad, "grad_bias": None if b is None else bs.grad}
    ref_grads = {"grad_hidden": x64.grad, "grad_weight": w64.grad, "grad_bias": None if b is None else b64.grad}
    return ours, grads, ref, ref_grads


def assert_matches(dtype, ours, grads, ref, ref_grads, names=("loss",)):
    statistics = torch.float64 if dtype == torch.float64 else torch.float32
    for name in names:
        assert ours[name].dtype == statistics, f"{name}: {ours[name].dtype}, expected {statistics}"
        assert_close(name, ours[name], ref[name].detach(), LOSS_TOL[dtype])
    for name, grad in grads.items():
        if ref_grads[name] is not None:
            assert grad.dtype == dtype, f"{name}: {grad.dtype}, expected the input's {dtype}"
            assert_close(name, grad, ref_grads[name], GRAD_TOL[dtype])


# --- every option, reduction and dtype ------------------------------------------------------------

@pytest.mark.parametrize("case", CASES)
@pytest.mark.parametrize("dtype", DTYPES, ids=dtype_id)
@pytest.mark.parametrize("reduction", REDUCTIONS)
@pytest.mark.parametrize("mode", MODES)
def test_matches_the_fp64_reference(mode, reduction, dtype, case):
    if dtype == torch.float16 and any(name in CASES[case] for name in FP16_REFUSES):
        pytest.skip("refused with float16 inputs (test_float16_refuses_what_the_library_refuses)")
    assert_matches(dtype, *run_both(dtype, case, reduction, mode))


@pytest.mark.parametrize("case", ["plain", "softcap", "temperature", "all"])
@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float32, torch.float64], ids=dtype_id)
@pytest.mark.parametrize("reduction", REDUCTIONS)
def test_extra_outputs_and_their_gradients_match_the_fp64_reference(reduction, dtype, case):
    ours, grads, ref, ref_grads = run_both(dtype, case, reduction, "recompute", extras=True)
    assert_matches(dtype, ours, grads, ref, ref_grads, names=("loss", "lse", "entropy", "logprob"))
    assert torch.equal(ours["predicted"], ref["predicted"]), "predicted ids differ from the fp64 argmax"


@pytest.mark.parametrize("dtype", [torch.float32, torch.float64], ids=dtype_id)
def test_fp64_reference_agreement_reaches_fp64_precision_only_with_fp64_inputs(dtype):
    """fp64 inputs agree with the fp64 reference to ~1e-15 (what comparing a patched model with its
    fp64 self needs); fp32 inputs only to ~1e-7."""
    ours, grads, ref, ref_grads = run_both(dtype, "all", "mean", "recompute")
    error = abs(float(ours["loss"]) - float(ref["loss"])) / abs(float(ref["loss"]))
    grad_error = float((grads["grad_weight"].double() - ref_grads["grad_weight"]).norm() / ref_grads["grad_weight"].norm())
    if dtype == torch.float64:
        assert error < 1e-13 and grad_error < 1e-13, (error, grad_error)
    else:
        assert 1e-10 < max(error, grad_error) < 1e-6, (error, grad_error)


@pytest.mark.parametrize("chunk", [1, 7, 64, V - 1, V, None])
def test_the_result_does_not_depend_on_the_chunk(chunk):
    ours, grads, ref, ref_grads = run_both(torch.float64, "all", "sum", "recompute", extras=True, chunk=chunk)
    assert_matches(torch.float64, ours, grads, ref, ref_grads, names=("loss", "lse", "entropy", "logprob"))


@pytest.mark.parametrize("reduction", REDUCTIONS)
def test_shift_scores_each_position_against_the_next_target(reduction):
    x, w, _, y, _, _ = case_inputs(torch.float64, "plain", n=24)
    x, y = x.reshape(3, 8, H), y.reshape(3, 8)
    xs, ws = leaves(x, w)
    loss = lfce.linear_cross_entropy(xs, ws, y, reduction=reduction, shift=True, chunk_size=CHUNK)
    (loss if reduction != "none" else loss.sum()).backward()
    x64, w64 = leaves(x, w)
    hidden, targets = shifted_problem(x64, y)
    expected = F.cross_entropy(F.linear(hidden, w64), targets, ignore_index=IGNORE, reduction=reduction)
    (expected if reduction != "none" else expected.sum()).backward()
    if reduction == "none":
        assert torch.equal(loss[:, -1], torch.zeros(3, dtype=torch.float64))
        loss = loss[:, :-1].reshape(-1)
    torch.testing.assert_close(loss, expected.detach(), rtol=1e-13, atol=1e-14)
    torch.testing.assert_close(xs.grad, x64.grad, rtol=1e-12, atol=1e-14)
    torch.testing.assert_close(ws.grad, w64.grad, rtol=1e-12, atol=1e-14)


@pytest.mark.parametrize("dtype", [torch.float32, torch.float64], ids=dtype_id)
def test_accumulators_gain_the_gradients(dtype):
    x, w, b, y, _, _ = case_inputs(dtype, "bias")
    xs, ws, bs = leaves(x, w, b)
    main_w, main_b = torch.ones(V, H), torch.ones(V)
    lfce.linear_cross_entropy(xs, ws, y, bs, chunk_size=CHUNK, weight_grad_accumulator=main_w,
                              bias_grad_accumulator=main_b).backward()
    assert ws.grad is None and bs.grad is None
    x64, w64, b64 = leaves(*(t.double() for t in (x, w, b)))
    F.cross_entropy(F.linear(x64, w64, b64), y, ignore_index=IGNORE).backward()
    torch.testing.assert_close(main_w.double(), 1 + w64.grad, rtol=2e-7, atol=2e-7)
    torch.testing.assert_close(main_b.double(), 1 + b64.grad, rtol=2e-7, atol=2e-7)


def test_frozen_weight_gets_no_gradient_and_hidden_still_does():
    x, w, _, y, _, _ = case_inputs(torch.float64, "plain")
    (xs,) = leaves(x)
    lfce.linear_cross_entropy(xs, w, y, chunk_size=CHUNK).backward()
    assert xs.grad is not None and w.grad is None


def test_cpu_autocast_casts_the_inputs_as_it_casts_f_linears_and_computes_in_their_dtype():
    """Under torch.autocast("cpu", dtype=bf16) fp32 hidden and weight are cast to bf16 first (as
    autocast casts F.linear's inputs), and the CPU kernels compute as for bf16 inputs: the same loss
    bit for bit as a bf16 call, the gradients back in fp32 (the casts are differentiable)."""
    x, w, _, y = make_inputs(37, 32, 203, torch.float32, bias=False, device="cpu")
    x.requires_grad_(True)
    w.requires_grad_(True)
    with torch.autocast("cpu", dtype=torch.bfloat16):
        loss = lfce.linear_cross_entropy(x, w, y)
    loss.backward()
    xb = x.detach().to(torch.bfloat16).requires_grad_(True)
    wb = w.detach().to(torch.bfloat16).requires_grad_(True)
    expected = lfce.linear_cross_entropy(xb, wb, y)
    expected.backward()
    assert torch.equal(loss, expected)
    assert x.grad.dtype == torch.float32 and w.grad.dtype == torch.float32
    assert torch.equal(x.grad, xb.grad.float()) and torch.equal(w.grad, wb.grad.float())


def test_float16_refuses_what_the_library_refuses():
    x, w, _, y, _, _ = case_inputs(torch.float16, "plain")
    with pytest.raises(ValueError, match="class_weight is not supported with torch.float16"):
        lfce.linear_cross_entropy(x, w, y, class_weight=torch.ones(V))
    with pytest.raises(ValueError, match="z_loss_scale=0.1 is not supported with torch.float16"):
        lfce.linear_cross_entropy(x, w, y, z_loss_scale=0.1)


def test_a_target_outside_the_vocabulary_gives_a_nan_loss_for_that_token():
    x, w, _, y, _, _ = case_inputs(torch.float32, "plain", n=4)
    y = torch.tensor([1, V, IGNORE, -5])
    loss = lfce.linear_cross_entropy(x, w, y, reduction="none")
    assert torch.isfinite(loss[0]) and loss[1].isnan() and loss[2] == 0 and loss[3].isnan()


ENTRY_POINTS = {
    "functional": lambda x, w, y: lfce.linear_cross_entropy(x, w, y),
    "module": lambda x, w, y: lfce.LinearCrossEntropyLoss()(x, w, y),
    "liger": lambda x, w, y: liger.liger_fused_linear_cross_entropy(x, w, y),
    "liger_module": lambda x, w, y: liger.LigerFusedLinearCrossEntropyLoss()(w, x, y),
    "cce": lambda x, w, y: cce.linear_cross_entropy(x, w, y),
    "torch": lambda x, w, y: lfce_torch.linear_cross_entropy(x, w, y),
}


@pytest.mark.parametrize("entry", ENTRY_POINTS)
def test_every_entry_point_takes_fp64_cpu_tensors(entry):
    x, w, _, y, _, _ = case_inputs(torch.float64, "plain")
    xs, ws = leaves(x, w)
    loss = ENTRY_POINTS[entry](xs, ws, y)
    loss.backward()
    x64, w64 = leaves(x, w)
    expected = F.cross_entropy(F.linear(x64, w64), y, ignore_index=IGNORE)
    expected.backward()
    assert loss.dtype == torch.float64
    torch.testing.assert_close(loss, expected.detach(), rtol=1e-14, atol=1e-15)
    torch.testing.assert_close(xs.grad, x64.grad, rtol=1e-13, atol=1e-15)
    torch.testing.assert_close(ws.grad, w64.grad, rtol=1e-13, atol=1e-15)


# --- the operators -------------------------------------------------------------------------------

def operator_args(x, w, b, y, class_weight, mode="recompute", reduction="mean", outputs=0, token_scaling=True,
                  sequence_length=0, chunk_size=CHUNK):
    """lfce::forward's arguments for every loss option at once (and the extra outputs' flags given)."""
    options = lfce.LossOptions(ignore_index=IGNORE, reduction=reduction, mode=mode, chunk_size=chunk_size, softcap=3.0,
                               temperature=0.7, z_loss_scale=0.1, label_smoothing=0.2, token_scaling=token_scaling,
                               **output_options(outputs))
    return _ops.forward_inputs(x, w, b, y, options, class_weight=class_weight, wanted=(True, True, b is not None),
                               sequence_length=sequence_length)


def output_options(outputs):
    """The LossOptions keywords asking for the extra outputs of lfce.h's OUTPUT_* flags ``outputs``."""
    return {"return_entropy": bool(outputs & _lib.OUTPUT_ENTROPY), "return_logprob": bool(outputs & _lib.OUTPUT_LOGPROB),
            "return_predicted": bool(outputs & _lib.OUTPUT_PREDICTED)}


def test_forward_operator_outputs_match_the_unchunked_model():
    """loss, the lse rows (LSE, scale, entropy, logprob), the three counts and predicted, fp32."""
    x, w, b, y, class_weight, _ = case_inputs(torch.float32, "all")
    args = operator_args(x, w, b, y, class_weight.float(), outputs=_lib.OUTPUTS_ALL)
    ours, model = _cpu.forward(*args), forward_cpu(*args)  # measured: up to 1.6e-7 of the largest value
    for name, a, e in zip(("loss", "lse", "valid_count"), ours[:3], model[:3]):
        torch.testing.assert_close(a, e, rtol=2e-6, atol=2e-6, msg=name)
    assert torch.equal(ours[6], model[6]), "predicted"


def test_backward_operator_with_grad_lse_matches_the_unchunked_model():
    """A direct lfce::backward call: the loss's gradient per token plus grad_lse's LSE, entropy and
    logprob rows (the scale row's dropped), every option on, against cpu_model.backward_cpu."""
    x, w, b, y, class_weight, _ = case_inputs(torch.float32, "all")
    outputs = _lib.OUTPUT_ENTROPY | _lib.OUTPUT_LOGPROB
    forward_args = operator_args(x, w, b, y, class_weight, reduction="none", outputs=outputs)
    _, lse, count = _cpu.forward(*forward_args)[:3]
    gen = torch.Generator().manual_seed(4)
    grad_loss, grad_lse = torch.rand(N, generator=gen) + 0.5, torch.randn(lse.shape, generator=gen)
    args = (x, w, b, y, class_weight, lse, count, grad_loss, None, None, IGNORE, "none", CHUNK, None, 3.0, 0.7,
            0.1, 0.2, True, True, True, True, grad_lse, outputs, 0)
    # Measured: up to 2e-7 of the largest gradient (two fp32 summation orders); about 10x that:
    for name, a, e in zip(("grad_hidden", "grad_weight", "grad_bias"), _cpu.backward(*args), backward_cpu(*args)):
        torch.testing.assert_close(a, e, rtol=2e-5, atol=2e-6, msg=name)


@pytest.mark.parametrize("dtype", [torch.float32, torch.float64], ids=dtype_id)
def test_eager_mode_is_the_same_function_as_recompute_mode(dtype):
    """With an upstream gradient of 1 eager's gradients (computed in the forward) are recompute's bit
    for bit: the same code."""
    results = []
    for mode in MODES:
        x, w, b, y, class_weight, options = case_inputs(dtype, "all")
        xs, ws, bs = leaves(x, w, b)
        loss = lfce.linear_cross_entropy(xs, ws, y, bs, mode=mode, chunk_size=CHUNK, class_weight=class_weight,
                                         **options)
        loss.backward()
        results.append((loss, xs.grad, ws.grad, bs.grad))
    for name, eager, recompute in zip(("loss", "grad_hidden", "grad_weight", "grad_bias"), *results):
        assert torch.equal(eager, recompute), name


def test_the_librarys_own_check_runs_on_cpu_calls():
    """A problem only lfce_check_problem refuses (a sequence length that does not divide the tokens,
    in a direct operator call): refused on the CPU as on CUDA, fp64 too (checked as fp32)."""
    if _cpu._library() is None:
        pytest.skip("liblfce.so is not there: the CPU path runs the Python checks only")
    for dtype in (torch.float32, torch.float64):
        x, w, b, y, _, _ = case_inputs(dtype, "plain", n=12)
        problem = _lib.make_problem(12, H, V, _lib.DTYPE_FP32, sequence_length=5)
        status = _lib.load().lfce_check_problem(ctypes.byref(problem))
        assert status == _lib.ERR_INVALID_ARGUMENT
        expected = _lib.last_error()
        with pytest.raises(lfce.InvalidArgumentError) as caught:
            _cpu.forward(*operator_args(x, w, b, y, None, token_scaling=False, sequence_length=5))
        assert str(caught.value).endswith(expected) or expected in str(caught.value)


def test_the_chunk_width_follows_chunk_size_or_the_budget():
    assert _cpu.chunk_width(100, 1000, chunk_size=64) == 64
    assert _cpu.chunk_width(100, 50, chunk_size=64) == 50
    assert _cpu.chunk_width(100, 10 ** 6, workspace_budget=100 * 4 * 300) == 300
    assert _cpu.chunk_width(1024, 128256) == (256 << 20) // (1024 * 4)
    assert _cpu.chunk_width(1024, 128256, element_size=8) == (256 << 20) // (1024 * 8)


@pytest.mark.skipif(not _ops.HAVE_CUSTOM_OPS, reason="torch.compile traces lfce's custom ops (PyTorch 2.4+)")
def test_fp64_under_torch_compile_matches_the_eager_call():
    x, w, _, y, _, _ = case_inputs(torch.float64, "plain")

    def loss_of(x, w, y):
        return lfce.linear_cross_entropy(x, w, y, chunk_size=CHUNK, z_loss_scale=0.01)

    compiled = torch.compile(loss_of, backend="aot_eager", fullgraph=True)
    (xs, ws), (xc, wc) = leaves(x, w), leaves(x, w)
    eager, traced = loss_of(xs, ws, y), compiled(xc, wc, y)
    eager.backward()
    traced.backward()
    assert traced.dtype == torch.float64
    torch.testing.assert_close(traced, eager, rtol=0, atol=0)
    torch.testing.assert_close(xc.grad, xs.grad, rtol=0, atol=0)
    torch.testing.assert_close(wc.grad, ws.grad, rtol=0, atol=0)


@pytest.mark.skipif(not _ops.HAVE_CUSTOM_OPS, reason="opcheck needs torch.library custom ops (PyTorch 2.4+)")
@pytest.mark.parametrize("dtype", [torch.float32, torch.float64], ids=dtype_id)
def test_opcheck_passes_for_the_cpu_kernels(dtype):
    x, w, b, y, class_weight, _ = case_inputs(dtype, "all")
    args = operator_args(*leaves(x, w, b), y, class_weight.to(_ops._statistics_dtype(x)),
                         outputs=_lib.OUTPUT_ENTROPY | _lib.OUTPUT_PREDICTED)
    torch.library.opcheck(torch.ops.lfce.forward.default, args)


# --- memory: no [N, V] tensor -----------------------------------------------------------------------

def largest_tensors(function):
    """Run function() under a dispatch mode; return {shape: bytes} of every tensor an operator
    created (views included: they cost nothing, but a [N, V] view would show a [N, V] storage)."""
    from torch.utils._python_dispatch import TorchDispatchMode

    seen = {}

    class Recording(TorchDispatchMode):
        def __torch_dispatch__(self, func, types, args=(), kwargs=None):
            out = func(*args, **(kwargs or {}))
            for t in out if isinstance(out, (tuple, list)) else (out,):
                if isinstance(t, torch.Tensor):
                    seen[tuple(t.shape)] = t.numel() * t.element_size()
            return out

    with Recording():
        function()
    return seen


@pytest.mark.parametrize("extras", [False, True], ids=["loss", "extra_outputs"])
def test_a_llama3_vocabulary_never_makes_an_n_by_v_tensor(extras):
    """V = 128256, N = 64, H = 32, chunk 4096: every tensor created in the forward and the backward
    (all options and extra outputs on) is at most one [N, chunk] fp32 chunk (1 MiB; the [chunk, H]
    slices of the weight and its gradient are smaller) but the [V, H] weight-sized gradient (an
    output); the N x V logits (31 MiB) never exist."""
    n, h, v, chunk = 64, 32, 128256, 4096
    x, w, b, y = make_inputs(n, h, v, torch.float32, bias=True, device="cpu")
    xs, ws, bs = leaves(x, w, b)
    extra = {"return_entropy": True, "return_logprob": True, "return_predicted": True} if extras else {}

    def step():
        out = lfce.linear_cross_entropy(xs, ws, y, bs, chunk_size=chunk, softcap=30.0, label_smoothing=0.1,
                                        z_loss_scale=1e-4, class_weight=torch.ones(v), token_scaling=True, **extra)
        loss = out.loss + out.entropy.sum() + out.logprob.sum() if extras else out
        loss.backward()

    seen = largest_tensors(step)
    allowed = {(v, h), (h, v)}  # weight-sized: grad_weight (an output) and the weight's transposed view
    others = {shape: nbytes for shape, nbytes in seen.items() if shape not in allowed}
    worst = max(others, key=others.get)
    budget = n * chunk * 4
    assert others[worst] <= budget, f"a {worst} tensor of {others[worst]} bytes, over one [N, chunk] fp32 chunk"
    assert all(math.prod(shape) < n * v for shape in others), sorted(others, key=others.get)[-3:]
    assert (xs.grad is not None) and (ws.grad.shape == (v, h))


RSS_SCRIPT = """
import resource, torch, lfce
n, h, v, chunk = 512, 64, 128256, 4096
g = torch.Generator().manual_seed(0)
x = torch.randn(n, h, generator=g).requires_grad_()
w = (torch.randn(v, h, generator=g) / 8).requires_grad_()
y = torch.randint(0, v, (n,), generator=g)
lfce.linear_cross_entropy(x[:2], w[:50], y[:2] % 50).backward()  # first-call costs (the library) not counted
x.grad = w.grad = None
before = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
lfce.linear_cross_entropy(x, w, y, chunk_size=chunk).backward()
print((resource.getrusage(resource.RUSAGE_SELF).ru_maxrss - before) * 1024)
"""


def test_peak_memory_of_a_llama3_vocabulary_is_the_gradient_and_a_few_chunks():
    """A fresh process's peak resident memory (a high-water mark, so measured in a process of its own)
    grows by the [V, H] grad_weight (31.3 MiB) plus a few [N, chunk] fp32 chunks (8 MiB each) for
    N = 512, H = 64, V = 128256: measured 39 MiB, where the [N, V] logits alone would be 250 MiB
    (F.linear + F.cross_entropy: 753 MiB). Bound: the gradient, three chunks and 8 MiB of slack."""
    import subprocess
    import sys

    out = subprocess.run([sys.executable, "-c", RSS_SCRIPT], capture_output=True, text=True, timeout=300,
                         check=False)
    assert out.returncode == 0, out.stderr
    growth = int(out.stdout.split()[-1])
    n, h, v, chunk = 512, 64, 128256, 4096
    bound = v * h * 4 + 3 * n * chunk * 4 + (8 << 20)
    assert growth <= bound, f"peak RSS grew {growth / 2**20:.1f} MiB, over {bound / 2**20:.1f} MiB"
