"""weight_grad_accumulator / bias_grad_accumulator on the GPU: the grad_weight and grad_bias kernels
add their fp32 results into the buffers (Megatron's main_grad) in place.

* The buffers, holding random non-zero values of the gradients' size, end as those values + the
  fp64 reference gradients (checks.assert_close: relative L2, elementwise, per row, with the
  GRAD tolerance of the input dtype: the accumulated gradient skips the final rounding to the
  dtype, so it can only be closer); weight.grad and bias.grad stay None; grad_hidden is as
  without buffers. bf16 and fp32, mean and none (per-token upstream gradients).
* A second forward + backward adds again; a narrow vocabulary chunk gives bit-identical buffers
  (each row is computed whole inside one chunk and added once).
* No [V, H] temporary: the backward's peak allocation (reset_peak_memory_stats before it) is
  below that of the same call without a buffer by at least grad_weight's bytes (V·H in the
  input dtype, which the plain backward allocates and autograd stores in weight.grad), and
  beyond grad_hidden it is no more than the library's workspace.
* torch.compile(fullgraph=True) gives bit-identical buffers (the same kernels).
"""

import pytest
import torch
from checks import (
    GRAD,
    assert_bitwise_equal,
    assert_close,
    make_inputs,
    reference,
    upstream,
)

import lfce
from lfce import _lib, _ops

pytestmark = pytest.mark.gpu

MIB = 1 << 20
DTYPES = {"bf16": torch.bfloat16, "fp32": torch.float32}


def main_grads(ref_w, ref_b, seed=3):
    """fp32 buffers of random values with the reference gradients' spread (so that a kernel that
    overwrites instead of adding is off by about 70%, far outside any tolerance)."""
    g = torch.Generator(device="cuda").manual_seed(seed)
    main_w = (torch.randn(ref_w.shape, device="cuda", generator=g) * float(ref_w.std())).float()
    main_b = None if ref_b is None else (torch.randn(ref_b.shape, device="cuda", generator=g)
                                         * float(ref_b.std())).float()
    return main_w, main_b


def step(x, w, b, y, reduction, grad, main_w, main_b, **options):
    """One forward + backward on leaf copies into the buffers; (grad_hidden, weight.grad, bias.grad)."""
    x, w = (t.detach().clone().requires_grad_() for t in (x, w))
    b = None if b is None else b.detach().clone().requires_grad_()
    loss = lfce.linear_cross_entropy(x, w, y, b, reduction=reduction, weight_grad_accumulator=main_w,
                                     bias_grad_accumulator=main_b, **options)
    loss.backward(grad)
    return x.grad, w.grad, None if b is None else b.grad


@pytest.mark.parametrize("dtype", list(DTYPES))
@pytest.mark.parametrize("reduction", ["mean", "none"])
def test_buffers_end_as_old_values_plus_the_fp64_gradients(reduction, dtype, record_error):
    dtype = DTYPES[dtype]
    x, w, b, y = make_inputs(300, 512, 64007, dtype, bias=True)
    grad = upstream(reduction, y.shape, dtype)
    _, ref_x, ref_w, ref_b = reference(x, w, b, y, reduction, grad)
    main_w, main_b = main_grads(ref_w, ref_b)
    old_w, old_b = main_w.double(), main_b.double()
    grad_x, grad_w, grad_b = step(x, w, b, y, reduction, grad, main_w, main_b)
    assert grad_w is None, "weight got a gradient though it went into weight_grad_accumulator"
    assert grad_b is None, "bias got a gradient though it went into bias_grad_accumulator"
    assert main_w.dtype == torch.float32 and main_b.dtype == torch.float32
    assert_close("weight_grad_accumulator", main_w, old_w + ref_w, GRAD[dtype], record_error)
    assert_close("bias_grad_accumulator", main_b, old_b + ref_b, GRAD[dtype], record_error)
    assert_close("grad_hidden", grad_x, ref_x, GRAD[dtype], record_error)


def test_two_backward_passes_add_twice(record_error):
    x, w, b, y = make_inputs(300, 512, 64007, torch.bfloat16, bias=True)
    grad = upstream("mean", y.shape, torch.bfloat16)
    _, _, ref_w, ref_b = reference(x, w, b, y, "mean", grad)
    main_w, main_b = main_grads(ref_w, ref_b)
    old_w, old_b = main_w.double(), main_b.double()
    for _ in range(2):
        step(x, w, b, y, "mean", grad, main_w, main_b)
    assert_close("weight_grad_accumulator after two steps", main_w, old_w + 2 * ref_w, GRAD[torch.bfloat16],
                 record_error)
    assert_close("bias_grad_accumulator after two steps", main_b, old_b + 2 * ref_b, GRAD[torch.bfloat16],
                 record_error)


