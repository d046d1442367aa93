"""weight_grad_accumulator / bias_grad_accumulator without a GPU (PyTorch 2.4+; skipped before, failed in
ctest's python.cpu.torch): the operators' CPU implementation (python/lfce/_cpu.py) adds the gradients
into the buffers as the kernels do, and these tests check what the Python layer and the operators make of it,
called eagerly and under torch.compile(fullgraph=True):

* the buffer ends as its old value + the fp64 reference gradient, and weight.grad / bias.grad stay
  None; a second forward + backward adds again; hidden's gradient is unchanged by the option;
* the buffer is filled exactly when weight (bias) requires grad;
* opcheck of both operators with the buffers (lfce::backward declares them mutated), and one
  compilation for two token counts.

The GPU side (the kernels adding in place, no [V, H] temporary) is test_gpu_accumulate.py.
"""

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

import lfce

REDUCTIONS = ["mean", "sum", "none"]
# The CPU model's fp32 against fp64 (N = 9, H = 16, V = 40, buffers holding values of the
# gradients' size): at most 1.4e-7 of the buffer's largest value (up to 4.9), fp32 and bf16 inputs
# alike (the reference takes the bf16 values), eager and compiled. About 2x that:
TOL_OF_MAX = 3e-7


def main_grads(w, b, seed=5):
    """fp32 buffers for weight and bias (None without a bias) holding non-zero values of about the
    gradients' size, as a buffer part way through gradient accumulation would."""
    g = torch.Generator().manual_seed(seed)
    main_w = torch.randn(w.shape, generator=g) * 0.5
    return main_w, None if b is None else torch.randn(b.shape, generator=g) * 0.5


def reference(x, w, b, y, reduction, grad):
    """fp64 (grad_hidden, grad_weight, grad_bias or None) of F.cross_entropy(F.linear(x, w, b), y)."""
    x64, w64 = (t.detach().double().requires_grad_() for t in (x, w))
    b64 = None if b is None else b.detach().double().requires_grad_()
    loss = F.cross_entropy(F.linear(x64, w64, b64), y, reduction=reduction)
    loss.backward(grad.double())
    return x64.grad, w64.grad, None if b is None else b64.grad


def upstream(reduction, n=9):
    return torch.linspace(0.5, 2.0, n) if reduction == "none" else torch.tensor(1.5)


def loss_fn(compiled, **options):
    def call(x, w, b, y, main_w, main_b):
        return lfce.linear_cross_entropy(x, w, y, b, weight_grad_accumulator=main_w, bias_grad_accumulator=main_b,
                                         **options)

    if not compiled:
        return call
    torch._dynamo.reset()  # one code object, many sets of closure values: past the recompile limit
    return torch.compile(call, backend="aot_eager", fullgraph=True)


def assert_added(name, buffer, old, expected):
    """buffer == old + expected (fp64) to TOL_OF_MAX of its largest value; the message names the
    worst element."""
    assert buffer.dtype == torch.float32, f"{name} is {buffer.dtype}"
    want = old.double() + expected
    torch.testing.assert_close(buffer.double(), want, rtol=0.0, atol=TOL_OF_MAX * float(want.abs().max()),
                               msg=lambda m: f"{name}: {m}")


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16], ids=["fp32", "bf16"])
@pytest.mark.parametrize("bias", [False, True], ids=["no_bias", "bias"])
@pytest.mark.parametrize("reduction", REDUCTIONS)
@pytest.mark.parametrize("compiled", [False, True], ids=["eager_call", "compiled"])
def test_backward_adds_the_gradients_into_the_buffers_and_gives_weight_none(compiled, reduction, bias,
                                                                            dtype):
    x, w, b, y = inputs(9, dtype=dtype, bias=bias)
    main_w, main_b = main_grads(w, b)
    old_w, old_b = main_w.clone(), None if b is None else main_b.clone()
    grad = upstream(reduction)
    loss_fn(compiled, reduction=reduction)(x, w, b, y, main_w, main_b).backward(grad)
    ref_x, ref_w, ref_b = reference(x, w, b, y, reduction, grad)
    assert w.grad is None, "weight got a gradient though it went into weight_grad_accumulator"
    assert_added("weight_grad_accumulator", main_w, old_w, ref_w)
    if bias:
        assert b.grad is None, "bias got a gradient though it went into bias_grad_accumulator"
        assert_added("bias_grad_accumulator", main_b, old_b, ref_b)
    torch.testing.assert_close(x.grad.double(), ref_x.to(dtype).double(), rtol=1e-2 if dtype != torch.float32 else 1e-5,
                               atol=1e-6)


