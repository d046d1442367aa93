"""The operators lfce::forward / lfce::backward without a GPU (PyTorch 2.4+; skipped before, failed in
ctest's python.cpu.torch).

* The fake implementations give the exact shapes and dtypes (FakeTensorMode): fp32 loss,
  0-dim or [N]; gradients in the inputs' dtypes, [0] where not computed.
* With the operators' CPU kernels (lfce's CPU implementation, python/lfce/_cpu.py), the whole
  path runs here: linear_cross_entropy under torch.compile(fullgraph=True) (no graph
  break), a new N with no recompilation, the autograd rule (recompute and eager, which gradients
  are asked for), and torch.library.opcheck of schema, fake and autograd registration. The CUDA
  implementations are tested the same way on the GPU (test_gpu_torch_op.py).
"""

import subprocess
import sys

import pytest
import torch
import torch.nn.functional as F
from conftest import missing_dependency

from lfce import _ops

if not _ops.HAVE_CUSTOM_OPS:
    pytest.skip(missing_dependency(f"torch {torch.__version__} has no torch.library.custom_op (PyTorch 2.4+): "
                                   "lfce runs through torch.autograd.Function there"), allow_module_level=True)

import torch._dynamo.testing
from cpu_model import inputs
from torch._subclasses.fake_tensor import FakeTensorMode

import lfce
from lfce import _cpu

BF16 = torch.bfloat16
REDUCTIONS = ["mean", "sum", "none"]


def test_an_eager_call_does_not_import_torch_dynamo():
    """Calling a custom op with an autograd formula makes PyTorch import torch._dynamo (3.6 s on
    an H200 host, most of lfce's cold start); outside torch.compile lfce must not. A fresh
    process, the operators' fake implementations standing in for the CUDA ones."""
    code = (
        "import sys, torch, lfce\n"
        "from lfce import _ops, functional\n"
        "x = torch.randn(4, 16, requires_grad=True)\n"
        "w = torch.randn(40, 16, requires_grad=True)\n"
        "lfce.linear_cross_entropy(x, w, torch.randint(0, 40, (4,))).backward()\n"
        "assert x.grad is not None and w.grad is not None\n"
        "print('torch._dynamo' in sys.modules)\n"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=300, check=False)
    assert out.returncode == 0, out.stderr
    assert out.stdout.strip() == "False", "torch._dynamo was imported by an eager forward + backward"


def torch_loss(x, w, b, y, reduction):
    return F.cross_entropy(F.linear(x.float(), w.float(), None if b is None else b.float()), y, reduction=reduction)


# --- fake implementations --------------------------------------------------------------------

def fake_call(reduction, mode, wanted, bias, dtype=BF16, n=7, h=64, v=100, class_weight=False, accumulate=False,
              token_scaling=False):
    with FakeTensorMode():
        x = torch.empty(n, h, dtype=dtype)
        w = torch.empty(v, h, dtype=dtype)
        b = torch.empty(v, dtype=dtype) if bias else None
        y = torch.empty(n, dtype=torch.int64)
        cw = torch.empty(v) if class_weight else None
        acc = {"weight_grad_accumulator": torch.empty(v, h),
               "bias_grad_accumulator": torch.empty(v) if bias else None} if accumulate else {}
        options = lfce.LossOptions(reduction=reduction, mode=mode, token_scaling=token_scaling)
        args = _ops.forward_inputs(x, w, b, y, options, class_weight=cw, wanted=wanted, **acc)
        out = torch.ops.lfce.forward(*args)
        back = torch.ops.lfce.backward(*_ops._backward_inputs(args, lse=out[1], valid_count=out[2],
                                                              grad_loss=torch.empty(n if reduction == "none" else 1)))
    return [(tuple(t.shape), t.dtype) for t in out], [(tuple(t.shape), t.dtype) for t in back]


@pytest.mark.parametrize("dtype", [BF16, torch.float16, torch.float32])
@pytest.mark.parametrize("reduction", REDUCTIONS)
def test_fake_forward_gives_an_fp32_loss_of_the_reduction_shape(reduction, dtype):
    out, _ = fake_call(reduction, "recompute", (True, True, True), bias=True, dtype=dtype)
    assert out[:3] == [((7,) if reduction == "none" else (), torch.float32), ((7,), torch.float32),
                       ((1,), torch.float32)]


