"""Gradients autograd does not need are neither computed nor allocated (needs a GPU).

A frozen LM head (weight.requires_grad False, as in LoRA) must cost no [V, H] grad_weight,
a frozen input no grad_hidden; lfce passes NULL for them to lfce_backward, which then
neither compiles nor launches their kernels. Recompute mode decides at backward time
(ctx.needs_input_grad), eager mode at forward time (the inputs' requires_grad).

* The gradients that are computed are bit for bit those of a run that computes all of
  them (the skipped kernels only write their own outputs).
* Memory, measured with PyTorch's caching-allocator counters on a shape whose grad_weight
  (V·H·2 bytes, 1 GiB) dwarfs everything else: a recompute backward with a frozen weight
  allocates grad_hidden and the workspace only; an eager forward with a frozen weight holds
  grad_hidden only.
"""

import pytest
import torch
from checks import assert_bitwise_equal, make_inputs, upstream

import lfce
from lfce import _lib

pytestmark = pytest.mark.gpu

MODES = ["recompute", "eager"]
MIB = 1 << 20


def nbytes(tensor):
    return tensor.numel() * tensor.element_size()


# ---- the gradients computed equal those of a full run, bit for bit --------------------------

# N not a multiple of any tile; chunk_size 1024 gives five vocabulary chunks, so grad_hidden
# goes through the fp32 accumulator and its first/last-chunk steps.
SMALL = {"n": 300, "h": 512, "v": 5000}
SUBSETS = [("hidden",), ("weight",), ("bias",), ("hidden", "bias"), ("weight", "bias")]


def gradients(trainable, mode, seed=0):
    """{name: gradient} of a run where only the inputs named in ``trainable`` require grad."""
    x, w, b, y = make_inputs(SMALL["n"], SMALL["h"], SMALL["v"], torch.bfloat16, bias=True, seed=seed)
    inputs = {"hidden": x, "weight": w, "bias": b}
    for name, tensor in inputs.items():
        tensor.requires_grad_(name in trainable)
    loss = lfce.linear_cross_entropy(x, w, y, b, mode=mode, chunk_size=1024)
    names = [name for name in inputs if name in trainable]
    grads = torch.autograd.grad(loss, [inputs[n] for n in names], upstream("mean", (), torch.bfloat16))
    return loss.detach(), dict(zip(names, grads))


@pytest.mark.parametrize("trainable", SUBSETS, ids=["+".join(s) for s in SUBSETS])
@pytest.mark.parametrize("mode", MODES)
def test_gradients_of_a_trainable_subset_equal_those_of_a_full_run_bitwise(mode, trainable):
    full_loss, full = gradients(("hidden", "weight", "bias"), mode)
    loss, some = gradients(trainable, mode)
    assert sorted(some) == sorted(trainable), f"got gradients for {sorted(some)}, asked for {sorted(trainable)}"
    assert_bitwise_equal("loss", loss, full_loss)
    for name, grad in some.items():
        assert grad is not None, f"{name}: no gradient with only {trainable} trainable"
        assert_bitwise_equal(f"{name} (only {'+'.join(trainable)} trainable, {mode})", grad, full[name])


# ---- memory: no [V, H] grad_weight for a frozen head ----------------------------------------

N, H, V = 1024, 4096, 128256  # grad_weight: 1002 MiB; grad_hidden 8 MiB; workspace about 250 MiB


@pytest.fixture(scope="module")
def big():
    x, w, _, y = make_inputs(N, H, V, torch.bfloat16, ignore="some")
    return x, w, y


def frozen(big, which):
    """(hidden, weight, targets) sharing big's storage, with ``which`` not requiring grad."""
    x, w, y = big
    return x.detach().requires_grad_(which != "hidden"), w.detach().requires_grad_(which != "weight"), y


def backward_workspace():
    return _lib.backward_workspace_size(_lib.make_problem(N, H, V, _lib.DTYPE_BF16))


@pytest.mark.parametrize("which", ["weight", "hidden"])
def test_recompute_backward_allocates_no_gradient_of_a_frozen_input(big, which, record_property):
    x, w, y = frozen(big, which)
    trainable = w if which == "hidden" else x
    warm = lfce.linear_cross_entropy(x, w, y)  # kernels compiled, lazily allocated state in place
    torch.autograd.grad(warm, trainable)
    del warm
    loss = lfce.linear_cross_entropy(x, w, y)
    torch.cuda.synchronize()
    start = torch.cuda.memory_allocated()
    torch.cuda.reset_peak_memory_stats()
    (grad,) = torch.autograd.grad(loss, trainable)
    torch.cuda.synchronize()
    transient = torch.cuda.max_memory_allocated() - start
    skipped = nbytes(w if which == "weight" else x)
    bound = nbytes(grad) + backward_workspace() + MIB
    record_property("backward_peak_mib", transient / MIB)
    assert transient <= bound, (
        f"backward with a frozen {which} allocated {transient / MIB:.1f} MiB; its own gradient and workspace are "
        f"{(bound - MIB) / MIB:.1f} MiB (+1 MiB); the frozen {which}'s gradient would be {skipped / MIB:.1f} MiB")
    if which == "weight":
        assert transient < V * H * 2, f"backward allocated {transient / MIB:.1f} MiB, a [V, H] grad_weight's worth"


@pytest.mark.parametrize("which", ["weight", "hidden"])
def test_eager_forward_holds_no_gradient_of_a_frozen_input(big, which, record_property):
    x, w, y = frozen(big, which)
    trainable = w if which == "hidden" else x
    warm = lfce.linear_cross_entropy(x, w, y, mode="eager")
    torch.autograd.grad(warm, trainable)
    del warm
    torch.cuda.synchronize()
    before = torch.cuda.memory_allocated()
    loss = lfce.linear_cross_entropy(x, w, y, mode="eager")
    torch.cuda.synchronize()
    held = torch.cuda.memory_allocated() - before - nbytes(loss)
    kept = nbytes(trainable)
    record_property("held_mib", held / MIB)
    assert kept <= held <= kept + MIB, (
        f"eager forward with a frozen {which} held {held / MIB:.1f} MiB; the trainable input's gradient is "
        f"{kept / MIB:.1f} MiB (bound: that .. that + 1 MiB)")
    if which == "weight":
        assert held < V * H * 2, f"eager forward held {held / MIB:.1f} MiB, a [V, H] grad_weight's worth"
    (grad,) = torch.autograd.grad(loss, trainable)
    assert grad.shape == trainable.shape
