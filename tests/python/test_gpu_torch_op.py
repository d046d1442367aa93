"""lfce as PyTorch operators on the GPU: torch.compile, opcheck, fp32 loss, autocast, CUDA graphs.

* torch.compile(fullgraph=True) of a small model ending in lfce (a projection, then the loss)
  traces with no graph break and gives the loss and gradients of the same model run eagerly,
  for both modes and every reduction, with ignore_index; a second N reuses the compiled graph
  (dynamic shapes: one compilation).
* torch.library.opcheck of lfce::forward and lfce::backward (schema, fake implementation
  against the CUDA one, autograd registration, AOT dispatch with dynamic shapes).
* The loss is fp32 whatever the input dtype, and on peaked logits as close to the fp64 answer
  as fp32 allows (a loss rounded to bf16 is off by up to 2^-9 of its value).
* Under torch.autocast("cuda", bfloat16), fp32 hidden / weight / bias are cast to bf16 (as
  F.linear's inputs are): the loss equals that of the bf16 casts, the gradients are fp32.
* The first call for a problem inside CUDA graph capture raises, asking for a warm-up call;
  capture after the warm-up works (tests/python/test_gpu_streams.py replays it on new data).

Needs PyTorch 2.4+ (torch.library.custom_op); fails, not skips, on an older one.
"""

import pytest
import torch
from checks import LOSS, assert_close, make_inputs, peaked_inputs, reference

import lfce
from lfce import _ops

pytestmark = pytest.mark.gpu

BF16 = torch.bfloat16
MODES = ["recompute", "eager"]
REDUCTIONS = ["mean", "sum", "none"]


@pytest.fixture(autouse=True)
def _needs_custom_ops():
    assert _ops.HAVE_CUSTOM_OPS, f"torch {torch.__version__} has no torch.library.custom_op (PyTorch 2.4+)"


def rel_l2(actual, expected):
    actual, expected = actual.detach().double(), expected.detach().double()
    return float((actual - expected).norm() / expected.norm().clamp_min(1e-30))


# --- torch.compile ------------------------------------------------------------------------------

class TinyLM(torch.nn.Module):
    """A projection, then the fused loss against an output layer: hidden [B, T, H] -> loss."""

    def __init__(self, hidden, vocab, mode, reduction):
        super().__init__()
        self.proj = torch.nn.Linear(hidden, hidden)
        self.head = torch.nn.Linear(hidden, vocab, bias=False)
        self.mode, self.reduction = mode, reduction

    def forward(self, x, targets):
        h = torch.nn.functional.gelu(self.proj(x))
        return lfce.linear_cross_entropy(h, self.head.weight, targets, mode=self.mode, reduction=self.reduction)


def run(fn, model, x, targets, upstream):
    """(loss, grad of x, {parameter name: grad}) of one step of fn, which computes with model's parameters."""
    model.zero_grad(set_to_none=True)
    x = x.detach().requires_grad_()
    loss = fn(x, targets)
    loss.backward(upstream)
    return loss.detach(), x.grad, {name: p.grad for name, p in model.named_parameters()}


@pytest.mark.parametrize("reduction", REDUCTIONS)
@pytest.mark.parametrize("mode", MODES)
def test_compiled_model_matches_eager_execution_and_compiles_once_for_two_token_counts(mode, reduction):
    import torch._dynamo.testing

    torch._dynamo.reset()
    torch.manual_seed(0)
    h, v = 256, 3000
    model = TinyLM(h, v, mode, reduction).cuda()  # fp32: lfce's exact fp32 kernels
    counter = torch._dynamo.testing.CompileCounterWithBackend("inductor")
    compiled = torch.compile(model, backend=counter, fullgraph=True, dynamic=True)
    for batch, length in ((2, 37), (3, 29)):  # N = 74, then 87
        x = torch.randn(batch, length, h, device="cuda")
        targets = torch.randint(0, v, (batch, length), device="cuda")
        targets[:, ::4] = -100
        upstream = torch.rand(targets.shape if reduction == "none" else (), device="cuda") + 0.5
        expected = run(model, model, x, targets, upstream)
        actual = run(compiled, model, x, targets, upstream)
        assert actual[0].dtype == torch.float32
        assert rel_l2(actual[0], expected[0]) <= 1e-5, f"loss (N={batch * length})"
        assert rel_l2(actual[1], expected[1]) <= 1e-4, f"grad of the input (N={batch * length})"
        for name, grad in expected[2].items():
            assert rel_l2(actual[2][name], grad) <= 1e-4, f"grad of {name} (N={batch * length})"
    assert counter.frame_count == 1, f"compiled {counter.frame_count} times for two token counts"


