"""Which gradients the Python binding asks lfce_backward for, without a GPU.

A stand-in for the library records the lfce_backward_args it is handed; CPU tensors stand in
for CUDA ones. A gradient not wanted must be NULL in the call and never allocated (the GPU side
is tests/python/test_gpu_grad_skip.py). A gradient going into an accumulator is passed as the
accumulator's own pointer, with the problem's accumulate flag set, and allocated nowhere.
"""

import contextlib

import pytest
import torch

from lfce import _bridge, _lib, _ops
from lfce.options import LossOptions

N, H, V = 4, 16, 10


class FakeLibrary:
    def __init__(self):
        self.calls = []

    def lfce_backward(self, problem, args):
        a, p = args._obj, problem._obj  # the structs behind ctypes.byref
        self.calls.append({"grad_hidden": a.grad_hidden, "grad_weight": a.grad_weight, "grad_bias": a.grad_bias,
                           "accumulate": (p.accumulate_grad_weight, p.accumulate_grad_bias)})
        return _lib.OK


@pytest.fixture
def fake(monkeypatch):
    library = FakeLibrary()
    monkeypatch.setattr(_lib, "load", lambda: library)
    monkeypatch.setattr(_lib, "backward_workspace_size", lambda problem: 256)
    monkeypatch.setattr(_bridge, "_stream", lambda device: None)
    # CPU tensors: no device to switch to, no CUDA graph capture to ask about.
    monkeypatch.setattr(_bridge.torch.cuda, "device", lambda device: contextlib.nullcontext())
    monkeypatch.setattr(_bridge, "_require_loaded", lambda key, problem, what: None)
    # A CPU device has no index: stand in ordinal 0.
    args = _lib.BackwardArgs
    monkeypatch.setattr(_lib, "BackwardArgs", lambda device, **fields: args(device=device or 0, **fields))
    return library


def run_backward(wanted):
    hidden, weight, bias = torch.randn(N, H), torch.randn(V, H), torch.randn(V)
    targets, lse, count = torch.zeros(N, dtype=torch.int64), torch.zeros(N), torch.ones(1)
    return _bridge.backward(hidden, weight, bias, targets, LossOptions(), lse=lse, valid_count=count,
                            grad_loss=torch.ones(1), wanted=wanted)


@pytest.mark.parametrize("wanted", [(True, False, False), (False, True, False), (False, False, True),
                                    (True, False, True)], ids=["hidden", "weight", "bias", "hidden+bias"])
def test_backward_passes_null_for_and_allocates_no_gradient_not_wanted(fake, wanted):
    grads = run_backward(wanted)
    assert len(fake.calls) == 1
    for name, want, grad in zip(("grad_hidden", "grad_weight", "grad_bias"), wanted, grads):
        if want:
            assert grad is not None and fake.calls[0][name] == grad.data_ptr(), f"{name} wanted but not passed"
        else:
            assert grad is None, f"{name} allocated though not wanted"
            assert fake.calls[0][name] is None, f"{name} passed as {fake.calls[0][name]:#x} though not wanted"


def test_backward_with_no_gradient_wanted_calls_nothing(fake):
    assert run_backward((False, False, False)) == (None, None, None)
    assert fake.calls == []


@pytest.mark.parametrize("wanted", [(True, True, True), (True, False, True), (False, True, False)],
                         ids=["all", "frozen_weight", "weight"])
def test_backward_passes_each_accumulator_as_its_gradient_with_the_flag_set(fake, monkeypatch, wanted):
    hidden, weight, bias = torch.randn(N, H), torch.randn(V, H), torch.randn(V)
    targets, lse, count = torch.zeros(N, dtype=torch.int64), torch.zeros(N), torch.ones(1)
    main_w, main_b = torch.zeros(V, H), torch.zeros(V)
    forward = _ops.forward_inputs(hidden, weight, bias, targets, LossOptions(), weight_grad_accumulator=main_w,
                                  bias_grad_accumulator=main_b, wanted=wanted)
    grads = _ops._backward_impl(*_ops._backward_inputs(forward, lse=lse, valid_count=count, grad_loss=torch.ones(1)))
    call = fake.calls[0]
    assert call["accumulate"] == wanted[1:], "accumulate flags set only for the wanted gradients"
    for name, want, buffer in (("grad_weight", wanted[1], main_w), ("grad_bias", wanted[2], main_b)):
        assert call[name] == (buffer.data_ptr() if want else None), f"{name}: not the accumulator's pointer"
    assert [tuple(g.shape) for g in grads[1:]] == [(0,), (0,)], "a gradient added into its buffer is returned"
