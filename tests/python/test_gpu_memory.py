"""What lfce keeps alive, measured with PyTorch's caching-allocator counters (needs a GPU).

Shape: llama3-8b's output layer at N = 4096 (H = 4096, V = 128256), bf16.

* Recompute mode holds only the log-sum-exp (4 bytes a token) and a count between
  forward and backward: bound 8·N bytes + 1 MiB of allocator rounding.
* Eager mode holds the gradients between forward and backward: their bytes, up to 1 MiB.
* The backward's transient memory beyond its own outputs (grad_hidden, grad_weight)
  is the workspace: a bf16 logit-gradient chunk of N_pad × chunk plus the fp32
  grad_hidden accumulator 4·N·H, + 1 MiB.
* A hidden size whose rows are not a multiple of 16 bytes makes no padded copy of hidden or
  weight (a smaller shape of its own).
"""

import pytest
import torch
from checks import make_inputs

import lfce
from lfce import _lib

pytestmark = pytest.mark.gpu

N, H, V = 4096, 4096, 128256
MIB = 1 << 20
ROW_PADDING = 256  # generous: no tile of lfce's kernels is taller than this


def nbytes(tensor):
    return tensor.numel() * tensor.element_size()


@pytest.fixture(scope="module")
def inputs():
    g = torch.Generator(device="cuda").manual_seed(0)
    x = torch.randn(N, H, device="cuda", generator=g).to(torch.bfloat16).requires_grad_()
    w = (torch.randn(V, H, device="cuda", generator=g) * (2.5 / H ** 0.5)).to(torch.bfloat16).requires_grad_()
    y = torch.randint(0, V, (N,), device="cuda", generator=g)
    y[::17] = -100
    return x, w, y


def measure(inputs, **options):
    """(held after forward, backward peak beyond its start and its gradients, workspace bytes)."""
    x, w, y = inputs
    # Warm-up: kernels compiled and any lazily allocated state (e.g. a BLAS workspace) in place.
    warm = lfce.linear_cross_entropy(x, w, y, **options)
    torch.autograd.grad(warm, (x, w), torch.ones_like(warm))
    del warm
    torch.cuda.synchronize()
    before = torch.cuda.memory_allocated()
    loss = lfce.linear_cross_entropy(x, w, y, **options)
    torch.cuda.synchronize()
    held = torch.cuda.memory_allocated() - before - nbytes(loss)

    start = torch.cuda.memory_allocated()
    torch.cuda.reset_peak_memory_stats()
    grad_x, grad_w = torch.autograd.grad(loss, (x, w), torch.ones_like(loss))
    torch.cuda.synchronize()
    transient = torch.cuda.max_memory_allocated() - start - nbytes(grad_x) - nbytes(grad_w)
    del loss, grad_x, grad_w
    return held, transient


def problem(**options):
    return _lib.make_problem(N, H, V, _lib.DTYPE_BF16, reduction=_lib.REDUCTION_MEAN,
                             mode=_lib.MODE_RECOMPUTE, **options)