@pytest.mark.parametrize("mode", ["recompute", "eager"])
def test_fake_forward_gradients_only_in_eager_mode_and_only_those_wanted(mode):
    out, _ = fake_call("mean", mode, (True, False, True), bias=True)
    eager = mode == "eager"
    assert out[3:6] == [((7, 64) if eager else (0,), BF16), ((0,), BF16), ((100,) if eager else (0,), BF16)]


@pytest.mark.parametrize("wanted", [(True, True, True), (False, True, False), (True, False, False)])
def test_fake_backward_gives_the_wanted_gradients_in_the_input_dtype(wanted):
    _, back = fake_call("none", "recompute", wanted, bias=True)
    shapes = [(7, 64), (100, 64), (100,)]
    assert back == [(shape if want else (0,), BF16) for shape, want in zip(shapes, wanted)]


@pytest.mark.parametrize("reduction", REDUCTIONS)
def test_fake_forward_gives_lse_and_the_scales_with_token_scaling(reduction):
    out, back = fake_call(reduction, "eager", (True, True, True), bias=True, token_scaling=True)
    assert out[1] == ((14,), torch.float32)
    assert back == [((7, 64), BF16), ((100, 64), BF16), ((100,), BF16)]


def test_fake_forward_gives_three_counts_with_class_weights():
    out, _ = fake_call("mean", "recompute", (True, True, True), bias=False, class_weight=True)
    assert out[2] == ((3,), torch.float32)


def test_fake_backward_without_bias_gives_an_empty_grad_bias():
    _, back = fake_call("sum", "recompute", (True, True, True), bias=False)
    assert back[2] == ((0,), BF16)


def test_fake_backward_returns_no_gradient_that_goes_into_an_accumulator():
    _, back = fake_call("mean", "recompute", (True, True, True), bias=True, accumulate=True)
    assert back == [((7, 64), BF16), ((0,), BF16), ((0,), BF16)]


# --- the whole path with the CPU reference kernel ----------------------------------------------

def test_operators_are_defined_once_per_process():
    import importlib

    schema = str(torch.ops.lfce.forward.default._schema)
    importlib.reload(_ops)  # a second definition would raise
    assert str(torch.ops.lfce.forward.default._schema) == schema


# LossOptions keywords, class weights
LOGIT_OPTIONS = {"softcap": 30.0, "temperature": 0.7, "z_loss_scale": 1e-2}


@pytest.mark.parametrize("options, class_weight", [({}, False),
                                                   (LOGIT_OPTIONS, False),
                                                   ({**LOGIT_OPTIONS, "label_smoothing": 0.1}, True),
                                                   ({**LOGIT_OPTIONS, "label_smoothing": 0.1, "token_scaling": True},
                                                    True)],
                         ids=["plain", "loss_options", "smoothing_class_weight", "token_scaling"])
@pytest.mark.parametrize("reduction", REDUCTIONS)
@pytest.mark.parametrize("mode", ["recompute", "eager"])
def test_opcheck_passes_with_the_reference_kernel(mode, reduction, options, class_weight):
    x, w, b, y = inputs(6, bias=True)
    cw = torch.rand(40) + 0.5 if class_weight else None
    args = _ops.forward_inputs(x, w, b, y, lfce.LossOptions(reduction=reduction, mode=mode, **options), class_weight=cw,
                               wanted=(True, True, True))
    torch.library.opcheck(torch.ops.lfce.forward.default, tuple(args))
    fwd = torch.ops.lfce.forward(*(a.detach() if isinstance(a, torch.Tensor) else a for a in args))
    grad = torch.ones(6 if reduction == "none" else 1)
    backward_args = _ops._backward_inputs(args, hidden=x.detach(), weight=w.detach(), bias=b.detach(), lse=fwd[1],
                                          valid_count=fwd[2], grad_loss=grad, need_weight=False)
    torch.library.opcheck(torch.ops.lfce.backward.default, tuple(backward_args))