# --- opcheck -------------------------------------------------------------------------------------

# name: (LossOptions keywords, class weights)
LOGIT_OPTIONS = {"softcap": 30.0, "temperature": 0.7, "z_loss_scale": 1e-3}
OPTIONS = {"plain": ({}, False), "loss_options": (LOGIT_OPTIONS, False),
           "smoothing_class_weight": ({**LOGIT_OPTIONS, "label_smoothing": 0.1}, True),
           "token_scaling": ({**LOGIT_OPTIONS, "label_smoothing": 0.1, "token_scaling": True}, True)}


def class_weights(vocab):
    return torch.rand(vocab, device="cuda", generator=torch.Generator("cuda").manual_seed(2)) + 0.5


@pytest.mark.parametrize("options", list(OPTIONS))
@pytest.mark.parametrize("reduction", REDUCTIONS)
@pytest.mark.parametrize("mode", MODES)
def test_opcheck_passes_for_the_forward(mode, reduction, options):
    loss_options, weighted = OPTIONS[options]
    x, w, b, y = make_inputs(70, 128, 1000, BF16, bias=True)
    args = _ops.forward_inputs(x.requires_grad_(), w.requires_grad_(), b.requires_grad_(), y,
                               lfce.LossOptions(reduction=reduction, mode=mode, **loss_options),
                               class_weight=class_weights(1000) if weighted else None, wanted=(True, True, True))
    torch.library.opcheck(torch.ops.lfce.forward.default, tuple(args))


@pytest.mark.parametrize("weighted", [False, True], ids=["plain", "smoothing_class_weight"])
@pytest.mark.parametrize("wanted", [(True, True, True), (False, True, False), (True, False, True)])
@pytest.mark.parametrize("reduction", ["mean", "none"])
def test_opcheck_passes_for_the_backward(reduction, wanted, weighted):
    x, w, b, y = make_inputs(70, 128, 1000, BF16, bias=True)
    cw = class_weights(1000) if weighted else None
    options = lfce.LossOptions(reduction=reduction, mode="recompute", label_smoothing=0.1 if weighted else 0.0)
    _, lse, count, *_ = torch.ops.lfce.forward(*_ops.forward_inputs(x, w, b, y, options, class_weight=cw,
                                                                     wanted=(False, False, False)))
    grad = torch.rand(70 if reduction == "none" else 1, device="cuda") + 0.5
    # lfce::backward's arguments: the forward's for the gradients in ``wanted``
    backward_args = _ops._backward_inputs(_ops.forward_inputs(x, w, b, y, options, class_weight=cw, wanted=wanted),
                                          lse=lse, valid_count=count, grad_loss=grad)
    torch.library.opcheck(torch.ops.lfce.backward.default, tuple(backward_args))


# --- loss dtype -----------------------------------------------------------------------------------

@pytest.mark.parametrize("reduction", REDUCTIONS)
@pytest.mark.parametrize("dtype", [BF16, torch.float16, torch.float32])
def test_loss_is_fp32_and_gradients_in_the_input_dtype(dtype, reduction):
    x, w, b, y = make_inputs(33, 128, 1000, dtype, bias=True)
    for t in (x, w, b):
        t.requires_grad_()
    loss = lfce.linear_cross_entropy(x, w, y, b, reduction=reduction)
    assert loss.dtype == torch.float32, f"{reduction} loss of {dtype} inputs is {loss.dtype}"
    loss.sum().backward()
    assert (x.grad.dtype, w.grad.dtype, b.grad.dtype) == (dtype, dtype, dtype)