@pytest.mark.parametrize("compiled", [False, True], ids=["eager_call", "compiled"])
def test_two_backward_passes_add_twice(compiled):
    x, w, b, y = inputs(9, bias=True)
    main_w, main_b = main_grads(w, b)
    old_w, old_b = main_w.clone(), main_b.clone()
    fn = loss_fn(compiled)
    for _ in range(2):
        fn(x, w, b, y, main_w, main_b).backward()
    _, ref_w, ref_b = reference(x, w, b, y, "mean", torch.tensor(1.0))
    assert_added("weight_grad_accumulator after two steps", main_w, old_w, 2 * ref_w)
    assert_added("bias_grad_accumulator after two steps", main_b, old_b, 2 * ref_b)
    assert w.grad is None and b.grad is None


def test_two_calls_into_one_buffer_before_one_backward_add_both():
    """Two heads sharing the weight (multi-token prediction), one backward of the sum: outside
    torch.compile the buffer is kept on ctx without a version check, so both calls add."""
    x, w, _, y = inputs(9)
    x2, _, _, y2 = inputs(9, seed=1)
    main_w, _ = main_grads(w, None)
    old_w = main_w.clone()
    loss = (lfce.linear_cross_entropy(x, w, y, weight_grad_accumulator=main_w)
            + lfce.linear_cross_entropy(x2, w, y2, weight_grad_accumulator=main_w))
    main_w.add_(0.0)  # an in-place write in between (as to Megatron's flat buffer) is no error either
    loss.backward()
    ref_w = reference(x, w, None, y, "mean", torch.tensor(1.0))[1] + reference(x2, w, None, y2, "mean",
                                                                               torch.tensor(1.0))[1]
    assert_added("weight_grad_accumulator", main_w, old_w, ref_w)


def test_two_compiled_calls_into_one_buffer_before_one_backward_raise_autograds_version_error():
    """The documented limitation (linear_cross_entropy's docstring): under torch.compile AOTAutograd
    saves the buffer with autograd's version check, so the first backward's write fails the second's
    check. If PyTorch lifts it, this fails: then drop the limitation from the documentation."""
    x, w, _, y = inputs(9)
    main_w, _ = main_grads(w, None)
    fn = loss_fn(True)
    loss = fn(x, w, None, y, main_w, None) + fn(x, w, None, y, main_w, None)
    with pytest.raises(RuntimeError, match="modified by an inplace operation"):
        loss.backward()


@pytest.mark.parametrize("compiled", [False, True], ids=["eager_call", "compiled"])
def test_a_frozen_weight_leaves_its_buffer_untouched(compiled):
    x, w, b, y = inputs(9, bias=True)
    w.requires_grad_(False)
    main_w, main_b = main_grads(w, b)
    old_w, old_b = main_w.clone(), main_b.clone()
    loss_fn(compiled)(x, w, b, y, main_w, main_b).backward()
    assert torch.equal(main_w, old_w), "a frozen weight's buffer was written"
    assert not torch.equal(main_b, old_b), "the bias (not frozen) got nothing"
    assert x.grad is not None and w.grad is None and b.grad is None


