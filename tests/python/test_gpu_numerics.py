"""lfce's loss and gradients against an fp64 PyTorch reference (needs a CUDA GPU).

The reference takes the very inputs lfce gets (already rounded to the test dtype),
upcasts them to float64 and runs F.linear + F.cross_entropy with the same
ignore_index, reduction and upstream gradient (a random scalar for mean/sum, a
random per-token tensor for none).

Metric: relative L2 error ||actual - expected|| / ||expected||. Where the expected
tensor is all zeros the actual one must be exactly zero.

Tolerances per dtype: "grad" bounds each of grad_hidden, grad_weight, grad_bias;
"loss" bounds the loss computation, and since the loss comes back in the input
dtype one rounding to that dtype (its unit roundoff) is allowed on top.
"""

import pytest
import torch
import torch.nn.functional as F

import lfce

pytestmark = pytest.mark.gpu

TOLERANCES = {
    torch.bfloat16: {"loss": 2e-3, "grad": 5e-3},
    torch.float16: {"loss": 2e-3, "grad": 5e-3},
    torch.float32: {"loss": 1e-5, "grad": 1e-4},
}
UNIT_ROUNDOFF = {torch.bfloat16: 2.0 ** -8, torch.float16: 2.0 ** -11, torch.float32: 2.0 ** -24}

IGNORE = -100
MODES = ["recompute", "eager"]
REDUCTIONS = ["mean", "sum", "none"]
DTYPES = [torch.bfloat16, torch.float32]
# (N, H, V, with bias)
SHAPES = [
    (1, 2304, 50257, False),
    (7, 4096, 50257, True),
    (4097, 2304, 50257, False),
    (64, 2304, 151937, True),
]


def shape_id(shape):
    n, h, v, bias = shape
    return f"N{n}-H{h}-V{v}{'-bias' if bias else ''}"


def dtype_id(dtype):
    return str(dtype).replace("torch.", "")


# --- inputs and reference -------------------------------------------------------------------

def make_inputs(n, h, v, dtype, bias=False, ignore="some", seed=0, ignore_index=IGNORE):
    """hidden ~ N(0, 1), weight ~ N(0, 2.5/sqrt(H)) so logits have std about 2.5.

    ignore: "none", "some" (every fifth token, counting from the fifth, so N = 1 keeps
    its token) or "all".
    """
    g = torch.Generator(device="cuda").manual_seed(seed)
    x = torch.randn(n, h, device="cuda", generator=g).to(dtype)
    w = (torch.randn(v, h, device="cuda", generator=g) * (2.5 / h ** 0.5)).to(dtype)
    b = (torch.randn(v, device="cuda", generator=g) * 0.5).to(dtype) if bias else None
    y = torch.randint(0, v, (n,), device="cuda", generator=g)
    if ignore == "some":
        y[torch.arange(n, device="cuda") % 5 == 4] = ignore_index
    elif ignore == "all":
        y.fill_(ignore_index)
    else:
        assert ignore == "none", ignore
    return x, w, b, y


def upstream(reduction, shape, dtype, seed=1):
    """A random upstream gradient in the loss dtype: 0-dim for mean/sum, else shape."""
    g = torch.Generator(device="cuda").manual_seed(seed)
    size = () if reduction != "none" else shape
    return (torch.randn(size, device="cuda", generator=g) + 0.5).to(dtype)


def reference(x, w, b, y, reduction, grad, ignore_index=IGNORE):
    """fp64 loss and gradients of F.cross_entropy(F.linear(x, w, b), y)."""
    x64 = x.detach().double().requires_grad_()
    w64 = w.detach().double().requires_grad_()
    b64 = None if b is None else b.detach().double().requires_grad_()
    logits = F.linear(x64.reshape(-1, x64.shape[-1]), w64, b64)
    loss = F.cross_entropy(logits, y.reshape(-1).long(), ignore_index=ignore_index, reduction=reduction)
    if reduction == "none":
        loss = loss.reshape(y.shape)
    loss.backward(grad.double())
    return loss.detach(), x64.grad, w64.grad, None if b is None else b64.grad


def run_lfce(x, w, b, y, reduction, grad, **options):
    """lfce loss and gradients for leaf copies of the inputs."""
    x = x.detach().clone().requires_grad_()
    w = w.detach().clone().requires_grad_()
    b = None if b is None else b.detach().clone().requires_grad_()
    loss = lfce.linear_cross_entropy(x, w, y, b, reduction=reduction, **options)
    loss.backward(grad)
    return loss.detach(), x.grad, w.grad, None if b is None else b.grad


# --- comparison -----------------------------------------------------------------------------