def test_bf16_loss_on_peaked_logits_has_fp32_accuracy(record_error):
    """A loss of about 0.2 rounded to bf16 can be off by up to 5e-4; an fp32 loss by far less than 1e-4."""
    x, w, _, y = peaked_inputs(64, 1024, 32000, BF16)
    loss = lfce.linear_cross_entropy(x, w, y)
    ref = reference(x, w, None, y, "mean", torch.ones((), device="cuda", dtype=torch.float64))[0]
    error = abs(float(loss) - float(ref))
    record_error("loss (peaked)", {"rel_l2": error / abs(float(ref)), "elementwise": error / 1e-4})
    assert error <= 1e-4 * max(1.0, abs(float(ref))), f"loss {float(loss)!r}, fp64 {float(ref)!r}: off by {error:.3g}"


# --- autocast -------------------------------------------------------------------------------------

@pytest.mark.parametrize("mode", MODES)
def test_autocast_casts_fp32_inputs_like_f_linear_and_returns_fp32_gradients(mode):
    x32, w32, b32, y = make_inputs(65, 256, 2000, torch.float32, bias=True)
    leaves = [t.detach().clone().requires_grad_() for t in (x32, w32, b32)]
    with torch.autocast("cuda", dtype=BF16):
        loss = lfce.linear_cross_entropy(leaves[0], leaves[1], y, leaves[2], mode=mode)
    loss.backward()
    casts = [t.detach().to(BF16).requires_grad_() for t in (x32, w32, b32)]
    expected = lfce.linear_cross_entropy(casts[0], casts[1], y, casts[2], mode=mode)
    expected.backward()
    assert loss.dtype == torch.float32
    torch.testing.assert_close(loss, expected, rtol=0, atol=0)
    for name, leaf, cast in zip(("hidden", "weight", "bias"), leaves, casts):
        assert leaf.grad.dtype == torch.float32, f"grad of the fp32 {name} is {leaf.grad.dtype}"
        torch.testing.assert_close(leaf.grad, cast.grad.float(), rtol=0, atol=0, msg=f"grad of {name}")


def test_autocast_accepts_bf16_activations_with_an_fp32_head():
    x, w32, _, y = make_inputs(40, 256, 2000, torch.float32)
    w32.requires_grad_()
    with torch.autocast("cuda", dtype=BF16):
        loss = lfce.linear_cross_entropy(x.to(BF16), w32, y)
    loss.backward()
    expected = reference(x.to(BF16), w32.detach().to(BF16), None, y, "mean",
                         torch.ones((), device="cuda", dtype=torch.float64))[0]
    assert_close("loss (autocast)", loss, expected.float(), LOSS[BF16])
    assert w32.grad.dtype == torch.float32


# --- CUDA graphs ----------------------------------------------------------------------------------

def test_first_call_inside_cuda_graph_capture_asks_for_a_warm_up():
    x, w, _, y = make_inputs(131, 264, 4099, BF16)  # a problem no other test of this process runs
    graph = torch.cuda.CUDAGraph()
    with pytest.raises(RuntimeError) as error, torch.cuda.graph(graph):
        lfce.linear_cross_entropy(x, w, y)
    messages = [str(error.value), str(error.value.__context__)]
    assert any("warm-up" in m and "N=131, H=264, V=4099" in m for m in messages), messages
    # After the warm-up the same call captures.
    torch.cuda.synchronize()
    expected = lfce.linear_cross_entropy(x, w, y)
    torch.cuda.synchronize()
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        loss = lfce.linear_cross_entropy(x, w, y)
    graph.replay()
    torch.cuda.synchronize()
    torch.testing.assert_close(loss, expected, rtol=0, atol=0)