def backward_bound(**options):
    """Allowed transient bytes of the backward, and a description for failure messages."""
    p = problem(**options)
    chunk = _lib.backward_chunk_size(p)
    n_pad = -(-N // ROW_PADDING) * ROW_PADDING
    bound = n_pad * chunk * 2 + 4 * N * H + MIB
    return bound, "chunk %d, library workspace %.1f MiB, bound %.1f MiB" % (
        chunk, _lib.backward_workspace_size(p) / MIB, bound / MIB)


@pytest.mark.parametrize("reduction", ["mean", "none"])
def test_recompute_holds_only_the_log_sum_exp(inputs, reduction):
    held, _ = measure(inputs, reduction=reduction)
    bound = 8 * N + MIB
    assert held <= bound, "held %d bytes between forward and backward; bound 8*N + 1 MiB = %d" % (held, bound)


def test_backward_transient_memory_is_the_workspace(inputs):
    _, transient = measure(inputs)
    bound, detail = backward_bound()
    assert transient <= bound, f"backward used {transient / MIB:.1f} MiB beyond its gradients; {detail}"


def test_workspace_budget_caps_the_backward(inputs):
    budget = 64 * MIB
    _, transient = measure(inputs, workspace_budget=budget)
    bound, detail = backward_bound(workspace_budget=budget)
    assert transient <= bound, f"backward used {transient / MIB:.1f} MiB beyond its gradients; {detail}"
    cap = budget + 4 * N * H + MIB
    assert transient <= cap, f"backward used {transient / MIB:.1f} MiB with a 64 MiB budget; cap budget + 4*N*H + 1 MiB = {cap / MIB:.1f} MiB"


def test_eager_holds_the_gradients(inputs, record_property):
    """Between forward and backward eager mode holds grad_hidden and grad_weight (in the input
    dtype) and nothing else of size: not less (it would be recomputing), not more than 1 MiB
    of allocator rounding beyond them."""
    x, w, _ = inputs
    held_recompute, _ = measure(inputs, mode="recompute")
    held_eager, transient_eager = measure(inputs, mode="eager")
    gradients = nbytes(x) + nbytes(w)
    record_property("held_recompute_mib", held_recompute / MIB)
    record_property("held_eager_mib", held_eager / MIB)
    record_property("backward_transient_eager_mib", transient_eager / MIB)
    print(f"held between forward and backward: recompute {held_recompute / MIB:.2f} MiB, eager {held_eager / MIB:.1f} MiB (gradients {gradients / MIB:.1f} MiB)")
    assert gradients <= held_eager <= gradients + MIB, (
        f"eager mode held {held_eager / MIB:.2f} MiB between forward and backward; its gradients are {gradients / MIB:.2f} MiB (bound: "
        "gradients .. gradients + 1 MiB)")


@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float32], ids=["bfloat16", "float32"])
@pytest.mark.parametrize("mode", ["recompute", "eager"])
def test_odd_hidden_size_makes_no_padded_copy(mode, dtype):
    """H = 4093 (rows not a multiple of 16 bytes) is read in place. Padding hidden
    and weight to a multiple of 8 (F.pad, as lfce did before) copies them: the weight's copy
    alone is about the weight's bytes, allocated in the forward and saved for the backward. So
    the forward's peak beyond what it started with, and what it leaves held, stay below half
    the weight's bytes beyond the gradients eager mode holds (lfce's own workspace here: the
    forward's partials, ~0.2 MiB, and in eager mode one logit-gradient chunk, 3-6 MiB)."""
    n, h, v = 300, 4093, 5003
    x, w, b, y = make_inputs(n, h, v, dtype, bias=True)
    x, w, b = (t.requires_grad_() for t in (x, w, b))
    lfce.linear_cross_entropy(x, w, y, b, mode=mode).backward()  # warm-up: kernels loaded
    x.grad = w.grad = b.grad = None
    torch.cuda.synchronize()
    before = torch.cuda.memory_allocated()
    torch.cuda.reset_peak_memory_stats()
    loss = lfce.linear_cross_entropy(x, w, y, b, mode=mode)
    torch.cuda.synchronize()
    peak = torch.cuda.max_memory_allocated() - before
    held = torch.cuda.memory_allocated() - before
    gradients = nbytes(x) + nbytes(w) + nbytes(b) if mode == "eager" else 0
    bound = gradients + nbytes(w) // 2
    detail = "gradients held %.1f MiB, weight %.1f MiB" % (gradients / MIB, nbytes(w) / MIB)
    assert peak <= bound, f"the forward's peak was {peak / MIB:.1f} MiB above its start, bound {bound / MIB:.1f} MiB ({detail})"
    assert held <= bound, f"the forward left {held / MIB:.1f} MiB held, bound {bound / MIB:.1f} MiB ({detail})"
    del loss


@pytest.mark.parametrize("budget", [None, 256 * MIB], ids=["one_chunk", "budget_256MiB"])
def test_eager_forward_peak_is_the_gradients_and_its_workspace(inputs, budget, record_property):
    """Eager mode's three-GEMM forward allocates the gradients it returns and its workspace,
    nothing else of size: one token chunk's [chunk, V] exponentials in bf16 and its partials, and
    with several chunks (a 256 MiB budget: 4 chunks of 1024 tokens here) the fp32 grad_weight sum
    [V, H]. Peak beyond the forward's start <= gradients + workspace + 1 MiB; held afterwards: the
    gradients alone (test_eager_holds_the_gradients)."""
    x, w, y = inputs
    options = {} if budget is None else {"workspace_budget": budget}
    problem = _lib.make_problem(N, H, V, _lib.DTYPE_BF16, mode=_lib.MODE_EAGER, workspace_budget=budget)
    three_gemm, chunk = _lib.eager_schedule(problem)
    assert three_gemm and chunk == (N if budget is None else 1024), (three_gemm, chunk)
    workspace = _lib.forward_backward_workspace_size(problem)
    warm = lfce.linear_cross_entropy(x, w, y, mode="eager", **options)
    torch.autograd.grad(warm, (x, w), torch.ones_like(warm))
    del warm
    torch.cuda.synchronize()
    before = torch.cuda.memory_allocated()
    torch.cuda.reset_peak_memory_stats()
    loss = lfce.linear_cross_entropy(x, w, y, mode="eager", **options)
    torch.cuda.synchronize()
    peak = torch.cuda.max_memory_allocated() - before
    gradients = nbytes(x) + nbytes(w)
    record_property("eager_forward_peak_mib", peak / MIB)
    record_property("eager_workspace_mib", workspace / MIB)
    print(f"eager forward peak {peak / MIB:.1f} MiB: gradients {gradients / MIB:.1f} MiB + workspace "
          f"{workspace / MIB:.1f} MiB ({-(-N // chunk)} token chunk(s) of {chunk})")
    bound = gradients + workspace + MIB
    assert peak <= bound, (f"the eager forward peaked {peak / MIB:.1f} MiB above its start; bound gradients + "
                           f"workspace + 1 MiB = {bound / MIB:.1f} MiB")
    if budget is not None:
        assert workspace >= 4 * V * H, "several chunks: the workspace holds the fp32 grad_weight sum"
    del loss
