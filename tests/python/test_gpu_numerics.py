"""lfce's loss and gradients against an fp64 PyTorch reference (needs a CUDA GPU).

The reference takes the very inputs lfce gets (already rounded to the test dtype),
upcasts them to float64 and runs F.linear + F.cross_entropy with the same
ignore_index, reduction and upstream gradient (a random scalar for mean/sum, a
random per-token tensor for none); shapes too large for that use the token-chunked
float64 reference of checks.py.

Every loss and gradient is checked three ways (checks.py): relative L2, elementwise
atol + rtol (first bad index in the message), and per row (grad_hidden by token,
grad_weight by vocabulary row, grad_bias in blocks), with tolerances per dtype in
checks.GRAD / checks.LOSS. Each test records what it measured (JUnit properties and
the summary at the end of the run; see conftest.py).
"""

from dataclasses import replace

import pytest
import torch
from checks import (
    EXACT,
    GRAD,
    LOSS,
    PEAKED_REL_L2,
    assert_bitwise_equal,
    assert_close,
    assert_gradients_match,
    assert_within_one_ulp,
    chunked_reference,
    make_inputs,
    peaked_inputs,
    reference,
    run_lfce,
    upstream,
)

import lfce
from lfce import _lib

pytestmark = pytest.mark.gpu

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
    return "N%d-H%d-V%d%s" % (n, h, v, "-bias" if bias else "")


def dtype_id(dtype):
    return str(dtype).replace("torch.", "")


def check_case(record, n, h, v, bias, dtype, reduction, mode, ignore="some", **options):
    x, w, b, y = make_inputs(n, h, v, dtype, bias=bias, ignore=ignore)
    grad = upstream(reduction, y.shape, dtype)
    ours = run_lfce(x, w, b, y, reduction, grad, mode=mode, **options)
    ref = reference(x, w, b, y, reduction, grad)
    assert_gradients_match(ours, ref, dtype, reduction, record)


# --- the matrix -----------------------------------------------------------------------------

@pytest.mark.parametrize("shape", SHAPES, ids=shape_id)
@pytest.mark.parametrize("dtype", DTYPES, ids=dtype_id)
@pytest.mark.parametrize("reduction", REDUCTIONS)
@pytest.mark.parametrize("mode", MODES)
def test_matches_fp64_reference(mode, reduction, dtype, shape, record_error):
    n, h, v, bias = shape
    check_case(record_error, n, h, v, bias, dtype, reduction, mode)


def test_matches_fp64_reference_wide_vocab_h4096(record_error):
    check_case(record_error, 33, 4096, 151937, True, torch.bfloat16, "mean", "recompute")


@pytest.mark.parametrize("dtype", DTYPES, ids=dtype_id)
@pytest.mark.parametrize("reduction", REDUCTIONS)
@pytest.mark.parametrize("mode", MODES)
def test_matches_fp64_reference_with_no_target_ignored(mode, reduction, dtype, record_error):
    check_case(record_error, 7, 4096, 50257, True, dtype, reduction, mode, ignore="none")


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
        assert_close("loss", loss, ref_loss, EXACT)
    for name, grad_t in (("grad_hidden", grad_x), ("grad_weight", grad_w), ("grad_bias", grad_b)):
        assert_close(name, grad_t, torch.zeros_like(grad_t), EXACT)


# --- inputs that the random matrix cannot tell apart ----------------------------------------

@pytest.mark.parametrize("vocab", [256000, 128256])
@pytest.mark.parametrize("mode", MODES)
def test_peaked_logits_bf16(mode, vocab, record_error):
    """Targets ln(V) + 2 above the rest: a kernel that rounds the logits to bf16 before the
    softmax has a gradient error about 1.2e-2 here, lfce about 2.2e-3 (test_check_helpers
    shows the comparison telling the two apart on CPU)."""
    x, w, b, y = peaked_inputs(256, 2048, vocab, torch.bfloat16)
    grad = upstream("mean", (), torch.bfloat16)
    ours = run_lfce(x, w, b, y, "mean", grad, mode=mode)
    ref = chunked_reference(x, w, b, y, "mean", grad)
    tol = replace(GRAD[torch.bfloat16], rel_l2=PEAKED_REL_L2)
    assert_close("loss (mean)", ours[0], ref[0], LOSS[torch.bfloat16], record_error)
    for name, actual, expected in zip(("grad_hidden", "grad_weight"), ours[1:3], ref[1:3]):
        assert_close(name, actual, expected, tol, record_error)


@pytest.mark.parametrize("mode", MODES)
def test_float16_mean_over_8192_tokens(mode, record_error):
    """dz = p / N is below fp16's smallest subnormal for most entries at this N unless the
    kernel keeps it representable (docs/options.md, fp16): zeroed grad_weight rows fail the per-row
    check and the rel. L2 (about 1.5e-2 when dz underflows)."""
    x, w, b, y = make_inputs(8192, 2304, 50257, torch.float16, bias=True)
    grad = upstream("mean", (), torch.float16)
    ours = run_lfce(x, w, b, y, "mean", grad, mode=mode)
    ref = chunked_reference(x, w, b, y, "mean", grad)
    assert_gradients_match(ours, ref, torch.float16, "mean", record_error)