@pytest.mark.parametrize("reduction", REDUCTIONS)
@pytest.mark.parametrize("mode", ["recompute", "eager"])
def test_compiled_loss_has_no_graph_break_and_no_recompile_for_a_new_n(mode, reduction):
    counter = torch._dynamo.testing.CompileCounterWithBackend("aot_eager")
    fn = torch.compile(lambda x, w, b, y: lfce.linear_cross_entropy(x, w, y, b, reduction=reduction, mode=mode),
                       backend=counter, fullgraph=True, dynamic=True)
    for n in (10, 13):
        x, w, b, y = inputs(n, bias=True, seed=n)
        loss = fn(x, w, b, y)
        assert loss.dtype == torch.float32
        loss.sum().backward()
        xr, wr, br = (t.detach().clone().requires_grad_() for t in (x, w, b))
        ref = torch_loss(xr, wr, br, y, reduction)
        ref.sum().backward()
        torch.testing.assert_close(loss, ref)
        for name, ours, theirs in (("hidden", x, xr), ("weight", w, wr), ("bias", b, br)):
            torch.testing.assert_close(ours.grad, theirs.grad, msg=f"grad_{name} (N={n}, {mode}, {reduction})")
    assert counter.frame_count == 1, f"{counter.frame_count} compilations for two values of N"


def test_compiled_loss_with_a_frozen_weight_asks_for_no_grad_weight():
    asked = []

    def spy(*args, **kwargs):
        given = _ops.BackwardInputs(*args, **kwargs)
        asked.append((given.need_hidden, given.need_weight, given.need_bias))
        return _cpu.backward(*args, **kwargs)

    torch.library.register_kernel("lfce::backward", "cpu", spy)
    try:
        x, w, _, y = inputs(8)
        w.requires_grad_(False)
        fn = torch.compile(lambda x, w, y: lfce.linear_cross_entropy(x, w, y), backend="aot_eager", fullgraph=True)
        fn(x, w, y).backward()
    finally:
        torch.library.register_kernel("lfce::backward", "cpu", _cpu.backward)
    assert asked == [(True, False, False)]
    assert x.grad is not None and w.grad is None


def test_fp32_loss_for_bf16_inputs_with_gradients_in_bf16():
    x, w, b, y = inputs(5, dtype=BF16, bias=True)
    loss = lfce.linear_cross_entropy(x, w, y, b, reduction="none")
    assert loss.dtype == torch.float32 and loss.shape == (5,)
    loss.sum().backward()
    assert (x.grad.dtype, w.grad.dtype, b.grad.dtype) == (BF16, BF16, BF16)


# --- the loss options through the Python layer (softcap, temperature, z-loss, return_z_loss) --------

def options_reference(x, w, b, y, reduction, softcap, temperature, z_loss_scale):
    """fp64 (loss, z_loss) written from the definitions: F.cross_entropy of the capped logits / T,
    plus s * logsumexp**2 of each counted token, reduced as the loss."""
    logits = F.linear(x.double(), w.double(), None if b is None else b.double())
    if softcap is not None:
        logits = softcap * torch.tanh(logits / softcap)
    logits = logits / temperature
    counted = y != -100
    z_loss = torch.where(counted, z_loss_scale * logits.logsumexp(-1) ** 2, torch.zeros((), dtype=torch.float64))
    ce = F.cross_entropy(logits, y, reduction="none")
    if reduction == "none":
        return ce + z_loss, z_loss
    total, z_total = (ce + z_loss).sum(), z_loss.sum()
    return (total / counted.sum(), z_total / counted.sum()) if reduction == "mean" else (total, z_total)


# LossOptions keywords (softcap, temperature, z_loss_scale)
@pytest.mark.parametrize("options", [{"temperature": 0.7}, {"z_loss_scale": 0.05}, {"softcap": 30.0, "z_loss_scale": 0.05},
                                     {"softcap": 3.0, "temperature": 0.5},
                                     {"softcap": 3.0, "temperature": 2.0, "z_loss_scale": 0.05}],
                         ids=["temperature", "z_loss", "softcap_z_loss", "temperature_softcap", "all"])
