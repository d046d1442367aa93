"""Eager mode's three-GEMM schedule (lfce_forward_backward) on the GPU: the logits GEMM
stores p̃ = exp(u - tile max), eager_dz forms dz from it once the LSE is known, and the two
gradient GEMMs read it. Checked against the fp64 references of checks.py and
test_gpu_numerics_options.py, at one token chunk (the default) and at several (chunk_size /
workspace_budget), for every dtype and reduction, with and without a bias, the options this
schedule forms dz for, and the peaked-logits bar; plus run-to-run bit equality and how the
results depend on the token chunk. Each test first asserts that the call really took the
three-GEMM schedule (lfce_eager_schedule) and loaded eager_logits, not dlogits_backward, for
its hidden size (a size no other test file uses). With LFCE_DEVICE_ARCH=sm_80 the same tests
run the mma.sync kernels (the staged epilogues).
"""

import os
from dataclasses import replace

import pytest
import torch
from checks import (
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
    shifted_problem,
    upstream,
)
from test_gpu_numerics_options import options_reference, predicted_inputs

import lfce
from lfce import _bridge, _lib, _ops

pytestmark = pytest.mark.gpu

# H = 1032 and 2056 appear in no other GPU test, so the kernels loaded for them are this file's.
N, H, V = 1000, 1032, 50257
DTYPES = [torch.bfloat16, torch.float16, torch.float32]
CHUNKS = {"one_chunk": {}, "chunks_of_256": {"chunk_size": 256}}


def dtype_id(dtype):
    return str(dtype).replace("torch.", "")


def schedule(n, h, v, dtype, **options):
    """(three_gemm, tokens per chunk) lfce_eager_schedule gives the problem."""
    problem = _lib.make_problem(n, h, v, _ops.DTYPES[dtype], mode=_lib.MODE_EAGER,
                                chunk_size=options.get("chunk_size"), workspace_budget=options.get("workspace_budget"),
                                temperature=options.get("temperature", 1.0),
                                z_loss_scale=options.get("z_loss_scale") or 0.0,
                                has_class_weight=options.get("class_weight") is not None,
                                token_scaling=options.get("token_scaling", False),
                                sequence_length=options.get("sequence_length", 0))
    return _lib.eager_schedule(problem)


def loaded_kinds(h):
    """The kernel kinds this process loaded for hidden size h."""
    return {k["spec"].split(";")[0] for k in lfce.kernel_load_stats() if f";H={h};" in k["spec"]}


def runs_hopper_kernels():
    """Whether this process runs the sm_90a kernels (an H100/H200 without LFCE_DEVICE_ARCH=sm_80)."""
    return torch.cuda.get_device_capability() == (9, 0) and os.environ.get("LFCE_DEVICE_ARCH", "") != "sm_80"


def loaded_specs(h, dtype):
    """The specs of the kernels this process loaded for hidden size h in ``dtype``."""
    name = {torch.bfloat16: "bf16", torch.float16: "fp16", torch.float32: "fp32"}[dtype]
    return [k["spec"] for k in lfce.kernel_load_stats() if f";H={h};" in k["spec"] and f";dtype={name};" in k["spec"]]


def assert_three_gemm(n, h, v, dtype, chunks, **options):
    three_gemm, chunk = schedule(n, h, v, dtype, **options)
    assert three_gemm, f"N={n} H={h} V={v} {options} does not take the three-GEMM schedule"
    assert -(-n // chunk) == chunks, f"{-(-n // chunk)} token chunks of {chunk}, expected {chunks}"


@pytest.mark.parametrize("chunks", list(CHUNKS), ids=list(CHUNKS))
@pytest.mark.parametrize("bias", [False, True], ids=["no_bias", "bias"])
@pytest.mark.parametrize("reduction", ["mean", "sum"])
@pytest.mark.parametrize("dtype", DTYPES, ids=dtype_id)
def test_eager_three_gemms_match_fp64(dtype, reduction, bias, chunks, record_error):
    options = CHUNKS[chunks]
    assert_three_gemm(N, H, V, dtype, 1 if not options else 4, **options)
    x, w, b, y = make_inputs(N, H, V, dtype, bias=bias)
    grad = upstream(reduction, (), dtype)
    ours = run_lfce(x, w, b, y, reduction, grad, mode="eager", **options)
    assert_gradients_match(ours, reference(x, w, b, y, reduction, grad), dtype, reduction, record_error)
    kinds = loaded_kinds(H)  # (eager_dz reads no H: its spec has H=0)
    assert "eager_logits" in kinds and "dlogits_backward" not in kinds and "lse_forward" not in kinds, kinds


# N = 2900, H = 2040 (in no other GPU test): eager's grad_weight and grad_input default to 128 x 256
# tiles on CTA pairs along M (Plan::tile, sharing B's tile), whose row blocks (23 of tokens, 393 of
# the vocabulary) and column blocks (8, the last 248 wide) all end inside the output: the pair's
# second CTA computes a tile wholly past M at the end.
PAIR_N, PAIR_H = 2900, 2040


@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float16], ids=dtype_id)
def test_eager_gradient_gemms_on_cta_pairs_along_m_match_fp64(dtype, record_error):
    assert_three_gemm(PAIR_N, PAIR_H, V, dtype, 1)
    x, w, b, y = make_inputs(PAIR_N, PAIR_H, V, dtype, bias=False)
    grad = upstream("mean", (), dtype)
    ours = run_lfce(x, w, b, y, "mean", grad, mode="eager")
    assert_gradients_match(ours, reference(x, w, b, y, "mean", grad), dtype, "mean", record_error)
    if runs_hopper_kernels():
        specs = loaded_specs(PAIR_H, dtype)
        for kind in ("grad_weight", "grad_input"):
            assert any(s.startswith(kind + ";") and "tile=128x256x64/wg2/s4/c2;" in s + ";" for s in specs), specs
        assert any(s.startswith("grad_weight;") and "eager_fixup=1" in s for s in specs), specs