# --- options and input layouts -------------------------------------------------------------

@pytest.mark.parametrize("options", [{"chunk_size": 256}, {"workspace_budget": 8 << 20}],
                         ids=["chunk256", "budget8MiB"])
def test_gradients_do_not_depend_on_the_vocab_chunk(options):
    """Recompute mode's backward: one vocabulary chunk by default here, several with the options
    (lfce_backward_chunk_size). Each grad_weight row and grad_bias element is computed whole by one
    chunk's kernels (K = tokens inside one CTA), from the same logits (the per-element logit GEMM
    does not depend on the chunk): bit-identical. grad_hidden sums the chunks' fp32 partials in a
    different order before its one rounding to bf16: at most one bf16 step apart, beyond an fp32
    reassociation slack. (The loss comes from the forward, which has no vocabulary chunk.)"""
    n, h, v = 64, 2304, 151937
    problem = _lib.make_problem(n, h, v, _lib.DTYPE_BF16, has_bias=True, **options)
    assert _lib.backward_chunk_size(problem) < v == _lib.backward_chunk_size(_lib.make_problem(n, h, v, _lib.DTYPE_BF16))
    x, w, b, y = make_inputs(n, h, v, torch.bfloat16, bias=True)
    grad = upstream("mean", (), torch.bfloat16)
    default = run_lfce(x, w, b, y, "mean", grad)
    chunked = run_lfce(x, w, b, y, "mean", grad, **options)
    for i, name in ((0, "loss"), (2, "grad_weight"), (3, "grad_bias")):
        assert_bitwise_equal(name, chunked[i], default[i])
    # atol: grad_hidden elements are sums over V of terms far larger than some results (they
    # cancel); the fp32 partial sums regroup with the chunks (measured on the H200: up to 4
    # elements of 147456 a few bf16 steps apart at 1e-5 of the largest element).
    assert_within_one_ulp("grad_hidden", chunked[1], default[1], atol=1e-3)


# Eager mode's chunk_size / workspace_budget choose the token chunks of its three-GEMM forward,
# which computes the loss chunk by chunk: 300 tokens in chunks of 128 (3 chunks) either way.
EAGER_N, EAGER_V = 300, 151937
TOKEN_CHUNKS = {"chunk128": {"chunk_size": 128}, "budget128rows": {"workspace_budget": 128 * EAGER_V * 2}}