def test_a_narrow_vocabulary_chunk_gives_bit_identical_buffers():
    x, w, b, y = make_inputs(64, 2304, 151937, torch.bfloat16, bias=True)
    grad = upstream("mean", y.shape, torch.bfloat16)
    start_w = torch.randn(w.shape, device="cuda") * 1e-3
    start_b = torch.randn(b.shape, device="cuda") * 1e-3
    results = []
    for chunk_size in (None, 256):
        main_w, main_b = start_w.clone(), start_b.clone()
        step(x, w, b, y, "mean", grad, main_w, main_b, chunk_size=chunk_size)
        results.append((main_w, main_b))
    assert_bitwise_equal("weight_grad_accumulator, chunk 256 against the default", results[1][0], results[0][0])
    assert_bitwise_equal("bias_grad_accumulator, chunk 256 against the default", results[1][1], results[0][1])


def test_a_frozen_weight_leaves_its_buffer_untouched():
    x, w, _, y = make_inputs(96, 256, 5000, torch.bfloat16)
    main_w = torch.randn(w.shape, device="cuda")
    before = main_w.clone()
    x = x.requires_grad_()
    lfce.linear_cross_entropy(x, w, y, weight_grad_accumulator=main_w).backward()  # w does not require grad
    assert_bitwise_equal("weight_grad_accumulator of a frozen weight", main_w, before)
    assert x.grad is not None


def test_compiled_call_fills_the_buffers_as_an_eager_one():
    import torch._dynamo.testing

    assert _ops.HAVE_CUSTOM_OPS, f"torch {torch.__version__} has no torch.library.custom_op (PyTorch 2.4+)"
    torch._dynamo.reset()
    x, w, b, y = make_inputs(74, 256, 3000, torch.bfloat16, bias=True)
    start_w, start_b = torch.randn(w.shape, device="cuda"), torch.randn(b.shape, device="cuda")
    counter = torch._dynamo.testing.CompileCounterWithBackend("inductor")

    def call(x, w, b, y, main_w, main_b):
        return lfce.linear_cross_entropy(x, w, y, b, weight_grad_accumulator=main_w, bias_grad_accumulator=main_b)

    compiled = torch.compile(call, backend=counter, fullgraph=True)
    buffers = {}
    for name, fn in (("eager", call), ("compiled", compiled)):
        main_w, main_b = start_w.clone(), start_b.clone()
        xs, ws, bs = (t.detach().clone().requires_grad_() for t in (x, w, b))
        fn(xs, ws, bs, y, main_w, main_b).backward()
        assert ws.grad is None and bs.grad is None, f"{name}: weight or bias got a gradient"
        buffers[name] = (main_w, main_b)
    assert counter.frame_count == 1
    assert_bitwise_equal("compiled weight_grad_accumulator", buffers["compiled"][0], buffers["eager"][0])
    assert_bitwise_equal("compiled bias_grad_accumulator", buffers["compiled"][1], buffers["eager"][1])


# --- memory: no [V, H] temporary ------------------------------------------------------------------

N, H, V = 2048, 4096, 128256


def nbytes(tensor):
    return tensor.numel() * tensor.element_size()


def backward_peak(x, w, y, main_w):
    """Peak bytes allocated during one backward beyond what was allocated at its start."""
    loss = lfce.linear_cross_entropy(x, w, y, weight_grad_accumulator=main_w)
    torch.cuda.synchronize()
    start = torch.cuda.memory_allocated()
    torch.cuda.reset_peak_memory_stats()
    loss.backward()
    torch.cuda.synchronize()
    peak = torch.cuda.max_memory_allocated() - start
    x.grad = w.grad = None
    return peak


@pytest.mark.parametrize("dtype", list(DTYPES))
def test_backward_allocates_no_vocab_by_hidden_temporary(dtype):
    dtype = DTYPES[dtype]
    g = torch.Generator(device="cuda").manual_seed(0)
    x = torch.randn(N, H, device="cuda", generator=g).to(dtype).requires_grad_()
    w = (torch.randn(V, H, device="cuda", generator=g) * (2.5 / H ** 0.5)).to(dtype).requires_grad_()
    y = torch.randint(0, V, (N,), device="cuda", generator=g)
    main_w = torch.zeros(V, H, device="cuda")  # allocated in both runs: the same baseline
    for buffer in (None, main_w):  # warm-up: kernels loaded, allocator state in place
        backward_peak(x, w, y, buffer)
    plain = backward_peak(x, w, y, None)
    added = backward_peak(x, w, y, main_w)
    grad_weight = V * H * x.element_size()
    assert plain - added >= grad_weight - MIB, (
        "backward peak %.1f MiB with weight_grad_accumulator, %.1f MiB without: the saving %.1f MiB is below "
        "grad_weight's %.1f MiB" % (added / MIB, plain / MIB, (plain - added) / MIB, grad_weight / MIB))
    problem = _lib.make_problem(N, H, V, _ops.DTYPES[dtype], accumulate_grad_weight=True)
    workspace = _lib.backward_workspace_size(problem)
    grad_hidden = N * H * x.element_size()
    assert added <= grad_hidden + workspace + MIB, (
        "backward peak %.1f MiB with weight_grad_accumulator, above grad_hidden %.1f MiB + the workspace %.1f MiB "
        "+ 1 MiB" % (added / MIB, grad_hidden / MIB, workspace / MIB))