# H = 8200 (in no other GPU test): eager_logits, untuned, runs two cooperative consumers on one
# 128 x 256 tile from lfce's kEagerLogitsCooperativeHidden (2048) on (Plan::tile), ping-pong's
# 64 x 256 below; K = 8200 (128 k-blocks, the last partial: many passes round the four stages) ends
# inside a 64-wide block, N = 600 inside a row block, V = 50257 inside a column block. (With a bias
# the tile is lse_forward's 128 x 256 at any H, not this rule's: that case checks the cooperative
# tile's staged epilogue.)
COOP_N, COOP_H = 600, 8200


@pytest.mark.parametrize(("dtype", "bias"), [(torch.bfloat16, False), (torch.bfloat16, True), (torch.float16, False)],
                         ids=["bf16", "bf16_bias", "fp16"])
def test_eager_logits_on_two_cooperative_consumers_match_fp64(dtype, bias, record_error):
    assert_three_gemm(COOP_N, COOP_H, V, dtype, 1)
    x, w, b, y = make_inputs(COOP_N, COOP_H, V, dtype, bias=bias)
    grad = upstream("mean", (), dtype)
    ours = run_lfce(x, w, b, y, "mean", grad, mode="eager")
    assert_gradients_match(ours, reference(x, w, b, y, "mean", grad), dtype, "mean", record_error)
    if runs_hopper_kernels():
        # (This process has loaded the other parametrisations' kernels too: the bias picks this one's.)
        specs = [s for s in loaded_specs(COOP_H, dtype) if s.startswith("eager_logits;") and f";bias={int(bias)};" in s]
        assert specs and all("tile=128x256x64/wg2/s4;" in s + ";" for s in specs), specs


def test_eager_reduction_none_runs_recompute_with_a_per_token_gradient(record_error):
    """A per-token upstream gradient cannot scale a grad_weight summed over tokens in the forward:
    reduction "none" in eager mode runs recompute (non-uniform upstream gradient here)."""
    x, w, b, y = make_inputs(257, H, V, torch.bfloat16, bias=True)
    grad = upstream("none", y.shape, torch.bfloat16)
    ours = run_lfce(x, w, b, y, "none", grad, mode="eager")
    assert_gradients_match(ours, reference(x, w, b, y, "none", grad), torch.bfloat16, "none", record_error)


@pytest.mark.parametrize("chunks", list(CHUNKS), ids=list(CHUNKS))
def test_eager_is_bitwise_deterministic(chunks):
    x, w, b, y = make_inputs(N, H, V, torch.bfloat16, bias=True)
    grad = upstream("mean", (), torch.bfloat16)
    first = run_lfce(x, w, b, y, "mean", grad, mode="eager", **CHUNKS[chunks])
    for _ in range(2):
        again = run_lfce(x, w, b, y, "mean", grad, mode="eager", **CHUNKS[chunks])
        for name, a, e in zip(("loss", "grad_hidden", "grad_weight", "grad_bias"), again, first):
            assert_bitwise_equal(name, a, e)