@pytest.mark.parametrize("options", list(TOKEN_CHUNKS.values()), ids=list(TOKEN_CHUNKS))
def test_eager_results_do_not_depend_on_the_token_chunk(options):
    """Each token's logits, LSE, loss, dz and grad_hidden row (K = V) are computed the same way
    whatever chunk holds it: the loss and grad_hidden bit-identical to one chunk of all 300 tokens
    (the default here: its [300, V] workspace fits in an eighth of the free memory). grad_weight /
    grad_bias sum the chunks' fp32 partial products in another grouping before their one rounding:
    within one bf16 step, beyond an fp32 reassociation slack."""
    h = 2304
    for given, chunks in ((options, 3), ({}, 1)):
        three_gemm, chunk = _lib.eager_schedule(_lib.make_problem(EAGER_N, h, EAGER_V, _lib.DTYPE_BF16, has_bias=True,
                                                                  mode=_lib.MODE_EAGER, **given))
        assert three_gemm and -(-EAGER_N // chunk) == chunks, f"{given}: chunks of {chunk}, expected {chunks} chunks"
    x, w, b, y = make_inputs(EAGER_N, h, EAGER_V, torch.bfloat16, bias=True)
    grad = upstream("mean", (), torch.bfloat16)
    whole = run_lfce(x, w, b, y, "mean", grad, mode="eager")
    chunked = run_lfce(x, w, b, y, "mean", grad, mode="eager", **options)
    assert_bitwise_equal("loss", chunked[0], whole[0])
    assert_bitwise_equal("grad_hidden", chunked[1], whole[1])
    # atol: sums of 300 products, some cancelling, regrouped by the chunks (measured on the H200: 47221
    # of 350 million grad_weight elements differ, 2 of them by two bf16 steps, 1.5e-5 or 3.5e-3 of the
    # largest element, which is small: 0.0044, a mean over 300 tokens).
    assert_within_one_ulp("grad_weight", chunked[2], whole[2], atol=5e-3)
    assert_within_one_ulp("grad_bias", chunked[3], whole[3], atol=5e-3)


def test_non_contiguous_hidden(record_error):
    x, w, b, y = make_inputs(257, 2304, 50257, torch.bfloat16)
    x_t = x.t().contiguous().t()  # same values, column-major
    assert not x_t.is_contiguous()
    grad = upstream("mean", (), torch.bfloat16)
    assert_gradients_match(run_lfce(x_t, w, b, y, "mean", grad), reference(x, w, b, y, "mean", grad),
                           torch.bfloat16, "mean", record_error)


def test_int32_targets(record_error):
    x, w, b, y = make_inputs(257, 2304, 50257, torch.bfloat16)
    grad = upstream("sum", (), torch.bfloat16)
    ours = run_lfce(x, w, b, y.int(), "sum", grad)
    assert_gradients_match(ours, reference(x, w, b, y, "sum", grad), torch.bfloat16, "sum", record_error)


@pytest.mark.parametrize("reduction", REDUCTIONS)
def test_three_dimensional_hidden(reduction, record_error):
    x, w, b, y = make_inputs(4 * 33, 2304, 50257, torch.bfloat16)
    x, y = x.reshape(4, 33, 2304), y.reshape(4, 33)
    grad = upstream(reduction, y.shape, torch.bfloat16)
    ours = run_lfce(x, w, b, y, reduction, grad)
    if reduction == "none":
        assert ours[0].shape == (4, 33)
    assert_gradients_match(ours, reference(x, w, b, y, reduction, grad), torch.bfloat16, reduction, record_error)


# Rows of H elements that are not a multiple of 16 bytes, read in place (no padded copy): the kernels copy them in the widest piece H allows (hidden_row_align), never by TMA.
# (N, H, V, dtype): bf16 H odd -> 2-byte element loads, 2 mod 4 -> 4-byte cp.async, 4 mod 8 ->
# 8 bytes; fp32 odd -> 4 bytes, 2 mod 4 -> 8 bytes; H = 7 and 3 are under one K tile.
ODD_HIDDEN = [
    (300, 4093, 5003, torch.bfloat16),
    (300, 4094, 5003, torch.bfloat16),
    (300, 4092, 5003, torch.bfloat16),
    (300, 7, 5003, torch.bfloat16),
    (65, 2302, 50257, torch.bfloat16),
    (300, 4093, 5003, torch.float16),
    (300, 4093, 5003, torch.float32),
    (300, 4094, 5003, torch.float32),
    (300, 7, 5003, torch.float32),
    (65, 2302, 50257, torch.float32),
]


@pytest.mark.parametrize("case", ODD_HIDDEN, ids=lambda c: "N%d-H%d-V%d-%s" % (c[0], c[1], c[2], dtype_id(c[3])))
@pytest.mark.parametrize("mode", MODES)
def test_hidden_size_not_a_multiple_of_16_bytes(mode, case, record_error):
    n, h, v, dtype = case
    check_case(record_error, n, h, v, True, dtype, "mean", mode)


@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float32], ids=dtype_id)
def test_odd_hidden_size_with_reduction_none(dtype, record_error):
    check_case(record_error, 300, 4093, 5003, True, dtype, "none", "recompute")


def test_float16(record_error):
    x, w, b, y = make_inputs(129, 2304, 50257, torch.float16, bias=True)
    grad = upstream("mean", (), torch.float16)
    assert_gradients_match(run_lfce(x, w, b, y, "mean", grad), reference(x, w, b, y, "mean", grad),
                           torch.float16, "mean", record_error)


def test_ignore_index_that_is_a_valid_class(record_error):
    x, w, b, y = make_inputs(257, 2304, 50257, torch.bfloat16, ignore_index=3)
    grad = upstream("mean", (), torch.bfloat16)
    ours = run_lfce(x, w, b, y, "mean", grad, ignore_index=3)
    assert_gradients_match(ours, reference(x, w, b, y, "mean", grad, ignore_index=3), torch.bfloat16, "mean",
                           record_error)


def test_frozen_weight_gets_no_gradient():
    x, w, _, y = make_inputs(64, 2304, 50257, torch.bfloat16)
    x = x.clone().requires_grad_()
    lfce.linear_cross_entropy(x, w, y).backward()
    assert w.grad is None
    assert x.grad is not None and x.grad.shape == x.shape


def test_module_matches_reference(record_error):
    """Loss and gradients through the module, with every option differing from the defaults."""
    x, w, b, y = make_inputs(64, 2304, 50257, torch.bfloat16, bias=True, ignore_index=3)
    module = lfce.LinearCrossEntropyLoss(ignore_index=3, reduction="sum", mode="eager", chunk_size=4096)
    grad = upstream("sum", (), torch.bfloat16)
    leaves = [t.detach().clone().requires_grad_() for t in (x, w, b)]
    loss = module(leaves[0], leaves[1], y, leaves[2])
    loss.backward(grad)
    ours = (loss.detach(),) + tuple(t.grad for t in leaves)
    assert_gradients_match(ours, reference(x, w, b, y, "sum", grad, ignore_index=3), torch.bfloat16, "sum",
                           record_error)