@pytest.mark.parametrize("reduction", REDUCTIONS)
@pytest.mark.parametrize("compiled", [False, True], ids=["eager_call", "compiled"])
@pytest.mark.parametrize("mode", ["recompute", "eager"])
def test_loss_options_reach_the_kernels_and_return_the_z_loss(mode, compiled, reduction, options):
    given = lfce.LossOptions(**options)  # the options not given at their "off" values (temperature 1.0, ...)
    softcap, temperature, z_loss_scale = given.softcap, given.temperature, given.z_loss_scale

    def call(x, w, b, y):
        return lfce.linear_cross_entropy(x, w, y, b, reduction=reduction, mode=mode, softcap=softcap,
                                         temperature=temperature, z_loss_scale=z_loss_scale, return_z_loss=True)

    if compiled:
        torch._dynamo.reset()  # one code object, 60 sets of closure values: past the recompile limit
    fn = torch.compile(call, backend="aot_eager", fullgraph=True) if compiled else call
    x, w, b, y = inputs(9, bias=True)
    w.data *= 4  # logits of a few units: the cap and the temperature matter
    loss, z_loss = fn(x, w, b, y)
    assert not z_loss.requires_grad, "the z-loss alone has no gradient (as Liger-Kernel's)"
    grad = torch.linspace(0.5, 2.0, 9) if reduction == "none" else torch.tensor(1.5)
    loss.backward(grad)
    xr, wr, br = (t.detach().clone().requires_grad_() for t in (x, w, b))
    ref, z_ref = options_reference(xr, wr, br, y, reduction, softcap, temperature, z_loss_scale)
    ref.backward(grad.double())
    torch.testing.assert_close(loss.double(), ref.detach(), rtol=1e-5, atol=1e-6)
    torch.testing.assert_close(z_loss.double(), z_ref.detach(), rtol=1e-5, atol=1e-7)
    for name, ours, theirs in (("hidden", x, xr), ("weight", w, wr), ("bias", b, br)):
        # The CPU model's fp32 against fp64: about 1e-6 absolute on gradients of order 1.
        torch.testing.assert_close(ours.grad, theirs.grad, rtol=1e-4, atol=1e-5, msg=lambda m, name=name: f"grad_{name}: {m}")


def test_loss_without_return_z_loss_is_a_tensor():
    x, w, _, y = inputs(4)
    assert isinstance(lfce.linear_cross_entropy(x, w, y, z_loss_scale=0.1), torch.Tensor)
    loss, z_loss = lfce.LinearCrossEntropyLoss(z_loss_scale=0.1, return_z_loss=True)(x, w, y)
    assert z_loss.shape == () and 0 < z_loss < loss


# --- label smoothing and class weights through the Python layer ----------------------------------

def weighted_reference(x, w, b, y, reduction, softcap, z_loss_scale, label_smoothing, class_weight):
    """fp64 (loss, z_loss): F.cross_entropy(weight=class_weight, label_smoothing=, ignore_index=-100) of
    the (capped) logits, plus s * logsumexp**2 of each counted token reduced as the loss ("mean": over
    the count, class weights or not, as Liger-Kernel)."""
    logits = F.linear(x.double(), w.double(), None if b is None else b.double())
    if softcap is not None:
        logits = softcap * torch.tanh(logits / softcap)
    weight = None if class_weight is None else class_weight.double()
    ce = F.cross_entropy(logits, y, weight=weight, label_smoothing=label_smoothing, reduction=reduction)
    counted = y != -100
    z_loss = torch.where(counted, z_loss_scale * logits.logsumexp(-1) ** 2, torch.zeros((), dtype=torch.float64))
    z_loss = {"none": z_loss, "sum": z_loss.sum(), "mean": z_loss.sum() / counted.sum()}[reduction]
    return ce + z_loss, z_loss


def class_weights(v=40, seed=3):
    """Weights in [0.1, 2.1), one class (a counted token's target in inputs(9)) at 0."""
    weights = torch.rand(v, generator=torch.Generator().manual_seed(seed)) * 2 + 0.1
    weights[inputs(9)[3][1]] = 0.0
    return weights


# name: (LossOptions keywords, class weights); every case has ignored tokens
WEIGHTED_CASES = {
    "label_smoothing": ({"label_smoothing": 0.2}, False),
    "class_weight": ({}, True),
    "smoothing_class_weight": ({"label_smoothing": 0.2}, True),
    "class_weight_z_loss": ({"z_loss_scale": 0.05}, True),  # two denominators for "mean"
    "smoothing_softcap": ({"softcap": 3.0, "label_smoothing": 0.2}, False),
    "all": ({"softcap": 3.0, "z_loss_scale": 0.05, "label_smoothing": 0.2}, True),
}
# The CPU model's fp32 against fp64, measured over these cases (N = 9, V = 40, logits of a few
# units): loss and z-loss within 1.8e-7 relative; gradients within 1e-5 relative + 6.3e-7
# (3.7e-6 at most, on values up to about 1). About 2.5x those:
LOSS_TOL = {"rtol": 5e-7, "atol": 1e-7}
GRAD_TOL = {"rtol": 2e-5, "atol": 2e-6}