def assert_close(name, actual, expected, tol):
    """Relative L2 error within tol; the message shows metric, tolerance and the worst element."""
    assert actual is not None, f"{name}: lfce returned no gradient"
    assert actual.shape == expected.shape, f"{name}: shape {tuple(actual.shape)}, expected {tuple(expected.shape)}"
    a = actual.detach().double().reshape(-1)
    e = expected.detach().double().reshape(-1)
    norm = e.norm().item()
    if norm == 0:
        nonzero = torch.nonzero(a).reshape(-1)
        assert nonzero.numel() == 0, (f"{name}: expected all zeros, {nonzero.numel()} nonzero; "
                                      f"first at {nonzero[0].item()} = {a[nonzero[0]].item()!r}")
        return
    diff = (a - e).abs()
    rel = (a - e).norm().item() / norm
    worst = int(torch.nan_to_num(diff, nan=float("inf")).argmax().item())
    index = tuple(_unravel(worst, actual.shape))
    assert rel <= tol, (f"{name}: rel L2 {rel:.3g} > tolerance {tol:.3g}; worst index {index}: "
                        f"expected {e[worst].item()!r}, got {a[worst].item()!r}")


def _unravel(flat, shape):
    index = []
    for size in reversed(tuple(shape)):
        index.append(flat % size)
        flat //= size
    return list(reversed(index)) or [0]


def assert_matches_reference(ours, ref, dtype, reduction):
    tol = TOLERANCES[dtype]
    loss, grad_x, grad_w, grad_b = ours
    ref_loss, ref_x, ref_w, ref_b = ref
    assert loss.dtype == dtype, f"loss dtype {loss.dtype}, expected {dtype}"
    assert_close(f"loss ({reduction})", loss, ref_loss, tol["loss"] + UNIT_ROUNDOFF[dtype])
    assert_close("grad_hidden", grad_x, ref_x, tol["grad"])
    assert_close("grad_weight", grad_w, ref_w, tol["grad"])
    if ref_b is not None:
        assert_close("grad_bias", grad_b, ref_b, tol["grad"])


def check_case(n, h, v, bias, dtype, reduction, mode, ignore="some", **options):
    x, w, b, y = make_inputs(n, h, v, dtype, bias=bias, ignore=ignore)
    grad = upstream(reduction, y.shape, dtype)
    ours = run_lfce(x, w, b, y, reduction, grad, mode=mode, **options)
    ref = reference(x, w, b, y, reduction, grad)
    assert_matches_reference(ours, ref, dtype, reduction)


# --- the matrix -----------------------------------------------------------------------------

@pytest.mark.parametrize("shape", SHAPES, ids=shape_id)
@pytest.mark.parametrize("dtype", DTYPES, ids=dtype_id)
@pytest.mark.parametrize("reduction", REDUCTIONS)
@pytest.mark.parametrize("mode", MODES)
def test_matches_fp64_reference(mode, reduction, dtype, shape):
    n, h, v, bias = shape
    check_case(n, h, v, bias, dtype, reduction, mode)


def test_matches_fp64_reference_wide_vocab_h4096():
    check_case(33, 4096, 151937, True, torch.bfloat16, "mean", "recompute")


@pytest.mark.parametrize("dtype", DTYPES, ids=dtype_id)
@pytest.mark.parametrize("reduction", REDUCTIONS)
@pytest.mark.parametrize("mode", MODES)
def test_matches_fp64_reference_with_no_target_ignored(mode, reduction, dtype):
    check_case(7, 4096, 50257, True, dtype, reduction, mode, ignore="none")


@pytest.mark.parametrize("dtype", DTYPES, ids=dtype_id)
@pytest.mark.parametrize("reduction", REDUCTIONS)
@pytest.mark.parametrize("mode", MODES)
def test_all_targets_ignored(mode, reduction, dtype):
    """mean: NaN like PyTorch (0 / 0) with all-zero gradients; sum / none: zero loss and gradients."""
    x, w, b, y = make_inputs(7, 2304, 50257, dtype, bias=True, ignore="all")
    grad = upstream(reduction, y.shape, dtype)
    loss, grad_x, grad_w, grad_b = run_lfce(x, w, b, y, reduction, grad, mode=mode)
    ref_loss = reference(x, w, b, y, reduction, grad)[0]
    if reduction == "mean":
        assert torch.isnan(ref_loss).item(), f"PyTorch's reference changed: mean over no targets is {ref_loss!r}"
        assert torch.isnan(loss).item(), f"mean over no targets should be NaN like PyTorch, got {loss.item()!r}"
    else:
        assert_close("loss", loss, ref_loss, 0.0)
    for name, grad_t in (("grad_hidden", grad_x), ("grad_weight", grad_w), ("grad_bias", grad_b)):
        assert_close(name, grad_t, torch.zeros_like(grad_t), 0.0)


# --- options and input layouts -------------------------------------------------------------

@pytest.mark.parametrize("options", [{"chunk_size": 256}, {"workspace_budget": 8 << 20}],
                         ids=["chunk256", "budget8MiB"])
def test_gradients_do_not_depend_on_the_vocab_chunk(options):
    x, w, b, y = make_inputs(64, 2304, 151937, torch.bfloat16, bias=True)
    grad = upstream("mean", (), torch.bfloat16)
    default = run_lfce(x, w, b, y, "mean", grad)
    chunked = run_lfce(x, w, b, y, "mean", grad, **options)
    tol = TOLERANCES[torch.bfloat16]["grad"]
    assert_close("loss", chunked[0], default[0], 0.0)
    for name, ours, base in zip(("grad_hidden", "grad_weight", "grad_bias"), chunked[1:], default[1:]):
        assert_close(name, ours, base, tol)


