"""lfce.transformers.apply_lfce without a GPU: what it refuses, and what it leaves unchanged.

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


def test_gemma2_is_refused_naming_its_logit_softcapping():
    model = transformers.Gemma2ForCausalLM(transformers.Gemma2Config(head_dim=16, **TINY))
    with pytest.raises(NotImplementedError, match="Gemma2ForCausalLM.*final_logit_softcapping"):
        lfce.transformers.apply_lfce(model)


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
