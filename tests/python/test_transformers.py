"""lfce.transformers.apply_lfce without a GPU: what it refuses, what it leaves unchanged, and (with
a CPU model of lfce's loss in its place) what it hands lfce.

Skipped (visibly) where transformers is not installed (a failure in ctest's python.cpu.torch); the
loss and gradient parity tests are tests/python/test_gpu_transformers.py.
"""

import pytest
import torch
from conftest import missing_dependency

try:
    import transformers
except ImportError:
    pytest.skip(missing_dependency("transformers is not installed (optional dependency)"), allow_module_level=True)

import lfce.transformers

TINY = {"vocab_size": 128, "hidden_size": 32, "intermediate_size": 64, "num_hidden_layers": 1,
        "num_attention_heads": 2, "num_key_value_heads": 1, "max_position_embeddings": 32}


def cpu_lfce(hidden, weight, targets, bias=None, *, ignore_index, reduction, softcap, **options):
    """lfce's loss on the CPU, as its kernels define it (the softcap on the logits)."""
    logits = torch.nn.functional.linear(hidden, weight, bias).float()
    if softcap is not None:
        logits = softcap * torch.tanh(logits / softcap)
    return torch.nn.functional.cross_entropy(logits.flatten(0, -2), targets.flatten(), ignore_index=ignore_index,
                                             reduction=reduction)


def test_gemma2_hands_its_final_logit_softcapping_to_lfce_and_its_loss_is_unchanged(monkeypatch):
    """The patched Gemma 2 gives lfce the uncapped hidden states and the cap: the same loss."""
    torch.manual_seed(0)
    config = transformers.Gemma2Config(head_dim=16, final_logit_softcapping=2.0, **TINY)
    model = transformers.Gemma2ForCausalLM(config).train()
    input_ids = torch.randint(0, TINY["vocab_size"], (2, 9))
    expected = model(input_ids=input_ids, labels=input_ids).loss
    seen = []

    def spy(*args, **kwargs):
        seen.append(kwargs["softcap"])
        return cpu_lfce(*args, **kwargs)

    monkeypatch.setattr(lfce.transformers, "linear_cross_entropy", spy)
    lfce.transformers.apply_lfce(model)
    out = model(input_ids=input_ids, labels=input_ids)
    assert seen == [2.0] and model.config.final_logit_softcapping == 2.0
    assert out.logits is None
    torch.testing.assert_close(out.loss, expected)
    # Without the cap the loss differs: the test would notice a cap lost or applied twice.
    monkeypatch.setattr(lfce.transformers, "linear_cross_entropy",
                        lambda *a, **k: cpu_lfce(*a, **{**k, "softcap": None}))
    assert not torch.allclose(model(input_ids=input_ids, labels=input_ids).loss, expected)


def test_an_unsupported_model_is_named():
    with pytest.raises(ValueError, match="got Linear"):
        lfce.transformers.apply_lfce(torch.nn.Linear(4, 4))


def test_patching_keeps_the_state_dict_and_is_idempotent():
    model = transformers.LlamaForCausalLM(transformers.LlamaConfig(**TINY))
    keys = list(model.state_dict())
    assert lfce.transformers.apply_lfce(model) is model
    lfce.transformers.apply_lfce(model)
    assert list(model.state_dict()) == keys
    assert isinstance(model.lm_head, torch.nn.Linear)


def test_bad_mode_is_named():
    model = transformers.LlamaForCausalLM(transformers.LlamaConfig(**TINY))
    with pytest.raises(ValueError, match="'fast'"):
        lfce.transformers.apply_lfce(model, mode="fast")
