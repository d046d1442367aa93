"""lfce.transformers.apply_lfce on the GPU: every served class that test_transformers.py builds, on tiny
randomly initialised models (needs a CUDA GPU and transformers).

A deep copy of each model is patched; both run one training step on the same batch (labels with
-100 in them, with and without num_items_in_batch): in fp32 the loss and every parameter's gradient
match the stock model's to summation order (1e-4 relative L2); in bf16 (the stock model's logits
rounded to bf16 before its fp32 loss, lfce's kept in fp32) to bf16's rounding (BF16_REL). The
patched output has no logits. Skipped (visibly) where transformers is not installed.
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


def check_parity(name, dtype, tolerance, **kwargs):
    if name in NOT_BUILT:
        pytest.skip(f"{name}: no tiny config ({NOT_BUILT[name]})")
    reference = tiny_model(name, dtype).to(DEVICE)
    patched = lfce.transformers.apply_lfce(copy.deepcopy(reference))
    input_ids, labels = (t.to(DEVICE) for t in batch(length=17))
    ref_out, ref_grads = step(reference, input_ids=input_ids, labels=labels, use_cache=False, **kwargs)
    out, grads = step(patched, input_ids=input_ids, labels=labels, use_cache=False, **kwargs)
    assert out.logits is None, "the patched model materialised logits"
    assert out.loss.dtype == torch.float32
    assert rel(out.loss, ref_out.loss) <= tolerance, f"loss {float(out.loss)} vs {float(ref_out.loss)}"
    assert sorted(grads) == sorted(ref_grads), "the patched model's gradients cover other parameters"
    worst = max((rel(grads[n], ref_grads[n]), n) for n in ref_grads)
    assert worst[0] <= tolerance, f"gradient of {worst[1]}: relative L2 error {worst[0]:.3g} > {tolerance}"


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