@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float32], ids=dtype_id)
def test_eager_results_do_not_depend_on_the_token_chunk(dtype):
    """Each token's row (its logits, LSE, dz and grad_hidden row over K = V) is computed the same
    way whatever chunk holds it: loss and grad_hidden bit-identical. grad_weight / grad_bias
    sum the chunks' fp32 partial products in another grouping before their one rounding: within
    one step of the dtype (fp32: its own reassociation)."""
    x, w, b, y = make_inputs(N, H, V, dtype, bias=True)
    grad = torch.ones((), device="cuda", dtype=dtype)  # eager's backward scales by it: exact at 1
    assert_three_gemm(N, H, V, dtype, 1)
    whole = run_lfce(x, w, b, y, "mean", grad, mode="eager")
    for options in ({"chunk_size": 128}, {"workspace_budget": 300 * V * x.element_size()}):
        three_gemm, chunk = schedule(N, H, V, dtype, **options)
        assert three_gemm and -(-N // chunk) >= 2, f"{options}: {-(-N // chunk)} token chunk(s) of {chunk}"
        chunked = run_lfce(x, w, b, y, "mean", grad, mode="eager", **options)
        assert_bitwise_equal("loss", chunked[0], whole[0])
        assert_bitwise_equal("grad_hidden", chunked[1], whole[1])
        # (fp32: sums of 1000 products, some cancelling, regrouped: a few elements 20 ulps apart,
        # at 2e-6 of the largest element, measured on the H200.)
        atol = 1e-5 if dtype == torch.float32 else 1e-4
        assert_within_one_ulp("grad_weight", chunked[2], whole[2], atol=atol)
        assert_within_one_ulp("grad_bias", chunked[3], whole[3], atol=atol)


@pytest.mark.parametrize("chunks", list(CHUNKS), ids=list(CHUNKS))
def test_eager_matches_recompute_within_the_rounding_of_p(chunks, record_error):
    """Eager rounds p̃ = exp(u - tile max) once more than recompute mode before dz's rounding (every
    element but the target, which it forms from the fp32 target logit): the two agree within the
    gradient tolerance (and each matches fp64: the tests above)."""
    x, w, b, y = make_inputs(N, H, V, torch.bfloat16)
    grad = upstream("mean", (), torch.bfloat16)
    eager = run_lfce(x, w, b, y, "mean", grad, mode="eager", **CHUNKS[chunks])
    recompute = run_lfce(x, w, b, y, "mean", grad, mode="recompute")
    assert_close("loss", eager[0], recompute[0], LOSS[torch.bfloat16], record_error)
    for i, name in ((1, "grad_hidden"), (2, "grad_weight")):
        assert_close(name, eager[i], recompute[i], GRAD[torch.bfloat16], record_error)


@pytest.mark.parametrize("grad_id", ["upstream_1", "upstream_random"])
@pytest.mark.parametrize("chunks", [{}, {"chunk_size": 64}], ids=["one_chunk", "chunks_of_64"])
def test_eager_peaked_logits_bf16(chunks, grad_id, record_error):
    """The peaked-logits bar of eager mode: gradient rel. L2 <= 2.5e-3 at V = 256000, as recompute mode
    (2.4e-3 there). The target's dz comes from its fp32 logit, and p̃ is stored in fp16 (11 bits), so
    the kernels add nearly nothing to recompute's error. That holds for the gradients eager mode
    computes, those of an upstream gradient of 1 (loss.backward()); another upstream gradient g
    scales the bf16 gradients in the autograd backward, one more rounding of each (2.96e-3 for
    grad_weight with an earlier eager schedule): bounded there by recompute's own test
    tolerance, PEAKED_REL_L2."""
    n, h, v = 256, 2056, 256000
    assert_three_gemm(n, h, v, torch.bfloat16, 4 if chunks else 1, **chunks)
    x, w, b, y = peaked_inputs(n, h, v, torch.bfloat16)
    unit = grad_id == "upstream_1"
    grad = torch.ones((), device="cuda", dtype=torch.bfloat16) if unit else upstream("mean", (), torch.bfloat16)
    ours = run_lfce(x, w, b, y, "mean", grad, mode="eager", **chunks)
    ref = chunked_reference(x, w, b, y, "mean", grad)
    tol = replace(GRAD[torch.bfloat16], rel_l2=2.5e-3 if unit else PEAKED_REL_L2)
    assert_close("loss (mean)", ours[0], ref[0], LOSS[torch.bfloat16], record_error)
    for name, actual, expected in zip(("grad_hidden", "grad_weight"), ours[1:3], ref[1:3]):
        assert_close(name, actual, expected, tol, record_error)


# The options eager_dz forms dz for (docs/design.md), on the three GEMMs at several token chunks (one
# chunk runs test_gpu_numerics_options.py's eager cases), with those tests' shape, inputs and
# tolerances, against the fp64 reference written there from the definitions. (At N = 1000,
# H = 1032, V = 50257 one grad_bias block of the temperature case was 1.06x the per-row tolerance
# in recompute and eager mode alike: docs/measurements.md#eager-accuracy.)
OPTIONS = {
    "temperature": {"temperature": 0.6},
    "z_loss": {"z_loss_scale": 0.05},
    "class_weights_z_loss": {"class_weight": True, "z_loss_scale": 0.05},
    "token_scaling": {"token_scaling": True},
}


@pytest.mark.parametrize("reduction", ["mean", "sum"])
@pytest.mark.parametrize("name", list(OPTIONS), ids=list(OPTIONS))
def test_eager_options_over_token_chunks_match_fp64(name, reduction, record_error):
    n, h, v = 300, 512, 64007
    options = dict(OPTIONS[name])
    if options.pop("class_weight", False):
        x, w, b, y, options["class_weight"] = predicted_inputs(n, h, v, torch.bfloat16, bias=True)
    else:
        x, w, b, y = make_inputs(n, h, v, torch.bfloat16, bias=True)
    options["chunk_size"] = 64
    # Token scales are an lse row after the N LSEs: with several chunks, the forward and recompute
    # backward (still exact); otherwise five chunks of the three GEMMs.
    three_gemm, chunk = schedule(n, h, v, torch.bfloat16, **options)
    assert three_gemm != bool(options.get("token_scaling")), (three_gemm, options)
    if three_gemm:
        assert chunk == 64, chunk
    grad = upstream(reduction, (), torch.bfloat16)
    ours = run_lfce(x, w, b, y, reduction, grad, mode="eager", **options)
    ref_options = {k: v for k, v in options.items() if k != "chunk_size"}
    ref, _ = options_reference(x, w, b, y, reduction, grad, **ref_options)
    assert_gradients_match(ours, ref, torch.bfloat16, reduction, record_error)


@pytest.mark.parametrize("chunks", [{}, {"chunk_size": 500}], ids=["one_chunk", "two_chunks"])
def test_eager_shift_matches_the_shifted_problem(chunks, record_error):
    """A causal shift reads target t + 1 in place; token chunks hold whole sequences."""
    batch, length = 4, 250
    x, w, b, y = make_inputs(batch * length, H, V, torch.bfloat16, bias=True)
    hidden, targets = x.reshape(batch, length, H), y.reshape(batch, length)
    targets[:, -1] = 7  # a class at every sequence's end, which the shift must not read
    assert_three_gemm(batch * length, H, V, torch.bfloat16, 2 if chunks else 1, sequence_length=length, **chunks)
    grad = upstream("mean", (), torch.bfloat16)
    loss, grad_x, grad_w, grad_b = run_lfce(hidden, w, b, targets, "mean", grad, mode="eager", shift=True, **chunks)
    assert int(torch.count_nonzero(grad_x[:, -1])) == 0, "the last position has no target but got a gradient"
    shifted_x, shifted_y = shifted_problem(hidden, targets)
    ref, _ = options_reference(shifted_x, w, b, shifted_y, "mean", grad)
    ours = (loss, grad_x[:, :-1].reshape(-1, H), grad_w, grad_b)
    assert_gradients_match(ours, ref, torch.bfloat16, "mean", record_error)


@pytest.mark.parametrize("dtype", DTYPES, ids=dtype_id)
@pytest.mark.parametrize("count", [1, 7, 8, 4099, 1 << 20])
def test_eager_backward_scaling_is_one_fp32_product_bit_for_bit(dtype, count):
    """lfce_scale_gradient (eager mode's backward outside torch.compile) against PyTorch's fp32
    product of the same gradient and the fp32 0-dim upstream gradient rounded once to the dtype (what
    the torch.compile path computes), bit for bit, at lengths that are and are not whole 8-element
    vectors; in place too. (torch.mul would round the upstream gradient to a 16-bit dtype first.)"""
    g = torch.Generator(device="cuda").manual_seed(count)
    gradient = torch.randn(count, device="cuda", generator=g).to(dtype)
    grad_loss = torch.randn((), device="cuda", generator=g) * 3
    expected = (gradient.float() * grad_loss).to(dtype)
    assert_bitwise_equal("scaled", _bridge.scaled(gradient, grad_loss), expected)
    assert_bitwise_equal("reference", _bridge.scaled_reference(gradient, grad_loss), expected)
    one = torch.ones((), device="cuda")
    assert_bitwise_equal("scaled by 1 into another buffer", _bridge.scaled(gradient, one), gradient)
    original = gradient.clone()
    assert _bridge.scaled(gradient, one, out=gradient) is gradient
    assert_bitwise_equal("scaled by 1 in place", gradient, original)
    assert _bridge.scaled(gradient, grad_loss, out=gradient) is gradient
    assert_bitwise_equal("scaled in place", gradient, expected)


def test_eager_backward_scales_in_place_once_and_refuses_a_second_backward():
    """Eager mode's backward scales the held gradients in place and returns them: the result is the
    fp32 product with the upstream gradient, and a second backward through the same forward
    (retain_graph) is refused, naming recompute mode, rather than scaling them twice."""
    x, w, _, y = make_inputs(300, 64, 1000, torch.bfloat16)
    x, w = x.detach().requires_grad_(), w.detach().requires_grad_()
    held = lfce.linear_cross_entropy(x, w, y, mode="eager", reduction="sum")
    grad = torch.tensor(0.37, device="cuda")
    torch.autograd.backward(held, grad, retain_graph=True)
    first = (x.grad.clone(), w.grad.clone())
    with pytest.raises(RuntimeError, match=r"second backward through the same forward .*mode='recompute'"):
        torch.autograd.backward(held, grad)
    x.grad = w.grad = None
    unit = lfce.linear_cross_entropy(x, w, y, mode="eager", reduction="sum")
    unit.backward()  # an upstream gradient of 1: the held gradients are returned as they are
    for name, scaled, plain in (("grad_hidden", first[0], x.grad), ("grad_weight", first[1], w.grad)):
        assert_bitwise_equal(name, scaled, (plain.float() * grad).to(plain.dtype))


FIXUP_CASES = {
    "bf16_one_chunk": (torch.bfloat16, False, {}),
    "bf16_bias_chunks_of_256": (torch.bfloat16, True, {"chunk_size": 256}),
    "fp16_one_chunk": (torch.float16, False, {}),
}


@pytest.mark.parametrize("case", list(FIXUP_CASES), ids=list(FIXUP_CASES))
def test_eager_fixup_in_grad_weight_gives_the_bits_of_eager_dz_pass(monkeypatch, case):
    """On sm_90a in 16-bit, grad_weight's producer warpgroup rewrites p̃ into dz ahead of its tiles
    (Plan::eager_fixup, the default) with eager_dz's own operations: every output bit-identical to
    LFCE_EXPERIMENTAL=eager_dz_kernel's separate pass, over a vocabulary and a token count that end inside a row
    block and a work item, with ignored targets, a bias, token chunks, and a frozen weight (no
    grad_weight: eager_dz's pass then runs)."""
    dtype, bias, options = FIXUP_CASES[case]
    x, w, b, y = make_inputs(N, H, V, dtype, bias=bias)
    grad = torch.ones((), device="cuda", dtype=dtype)

    def run(fixup, frozen_weight=False):
        if fixup == "1":
            monkeypatch.delenv("LFCE_EXPERIMENTAL", raising=False)
        else:
            monkeypatch.setenv("LFCE_EXPERIMENTAL", "eager_dz_kernel")
        lfce.reload_options()
        if frozen_weight:
            xl = x.detach().clone().requires_grad_()
            loss = lfce.linear_cross_entropy(xl, w, y, b, reduction="mean", mode="eager", **options)
            loss.backward(grad)
            result = (loss.detach(), xl.grad)
        else:
            result = run_lfce(x, w, b, y, "mean", grad, mode="eager", **options)
        specs = loaded_specs(H, dtype)
        return result, specs

    try:
        passed, _ = run("0")
        fused, specs = run("1")
        if runs_hopper_kernels():
            assert any(s.startswith("grad_weight") and "eager_fixup=1" in s for s in specs), specs
        for name, a, e in zip(("loss", "grad_hidden", "grad_weight", "grad_bias"), fused, passed):
            if name != "grad_bias" or bias:
                assert_bitwise_equal(name, a, e)
        frozen_pass, _ = run("0", frozen_weight=True)
        frozen_fused, _ = run("1", frozen_weight=True)
        for name, a, e in zip(("loss", "grad_hidden"), frozen_fused, frozen_pass):
            assert_bitwise_equal(name + " (frozen weight)", a, e)
        assert_bitwise_equal("grad_hidden (frozen weight against trained)", frozen_fused[1], fused[1])
    finally:
        monkeypatch.delenv("LFCE_EXPERIMENTAL", raising=False)
        lfce.reload_options()
