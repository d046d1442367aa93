"""lfce only enqueues work on the caller's current stream (needs a CUDA GPU).

* The current-stream test makes a wrong stream visible: the inputs are written on a side
  stream only after it has slept, into buffers that hold NaN until then, so a kernel
  enqueued anywhere else reads NaN (PyTorch's side streams do not wait for the legacy
  default stream, nor it for them).
* Forward + backward captured in a CUDA graph and replayed on new data: capture fails on
  any synchronisation, any allocation outside PyTorch's allocator and any launch on
  another stream, and the replay must compute from the new inputs (including a new
  count of valid tokens for the mean).
"""

import pytest
import torch
from checks import assert_gradients_match, make_inputs, reference, upstream

import lfce

pytestmark = pytest.mark.gpu

MODES = ["recompute", "eager"]
SLEEP_CYCLES = 1 << 29  # about a quarter of a second: far longer than enqueueing the calls below
BF16 = torch.bfloat16


def leaves(*tensors):
    return [None if t is None else t.detach().clone().requires_grad_() for t in tensors]


@pytest.mark.parametrize("mode", MODES)
def test_runs_on_the_current_stream(mode, record_error):
    x, w, b, y = make_inputs(257, 2304, 50257, BF16, bias=True)
    grad = upstream("mean", (), BF16)
    expected = reference(x, w, b, y, "mean", grad)
    lfce.linear_cross_entropy(*leaves(x, w), y, mode=mode).backward()  # compiled before the timed part
    slot_x, slot_w, slot_b = (torch.full_like(t, float("nan")) for t in (x, w, b))
    slot_y = torch.full_like(y, 0)
    torch.cuda.synchronize()
    side = torch.cuda.Stream()
    with torch.cuda.stream(side):
        torch.cuda._sleep(SLEEP_CYCLES)
        for slot, value in ((slot_x, x), (slot_w, w), (slot_b, b), (slot_y, y)):
            slot.copy_(value)
        lx, lw, lb = leaves(slot_x, slot_w, slot_b)
        loss = lfce.linear_cross_entropy(lx, lw, slot_y, lb, mode=mode)
        loss.backward(grad)
    torch.cuda.synchronize()
    assert_gradients_match((loss.detach(), lx.grad, lw.grad, lb.grad), expected, BF16, "mean", record_error)


@pytest.mark.parametrize("mode", MODES)
def test_forward_and_backward_make_no_synchronising_torch_call(mode):
    """PyTorch's sync debug mode sees only PyTorch's own synchronising calls (an .item(), a
    nonzero): it cannot see liblfce's driver calls. That lfce enqueues everything on the stream
    without synchronising is what the CUDA-graph replay test below proves (a synchronising call
    cannot be captured)."""
    if not hasattr(torch.cuda, "set_sync_debug_mode"):
        pytest.fail(f"torch {torch.__version__} has no torch.cuda.set_sync_debug_mode")
    x, w, b, y = make_inputs(64, 2304, 50257, BF16, bias=True)
    x.requires_grad_()
    w.requires_grad_()
    lfce.linear_cross_entropy(x, w, y, b, mode=mode).backward()  # compile first
    torch.cuda.synchronize()
    torch.cuda.set_sync_debug_mode("error")
    try:
        loss = lfce.linear_cross_entropy(x, w, y, b, mode=mode)
        loss.backward()
    finally:
        torch.cuda.set_sync_debug_mode("default")


@pytest.mark.parametrize("mode", MODES)
def test_forward_and_backward_replay_in_a_cuda_graph(mode, record_error):
    n, h, v = 257, 2304, 50257
    data = [make_inputs(n, h, v, BF16, bias=True, seed=1),
            make_inputs(n, h, v, BF16, bias=True, seed=2),
            make_inputs(n, h, v, BF16, bias=True, seed=3, ignore="none")]  # another valid count
    grad = upstream("mean", (), BF16)
    x, w, b = leaves(*data[0][:3])
    y = data[0][3].clone()

    def step():
        loss = lfce.linear_cross_entropy(x, w, y, b, mode=mode)
        return (loss,) + torch.autograd.grad(loss, (x, w, b), grad)

    # Warm-up on a side stream, as PyTorch asks before a capture: kernels compiled, autograd's
    # and the allocator's lazy state in place.
    side = torch.cuda.Stream()
    side.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(side):
        for _ in range(2):
            step()
    torch.cuda.current_stream().wait_stream(side)
    torch.cuda.synchronize()

    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        outputs = step()
    for new_x, new_w, new_b, new_y in data[1:]:
        with torch.no_grad():
            for slot, value in ((x, new_x), (w, new_w), (b, new_b), (y, new_y)):
                slot.copy_(value)
        graph.replay()
        torch.cuda.synchronize()
        assert_gradients_match(tuple(t.detach() for t in outputs), reference(new_x, new_w, new_b, new_y, "mean", grad),
                               BF16, "mean", record_error)