def reference_options(given, weighted, names):
    """A case's options as its reference takes them: each of ``names`` as LossOptions(**given) holds it (an
    option not given at its "off" value), and "class_weight": class_weights() or None."""
    options = lfce.LossOptions(**given)
    return {**{name: getattr(options, name) for name in names}, "class_weight": class_weights() if weighted else None}


def assert_each_option_matters(x, w, b, y, reduction, options, ref):
    """The reference without each option set is far outside the tolerances."""
    none = {"softcap": None, "z_loss_scale": 0.0, "label_smoothing": 0.0, "class_weight": None}
    for name, value in options.items():
        if value is None or (not isinstance(value, torch.Tensor) and value == none[name]):
            continue
        without, _ = weighted_reference(x, w, b, y, reduction, **{**options, name: none[name]})
        gap = float((without - ref).abs().max() / ref.abs().max())
        assert gap > 1000 * LOSS_TOL["rtol"], f"{name} barely changes the loss here ({gap:.3g})"


def check_against_the_reference(reference, mode, compiled, reduction, options, **lfce_only):
    """lfce with ``options`` (and ``lfce_only``) and return_z_loss, called or compiled, on inputs(9)
    with a bias and logits of a few units: its loss, z-loss and gradients (a per-token upstream
    gradient for "none") against ``reference(x, w, b, y, reduction, **options)`` in fp64, which
    returns (loss, z_loss). Returns the detached inputs and the reference loss."""
    def call(x, w, b, y, class_weight):
        return lfce.linear_cross_entropy(x, w, y, b, reduction=reduction, mode=mode, return_z_loss=True,
                                         class_weight=class_weight, **lfce_only,
                                         **{k: v for k, v in options.items() if k != "class_weight"})

    if compiled:
        torch._dynamo.reset()  # one code object, many sets of closure values: past the recompile limit
    fn = torch.compile(call, backend="aot_eager", fullgraph=True) if compiled else call
    x, w, b, y = inputs(9, bias=True)
    w.data *= 4  # logits of a few units: each option changes the loss by far more than the tolerance
    loss, z_loss = fn(x, w, b, y, options.get("class_weight"))
    assert not z_loss.requires_grad
    grad = torch.linspace(0.5, 2.0, 9) if reduction == "none" else torch.tensor(1.5)
    loss.backward(grad)
    xr, wr, br = (t.detach().double().requires_grad_() for t in (x, w, b))
    ref, z_ref = reference(xr, wr, br, y, reduction, **options)
    ref.backward(grad.double())
    torch.testing.assert_close(loss.double(), ref.detach(), **LOSS_TOL)
    torch.testing.assert_close(z_loss.double(), z_ref.detach(), **LOSS_TOL)
    for name, ours, theirs in (("hidden", x, xr), ("weight", w, wr), ("bias", b, br)):
        torch.testing.assert_close(ours.grad.double(), theirs.grad, **GRAD_TOL,
                                   msg=lambda m, name=name: f"grad_{name}: {m}")
    return x.detach(), w.detach(), b.detach(), y, ref.detach()


@pytest.mark.parametrize("case", list(WEIGHTED_CASES))
@pytest.mark.parametrize("reduction", REDUCTIONS)
@pytest.mark.parametrize("compiled", [False, True], ids=["eager_call", "compiled"])
@pytest.mark.parametrize("mode", ["recompute", "eager"])
def test_label_smoothing_and_class_weights_match_pytorchs_cross_entropy(mode, compiled, reduction, case):
    options = reference_options(*WEIGHTED_CASES[case], ("softcap", "z_loss_scale", "label_smoothing"))
    *inputs_used, ref = check_against_the_reference(weighted_reference, mode, compiled, reduction, options)
    assert_each_option_matters(*inputs_used, reduction, options, ref)


# --- token scaling (Liger-Kernel's use_token_scaling) through the Python layer --------------------

