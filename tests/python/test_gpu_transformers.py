"""lfce.transformers.apply_lfce on the GPU: every served class that test_transformers.py builds, on tiny
randomly initialised models (needs a CUDA GPU and transformers).

A deep copy of each model is patched; both run one training step on the same batch (labels with
-100 in them, with and without num_items_in_batch), and so does a third copy in fp64, the anchor.
The loss matches the stock model's (fp32: 1e-4 relative; bf16, where the stock model rounds its
logits to bf16 before its fp32 loss and lfce keeps them in fp32: BF16_REL). The gradients are
measured against the fp64 ones: all of them together no further than the tolerance (relative L2)
or GRAD_SLACK times the stock model's own distance; and each parameter's within the tolerance of
its own norm, or of the model's RMS gradient times the square root of its size, or GRAD_SLACK times
the stock model's distance. A gradient small by cancellation (an attention key bias, whose exact
gradient is 0; a differential-attention lambda; a router's gate) is rounding noise in both models,
measured against the gradients' scale rather than its own norm (on the CPU, over 4 seeds and 5
models, the ratio of lfce's to the stock model's distance for such a 16-element lambda ranged from
0.25 to 9.9 while the whole-model distances stayed within 5% of each other). The patched output has
no logits. Skipped (visibly) where transformers is not installed.
"""

import copy
import math

import pytest
import torch

pytestmark = pytest.mark.gpu
transformers = pytest.importorskip("transformers", reason="transformers is not installed (optional dependency)")

from test_transformers import (
    CAUSAL,
    NOT_BUILT,
    TEXT_ONLY_INPUTS,
    batch,
    rel,
    step,
    tiny_model,
)

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
    if name in TEXT_ONLY_INPUTS:  # what the model needs besides input_ids on a text-only batch
        kwargs = {**TEXT_ONLY_INPUTS[name](input_ids), **kwargs}
    ref_out, ref_grads = step(reference, input_ids=input_ids, labels=labels, use_cache=False, **kwargs)
    out, grads = step(patched, input_ids=input_ids, labels=labels, use_cache=False, **kwargs)
    _, exact_grads = step(exact, input_ids=input_ids, labels=labels, use_cache=False, **kwargs)
    assert out.logits is None, "the patched model materialised logits"
    assert out.loss.dtype == torch.float32
    assert rel(out.loss, ref_out.loss) <= tolerance, f"loss {float(out.loss)} vs {float(ref_out.loss)}"
    assert sorted(grads) == sorted(ref_grads), "the patched model's gradients cover other parameters"
    sizes = {n: g.numel() for n, g in exact_grads.items()}
    total = math.sqrt(sum(float(g.double().norm()) ** 2 for g in exact_grads.values()))
    rms = total / math.sqrt(sum(sizes.values()))
    lfce_errors = {n: distance(grads[n], g) for n, g in exact_grads.items()}
    stock_errors = {n: distance(ref_grads[n], g) for n, g in exact_grads.items()}
    whole_lfce, whole_stock = (math.sqrt(sum(e * e for e in errors.values())) for errors in (lfce_errors, stock_errors))
    assert whole_lfce <= max(tolerance * total, GRAD_SLACK * whole_stock), (
        f"all gradients: {whole_lfce:.3g} from fp64 (relative {whole_lfce / total:.3g}), over {tolerance:g} "
        f"relative and over {GRAD_SLACK:g} x the stock model's {whole_stock:.3g}")
    for n, g64 in exact_grads.items():
        allowed = max(tolerance * float(g64.double().norm()), tolerance * rms * math.sqrt(sizes[n]),
                      GRAD_SLACK * stock_errors[n])
        assert lfce_errors[n] <= allowed, (
            f"gradient of {n}: {lfce_errors[n]:.3g} from fp64 (the stock model's: {stock_errors[n]:.3g}), over the "
            f"{allowed:.3g} allowed")


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
