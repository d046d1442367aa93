"""lfce.transformers.apply_lfce on tiny randomly initialised models (needs a CUDA GPU and transformers).

Each model is built from a config (no download), in fp32 so that lfce's exact fp32 kernels
leave only summation-order differences. A deep copy is patched; both run one training step on
the same batch (labels with -100 in them): the loss and the gradient of every parameter match
the unpatched model's, with and without num_items_in_batch, and the patched output has no
logits. Skipped (visibly) where transformers is not installed.
"""

import copy

import pytest
import torch

pytestmark = pytest.mark.gpu
transformers = pytest.importorskip("transformers", reason="transformers is not installed (optional dependency)")

import lfce.transformers

DEVICE = "cuda"
VOCAB, HIDDEN = 1000, 64
REL_L2 = 1e-4  # fp32 throughout: summation order only


def tiny_config(name):
    common = {"vocab_size": VOCAB, "hidden_size": HIDDEN, "intermediate_size": 128, "num_hidden_layers": 2,
              "num_attention_heads": 4, "num_key_value_heads": 2, "max_position_embeddings": 64}
    return getattr(transformers, name.replace("ForCausalLM", "Config"))(**common)


def tiny_model(name, seed=0):
    torch.manual_seed(seed)
    model = getattr(transformers, name)(tiny_config(name)).to(DEVICE, torch.float32)
    model.train()
    return model


def batch(seed=0, batch_size=2, length=17):
    g = torch.Generator().manual_seed(seed)
    input_ids = torch.randint(0, VOCAB, (batch_size, length), generator=g)
    labels = input_ids.clone()
    labels[0, :5] = -100  # a prompt that is not scored
    labels[1, -3:] = -100  # padding
    return input_ids.to(DEVICE), labels.to(DEVICE)


def rel_l2(actual, expected):
    actual, expected = actual.detach().double(), expected.detach().double()
    return float((actual - expected).norm() / expected.norm().clamp_min(1e-30))


def step(model, input_ids, labels, **kwargs):
    model.zero_grad(set_to_none=True)
    out = model(input_ids=input_ids, labels=labels, **kwargs)
    out.loss.backward()
    return out, {name: p.grad for name, p in model.named_parameters() if p.grad is not None}


def check_parity(name, **kwargs):
    reference = tiny_model(name)
    patched = lfce.transformers.apply_lfce(copy.deepcopy(reference))
    input_ids, labels = batch()
    ref_out, ref_grads = step(reference, input_ids, labels, **kwargs)
    out, grads = step(patched, input_ids, labels, **kwargs)
    assert out.logits is None, "the patched model materialised logits"
    assert out.loss.dtype == torch.float32
    assert rel_l2(out.loss, ref_out.loss) <= REL_L2, f"loss {float(out.loss)} vs {float(ref_out.loss)}"
    assert sorted(grads) == sorted(ref_grads), "the patched model's gradients cover other parameters"
    worst = max((rel_l2(grads[n], ref_grads[n]), n) for n in ref_grads)
    assert worst[0] <= REL_L2, f"gradient of {worst[1]}: relative L2 error {worst[0]:.3g} > {REL_L2}"


ARCHITECTURES = ["LlamaForCausalLM", "MistralForCausalLM", "Qwen2ForCausalLM"]


@pytest.mark.parametrize("name", ARCHITECTURES)
def test_patched_model_matches_the_loss_and_every_gradient(name):
    check_parity(name)


@pytest.mark.parametrize("name", ARCHITECTURES)
def test_patched_model_honours_num_items_in_batch(name):
    check_parity(name, num_items_in_batch=torch.tensor(23, device=DEVICE))


def test_patched_model_in_eval_mode_computes_the_logits_as_before():
    reference = tiny_model("LlamaForCausalLM").eval()
    patched = lfce.transformers.apply_lfce(copy.deepcopy(reference))
    input_ids, labels = batch()
    with torch.no_grad():
        ref_out = reference(input_ids=input_ids, labels=labels)
        out = patched(input_ids=input_ids, labels=labels)
    torch.testing.assert_close(out.logits, ref_out.logits)
    torch.testing.assert_close(out.loss, ref_out.loss)