def test_non_contiguous_hidden():
    x, w, b, y = make_inputs(257, 2304, 50257, torch.bfloat16)
    x_t = x.t().contiguous().t()  # same values, column-major
    assert not x_t.is_contiguous()
    grad = upstream("mean", (), torch.bfloat16)
    assert_matches_reference(run_lfce(x_t, w, b, y, "mean", grad), reference(x, w, b, y, "mean", grad),
                             torch.bfloat16, "mean")


def test_int32_targets():
    x, w, b, y = make_inputs(257, 2304, 50257, torch.bfloat16)
    grad = upstream("sum", (), torch.bfloat16)
    ours = run_lfce(x, w, b, y.int(), "sum", grad)
    assert_matches_reference(ours, reference(x, w, b, y, "sum", grad), torch.bfloat16, "sum")


@pytest.mark.parametrize("reduction", REDUCTIONS)
def test_three_dimensional_hidden(reduction):
    x, w, b, y = make_inputs(4 * 33, 2304, 50257, torch.bfloat16)
    x, y = x.reshape(4, 33, 2304), y.reshape(4, 33)
    grad = upstream(reduction, y.shape, torch.bfloat16)
    ours = run_lfce(x, w, b, y, reduction, grad)
    if reduction == "none":
        assert ours[0].shape == (4, 33)
    assert_matches_reference(ours, reference(x, w, b, y, reduction, grad), torch.bfloat16, reduction)


@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float32], ids=dtype_id)
def test_hidden_size_not_a_multiple_of_16_bytes_is_padded(dtype):
    x, w, b, y = make_inputs(65, 2302, 50257, dtype, bias=True)
    grad = upstream("mean", (), dtype)
    assert_matches_reference(run_lfce(x, w, b, y, "mean", grad), reference(x, w, b, y, "mean", grad),
                             dtype, "mean")


def test_float16():
    x, w, b, y = make_inputs(129, 2304, 50257, torch.float16, bias=True)
    grad = upstream("mean", (), torch.float16)
    assert_matches_reference(run_lfce(x, w, b, y, "mean", grad), reference(x, w, b, y, "mean", grad),
                             torch.float16, "mean")


def test_ignore_index_that_is_a_valid_class():
    x, w, b, y = make_inputs(257, 2304, 50257, torch.bfloat16, ignore_index=3)
    grad = upstream("mean", (), torch.bfloat16)
    ours = run_lfce(x, w, b, y, "mean", grad, ignore_index=3)
    assert_matches_reference(ours, reference(x, w, b, y, "mean", grad, ignore_index=3), torch.bfloat16, "mean")


def test_frozen_weight_gets_no_gradient():
    x, w, _, y = make_inputs(64, 2304, 50257, torch.bfloat16)
    x = x.clone().requires_grad_()
    lfce.linear_cross_entropy(x, w, y).backward()
    assert w.grad is None
    assert x.grad is not None and x.grad.shape == x.shape


def test_module_matches_function():
    x, w, b, y = make_inputs(64, 2304, 50257, torch.bfloat16, bias=True)
    module = lfce.LinearCrossEntropyLoss(reduction="sum", mode="eager")
    assert_close("loss", module(x, w, y, b), lfce.linear_cross_entropy(x, w, y, b, reduction="sum"),
                 TOLERANCES[torch.bfloat16]["loss"] + UNIT_ROUNDOFF[torch.bfloat16])


def test_runs_on_the_current_stream():
    x, w, b, y = make_inputs(257, 2304, 50257, torch.bfloat16)
    grad = upstream("mean", (), torch.bfloat16)
    expected = run_lfce(x, w, b, y, "mean", grad)
    side = torch.cuda.Stream()
    side.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(side):
        ours = run_lfce(x, w, b, y, "mean", grad)
    torch.cuda.current_stream().wait_stream(side)
    for name, a, e in zip(("loss", "grad_hidden", "grad_weight"), ours, expected):
        assert_close(name, a, e, 0.0)


@pytest.mark.parametrize("mode", MODES)
def test_forward_and_backward_never_synchronise(mode):
    if not hasattr(torch.cuda, "set_sync_debug_mode"):
        pytest.fail(f"torch {torch.__version__} has no torch.cuda.set_sync_debug_mode")
    x, w, b, y = make_inputs(64, 2304, 50257, torch.bfloat16, bias=True)
    x.requires_grad_()
    w.requires_grad_()
    run_lfce(x, w, b, y, "mean", upstream("mean", (), torch.bfloat16), mode=mode)  # compile first
    torch.cuda.synchronize()
    torch.cuda.set_sync_debug_mode("error")
    try:
        loss = lfce.linear_cross_entropy(x, w, y, b, mode=mode)
        loss.backward()
    finally:
        torch.cuda.set_sync_debug_mode("default")