def token_scaling_reference(x, w, b, y, reduction, softcap, temperature, z_loss_scale, label_smoothing, class_weight,
                            scaled=True):
    """fp64 (loss, z_loss) from the definition: each counted token's loss (cross-entropy with class
    weights and smoothing, plus s * LSE**2) times scale = softmax(logits the softmax sees)[y],
    detached; reduced as the loss ("mean": the cross-entropy over the sum of w_y with class
    weights, else the count; the z-loss over the count). scaled=False: the same without the scale."""
    logits = F.linear(x.double(), w.double(), None if b is None else b.double())
    if softcap is not None:
        logits = softcap * torch.tanh(logits / softcap)
    logits = logits / temperature
    counted = y != -100
    target = torch.where(counted, y, 0)
    weight = None if class_weight is None else class_weight.double()
    ce = F.cross_entropy(logits, y, weight=weight, label_smoothing=label_smoothing, reduction="none")
    z_loss = torch.where(counted, z_loss_scale * logits.logsumexp(-1) ** 2, torch.zeros((), dtype=torch.float64))
    scale = torch.where(counted, logits.softmax(-1).gather(1, target[:, None])[:, 0], 0.0).detach()
    if scaled:
        ce, z_loss = ce * scale, z_loss * scale
    if reduction == "none":
        return ce + z_loss, z_loss
    if reduction == "sum":
        return ce.sum() + z_loss.sum(), z_loss.sum()
    weight_sum = counted.sum() if weight is None else (weight[target] * counted).sum()
    return ce.sum() / weight_sum + z_loss.sum() / counted.sum(), z_loss.sum() / counted.sum()


# name: (LossOptions keywords, class weights)
TOKEN_SCALING_CASES = {
    "alone": ({}, False),
    "z_loss": ({"z_loss_scale": 0.05}, False),
    "softcap_temperature_z_loss": ({"softcap": 3.0, "temperature": 0.7, "z_loss_scale": 0.05}, False),
    "smoothing_class_weight_z_loss": ({"z_loss_scale": 0.05, "label_smoothing": 0.2}, True),
}


@pytest.mark.parametrize("case", list(TOKEN_SCALING_CASES))
@pytest.mark.parametrize("reduction", REDUCTIONS)
@pytest.mark.parametrize("compiled", [False, True], ids=["eager_call", "compiled"])
@pytest.mark.parametrize("mode", ["recompute", "eager"])
def test_token_scaling_multiplies_each_tokens_loss_and_gradient_by_its_detached_p_target(mode, compiled,
                                                                                         reduction, case):
    options = reference_options(*TOKEN_SCALING_CASES[case],
                                ("softcap", "temperature", "z_loss_scale", "label_smoothing"))
    *inputs_used, ref = check_against_the_reference(token_scaling_reference, mode, compiled, reduction, options,
                                                    token_scaling=True)
    unscaled, _ = token_scaling_reference(*inputs_used, reduction, **options, scaled=False)
    gap = float((unscaled - ref).abs().max() / ref.abs().max())
    assert gap > 1000 * LOSS_TOL["rtol"], f"the scale barely changes the loss here ({gap:.3g})"


def test_token_scaling_gives_the_backward_the_scales_after_the_lses():
    """lse is [2N] with token scaling (lfce.h): the LSEs, then p(target), 0 for ignored tokens."""
    x, w, _, y = inputs(9)
    options = lfce.LossOptions(reduction="none", mode="recompute", token_scaling=True)
    out = torch.ops.lfce.forward(*_ops.forward_inputs(x.detach(), w.detach(), None, y, options,
                                                      wanted=(False, False, False)))
    logits = F.linear(x.detach().double(), w.detach().double())
    counted = y != -100
    p_target = logits.softmax(-1).gather(1, torch.where(counted, y, 0)[:, None])[:, 0]
    assert out[1].shape == (18,)
    torch.testing.assert_close(out[1][:9].double(), logits.logsumexp(-1), **LOSS_TOL)
    torch.testing.assert_close(out[1][9:].double(), torch.where(counted, p_target, 0.0), **LOSS_TOL)


def test_class_weights_get_no_gradient_and_change_no_input():
    x, w, _, y = inputs(9)
    class_weight = class_weights().requires_grad_()
    before = class_weight.detach().clone()
    lfce.linear_cross_entropy(x, w, y, class_weight=class_weight, label_smoothing=0.1).backward()
    assert class_weight.grad is None and torch.equal(class_weight.detach(), before)
    assert x.grad is not None and w.grad is not None


def test_compiled_loss_with_class_weights_compiles_once_for_two_token_counts():
    counter = torch._dynamo.testing.CompileCounterWithBackend("aot_eager")
    fn = torch.compile(lambda x, w, y, cw: lfce.linear_cross_entropy(x, w, y, class_weight=cw, label_smoothing=0.1),
                       backend=counter, fullgraph=True, dynamic=True)
    for n in (10, 13):
        x, w, _, y = inputs(n, seed=n)
        fn(x, w, y, class_weights()).backward()
    assert counter.frame_count == 1, f"{counter.frame_count} compilations for two values of N"