def test_a_call_without_grad_mode_leaves_the_buffers_untouched():
    x, w, b, y = inputs(9, bias=True)
    main_w, main_b = main_grads(w, b)
    old_w, old_b = main_w.clone(), main_b.clone()
    with torch.no_grad():
        lfce.linear_cross_entropy(x, w, y, b, weight_grad_accumulator=main_w, bias_grad_accumulator=main_b)
    assert torch.equal(main_w, old_w) and torch.equal(main_b, old_b)


def test_only_the_bias_into_a_buffer_gives_weight_its_gradient():
    x, w, b, y = inputs(9, bias=True)
    _, main_b = main_grads(w, b)
    old_b = main_b.clone()
    lfce.linear_cross_entropy(x, w, y, b, bias_grad_accumulator=main_b).backward()
    _, ref_w, ref_b = reference(x, w, b, y, "mean", torch.tensor(1.0))
    torch.testing.assert_close(w.grad.double(), ref_w, rtol=1e-5, atol=1e-7)
    assert_added("bias_grad_accumulator", main_b, old_b, ref_b)
    assert b.grad is None


def test_module_takes_the_buffers_at_each_call():
    x, w, b, y = inputs(9, bias=True)
    main_w, _ = main_grads(w, b)
    old_w = main_w.clone()
    module = lfce.LinearCrossEntropyLoss(reduction="sum")
    module(x, w, y, b, weight_grad_accumulator=main_w).backward()
    assert_added("weight_grad_accumulator", main_w, old_w, reference(x, w, b, y, "sum", torch.tensor(1.0))[1])
    assert w.grad is None and b.grad is not None


@pytest.mark.parametrize("reduction", REDUCTIONS)
def test_opcheck_passes_with_the_buffers(reduction):
    x, w, b, y = inputs(6, bias=True)
    main_w, main_b = main_grads(w, b)
    args = _ops.forward_inputs(x, w, b, y, lfce.LossOptions(reduction=reduction, mode="recompute"),
                               weight_grad_accumulator=main_w, bias_grad_accumulator=main_b,
                               wanted=(True, True, True))
    torch.library.opcheck(torch.ops.lfce.forward.default, tuple(args))
    fwd = torch.ops.lfce.forward(*(a.detach() if isinstance(a, torch.Tensor) else a for a in args))
    grad = torch.ones(6 if reduction == "none" else 1)
    backward_args = _ops._backward_inputs(args, hidden=x.detach(), weight=w.detach(), bias=b.detach(), lse=fwd[1],
                                          valid_count=fwd[2], grad_loss=grad)
    torch.library.opcheck(torch.ops.lfce.backward.default, tuple(backward_args))


def test_backward_operator_declares_the_buffers_mutated():
    schema = torch.ops.lfce.backward.default._schema
    mutated = {a.name for a in schema.arguments if a.alias_info is not None and a.alias_info.is_write}
    assert mutated == {"weight_grad_accumulator", "bias_grad_accumulator"}
    forward = torch.ops.lfce.forward.default._schema
    assert not any(a.alias_info is not None and a.alias_info.is_write for a in forward.arguments)


def test_compiled_loss_with_buffers_compiles_once_for_two_token_counts():
    counter = torch._dynamo.testing.CompileCounterWithBackend("aot_eager")
    fn = torch.compile(lambda x, w, b, y, mw, mb: lfce.linear_cross_entropy(
        x, w, y, b, weight_grad_accumulator=mw, bias_grad_accumulator=mb), backend=counter, fullgraph=True,
        dynamic=True)
    x, w, b, y = inputs(10, bias=True)
    main_w, main_b = main_grads(w, b)
    for n in (10, 13):
        x, _, _, y = inputs(n, bias=True, seed=n)
        fn(x, w, b, y, main_w, main_b).backward()
    assert counter.frame_count == 1, f"{counter.frame_count} compilations for two values of N"
    assert w.grad is None and b.grad is None
