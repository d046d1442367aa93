"""lfce.transformers.apply_lfce on the GPU: every served class that test_transformers.py builds, on tiny
randomly initialised models (needs a CUDA GPU and transformers).

A deep copy of each model is patched; both run one training step on the same batch (labels with
-100 in them, with and without num_items_in_batch), and so does a third copy in fp64, the anchor.
The loss matches the stock model's (fp32: 1e-4 relative; bf16, where the stock model rounds its
logits to bf16 before its fp32 loss and lfce keeps them in fp32: BF16_REL). Every parameter's
gradient is within the tolerance of the fp64 gradient (relative L2), or no further from it than
GRAD_SLACK times the stock model's own gradient: a gradient that is small by cancellation (an
attention key bias, whose exact gradient is 0; a router's gate; a differential-attention lambda) is
rounding noise in both models, and the patch must only not make it worse. The patched output has no
logits. Skipped (visibly) where transformers is not installed.
"""

import copy

import pytest
import torch

pytestmark = pytest.mark.gpu
transformers = pytest.importorskip("transformers", reason="transformers is not installed (optional dependency)")

from test_transformers import CAUSAL, NOT_BUILT, batch, rel, step, tiny_model

import lfce.transformers

DEVICE = "cuda"
FP32_REL, BF16_REL = 1e-4, 5e-2
GRAD_SLACK = 3.0


def distance(a, b):
    return float((a.detach().double() - b.detach().double()).norm())


def check_parity(name, dtype, tolerance, **kwargs):
    if name in NOT_BUILT:
        pytest.skip(f"{name}: no tiny config ({NOT_BUILT[name]})")
    reference = tiny_model(name, dtype).to(DEVICE)
    patched = lfce.transformers.apply_lfce(copy.deepcopy(reference))
    exact = copy.deepcopy(reference).double()  # the same weights in fp64: the anchor of both
    input_ids, labels = (t.to(DEVICE) for t in batch(length=17))
    ref_out, ref_grads = step(reference, input_ids=input_ids, labels=labels, use_cache=False, **kwargs)
    out, grads = step(patched, input_ids=input_ids, labels=labels, use_cache=False, **kwargs)
    _, exact_grads = step(exact, input_ids=input_ids, labels=labels, use_cache=False, **kwargs)
    assert out.logits is None, "the patched model materialised logits"
    assert out.loss.dtype == torch.float32
    assert rel(out.loss, ref_out.loss) <= tolerance, f"loss {float(out.loss)} vs {float(ref_out.loss)}"
    assert sorted(grads) == sorted(ref_grads), "the patched model's gradients cover other parameters"
    for n, g64 in exact_grads.items():
        lfce_error, stock_error = distance(grads[n], g64), distance(ref_grads[n], g64)
        scale = float(g64.norm())
        assert lfce_error <= max(tolerance * scale, GRAD_SLACK * stock_error), (
            f"gradient of {n}: {lfce_error:.3g} from fp64 (relative {lfce_error / max(scale, 1e-300):.3g}), "
            f"over {tolerance:g} relative and over {GRAD_SLACK:g} x the stock model's {stock_error:.3g}")


@pytest.mark.parametrize("name", CAUSAL)
def test_patched_model_matches_the_loss_and_every_gradient_in_fp32(name):
    check_parity(name, torch.float32, FP32_REL)
    check_parity(name, torch.float32, FP32_REL, num_items_in_batch=torch.tensor(23, device=DEVICE))


@pytest.mark.parametrize("name", CAUSAL)
def test_patched_model_matches_the_stock_model_in_bf16(name):
    check_parity(name, torch.bfloat16, BF16_REL)


def test_patched_model_in_eval_mode_computes_the_logits_as_before():
    reference = tiny_model("LlamaForCausalLM", torch.float32).to(DEVICE).eval()
    patched = lfce.transformers.apply_lfce(copy.deepcopy(reference))
    input_ids, labels = (t.to(DEVICE) for t in batch())
    with torch.no_grad():
        ref_out = reference(input_ids=input_ids, labels=labels)
        out = patched(input_ids=input_ids, labels=labels)
    torch.testing.assert_close(out.logits, ref_out.logits)
    torch.testing.assert_close(out.loss, ref_out.loss)