@pytest.mark.parametrize("reduction", REDUCTIONS)
@pytest.mark.parametrize("compiled", [False, True], ids=["eager_call", "compiled"])
@pytest.mark.parametrize("mode", ["recompute", "eager"])
def test_shift_scores_each_position_against_the_next_target(mode, compiled, reduction):
    """shift=True on hidden [B, T, H] and targets [B, T]: the fp64 reference of the sliced problem
    (positions 0..T-2 against targets 1..T-1, written in the test), the last positions ignored
    (loss 0 for "none", not counted by "mean"), gradients of hidden's last positions 0; and the
    unshifted call differs from it far past the tolerance."""
    def call(x, w, y):
        return lfce.linear_cross_entropy(x, w, y, reduction=reduction, mode=mode, shift=True)

    if compiled:
        torch._dynamo.reset()
    fn = torch.compile(call, backend="aot_eager", fullgraph=True) if compiled else call
    b_, t_, h = 3, 5, 16
    x, w, _, y = inputs(b_ * t_, h=h)
    x = x.detach().reshape(b_, t_, h).requires_grad_()
    y = y.reshape(b_, t_)
    loss = fn(x, w, y)
    assert loss.shape == ((b_, t_) if reduction == "none" else ())
    grad = torch.linspace(0.5, 2.0, b_ * t_).reshape(b_, t_) if reduction == "none" else torch.tensor(1.5)
    loss.backward(grad)
    xr, wr = (t.detach().double().requires_grad_() for t in (x, w))
    logits = F.linear(xr[:, :-1], wr).reshape(-1, w.shape[0])
    ref = F.cross_entropy(logits, y[:, 1:].reshape(-1), reduction=reduction)
    if reduction == "none":
        ref = torch.cat([ref.reshape(b_, t_ - 1), torch.zeros(b_, 1, dtype=torch.float64)], dim=1)
    ref.backward(grad.double())
    torch.testing.assert_close(loss.double(), ref.detach(), **LOSS_TOL)
    torch.testing.assert_close(x.grad.double(), xr.grad, **GRAD_TOL)
    torch.testing.assert_close(w.grad.double(), wr.grad, **GRAD_TOL)
    assert torch.count_nonzero(x.grad[:, -1]) == 0, "the last position of a sequence got a gradient"
    unshifted = lfce.linear_cross_entropy(x.detach(), w.detach(), y, reduction=reduction)
    if reduction == "none":
        unshifted = unshifted.reshape(b_, t_)
    gap = float((unshifted.double() - ref.detach()).abs().max())
    assert gap > 1000 * LOSS_TOL["atol"], f"shift barely changes the loss ({gap:.3g})"


def test_shift_in_the_module_and_its_repr():
    x, w, _, y = inputs(8)
    module = lfce.LinearCrossEntropyLoss(shift=True, reduction="sum")
    assert "shift=True" in repr(module)
    expected = lfce.linear_cross_entropy(x.reshape(2, 4, -1), w, y.reshape(2, 4), reduction="sum", shift=True)
    assert torch.equal(module(x.reshape(2, 4, -1), w, y.reshape(2, 4)), expected)


def test_shift_needs_a_sequence_dimension():
    x, w, _, y = inputs(1)
    with pytest.raises(ValueError, match=r"shift=True needs a sequence dimension: .* got hidden of shape \(16,\)"):
        lfce.linear_cross_entropy(x[0], w, y[0], shift=True)


def test_operators_refuse_class_weights_they_would_misread():
    """A direct operator call (the functional layer converts): class weights must be fp32, and the
    backward's valid_count must hold the three counts the forward gives with them."""
    from lfce import _ops

    with pytest.raises(ValueError, match="class_weight must be torch.float32, got torch.float64"):
        _ops._check_class_weight(torch.ones(40, dtype=torch.float64))
    with pytest.raises(ValueError, match="valid_count must hold 3 counts .* got 1"):
        _ops._check_class_weight(torch.ones(40), torch.ones(1))
    _ops._check_class_weight(torch.ones(40), torch.ones(3))
    _ops._check_class_weight(None, torch.ones(1))
