"""lfce.transformers.apply_lfce without a GPU: what it refuses, and what it leaves unchanged.

Skipped (visibly) where transformers is not installed (a failure in ctest's python.cpu.torch); the
loss and gradient parity tests are tests/python/test_gpu_transformers.py.
"""

import copy
import io
import pickle

import pytest
import torch
import torch.nn.functional as F
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


def test_patching_keeps_the_state_dict_the_class_name_and_is_idempotent():
    model = transformers.LlamaForCausalLM(transformers.LlamaConfig(**TINY))
    keys = list(model.state_dict())
    assert lfce.transformers.apply_lfce(model) is model
    patched = type(model)
    lfce.transformers.apply_lfce(model)
    assert type(model) is patched and isinstance(model, transformers.LlamaForCausalLM)
    assert type(model).__name__ == "LlamaForCausalLM"
    assert list(model.state_dict()) == keys
    assert isinstance(model.lm_head, torch.nn.Linear)


# --- the patch through copies, pickles and re-application (the loss computed on the CPU) -------------

@pytest.fixture
def lfce_calls(monkeypatch):
    """lfce's loss replaced by an fp64 CPU reference with the same arguments; records each call's options."""
    calls = []

    def reference(hidden, weight, targets, bias=None, *, ignore_index, reduction, shift, **options):
        calls.append(options)
        logits = F.linear(hidden.double(), weight.double(), None if bias is None else bias.double())
        if shift:
            logits, targets = logits[..., :-1, :], targets[..., 1:]
        return F.cross_entropy(logits.reshape(-1, logits.shape[-1]), targets.reshape(-1), ignore_index=ignore_index,
                               reduction=reduction).float()

    monkeypatch.setattr(lfce.transformers, "linear_cross_entropy", reference)
    return calls


def llama(seed=0):
    torch.manual_seed(seed)
    return transformers.LlamaForCausalLM(transformers.LlamaConfig(**TINY)).train()


def batch():
    generator = torch.Generator().manual_seed(1)
    ids = torch.randint(0, TINY["vocab_size"], (2, 9), generator=generator)
    labels = ids.clone()
    labels[0, :3] = -100
    return ids, labels


def stock_loss(model, ids, labels):
    """The model's own loss: its class's forward, logits materialised."""
    base = getattr(type(model), "_lfce_base", type(model))
    return base.forward(model, input_ids=ids, labels=labels).loss


def check_patched(model, calls, mode="recompute"):
    ids, labels = batch()
    before = len(calls)
    out = model(input_ids=ids, labels=labels)
    assert len(calls) == before + 1 and calls[-1]["mode"] == mode, calls
    assert out.logits is None
    torch.testing.assert_close(out.loss.double(), stock_loss(model, ids, labels).double(), rtol=1e-5, atol=1e-6)


def test_the_patch_survives_pickle(lfce_calls):
    model = lfce.transformers.apply_lfce(llama(), mode="eager")
    restored = pickle.loads(pickle.dumps(model))
    assert type(restored) is type(model) and type(restored).__name__ == "LlamaForCausalLM"
    assert restored._lfce_options["mode"] == "eager"
    check_patched(restored, lfce_calls, mode="eager")


def test_the_patch_survives_torch_save_and_load(lfce_calls):
    model = lfce.transformers.apply_lfce(llama())
    buffer = io.BytesIO()
    torch.save(model, buffer)
    buffer.seek(0)
    restored = torch.load(buffer, weights_only=False)
    check_patched(restored, lfce_calls)
    for name, tensor in model.state_dict().items():
        assert torch.equal(restored.state_dict()[name], tensor), name


@pytest.mark.parametrize("make_copy", [copy.copy, copy.deepcopy], ids=["copy", "deepcopy"])
def test_a_copy_in_eval_mode_computes_the_logits_and_the_original_still_uses_lfce(lfce_calls, make_copy):
    model = lfce.transformers.apply_lfce(llama())
    copied = make_copy(model)
    copied.training = False  # the copy's own flag (eval() would also switch a shallow copy's shared children)
    ids, labels = batch()
    out = copied(input_ids=ids, labels=labels)
    assert not lfce_calls and out.logits is not None
    check_patched(model, lfce_calls)


def test_a_deep_copy_computes_with_its_own_head(lfce_calls):
    model = lfce.transformers.apply_lfce(llama())
    copied = copy.deepcopy(model)
    with torch.no_grad():
        copied.lm_head.weight.mul_(2)
    check_patched(copied, lfce_calls)


def test_applying_again_replaces_the_options(lfce_calls):
    model = lfce.transformers.apply_lfce(llama())
    lfce.transformers.apply_lfce(model, mode="eager", chunk_size=64)
    check_patched(model, lfce_calls, mode="eager")
    assert lfce_calls[-1]["chunk_size"] == 64


def test_a_class_named_like_a_supported_model_that_is_not_one_is_named():
    class LlamaForCausalLM:  # not transformers' class
        pass

    with pytest.raises(TypeError, match="LlamaForCausalLM is named like a transformers model but is not one"):
        lfce.transformers.apply_lfce(LlamaForCausalLM())


def test_bad_mode_is_named():
    model = transformers.LlamaForCausalLM(transformers.LlamaConfig(**TINY))
    with pytest.raises(ValueError, match="'fast'"):
        lfce.transformers.apply_lfce(model, mode="fast")


def test_a_model_whose_forward_was_wrapped_on_the_instance_is_refused_naming_it():
    model = llama()
    model.forward = model.forward  # as accelerate's prepare leaves it: an instance attribute
    with pytest.raises(lfce.InvalidArgumentError, match="has its own forward attribute.*before wrapping it"):
        lfce.transformers.apply_lfce(model)


def test_a_head_replaced_after_the_patch_is_named_in_training(lfce_calls):
    model = lfce.transformers.apply_lfce(llama())
    model.lm_head = torch.nn.Linear(TINY["hidden_size"], TINY["vocab_size"], bias=False)
    ids, labels = batch()
    with pytest.raises(lfce.UsageError, match="lm_head .* was replaced after apply_lfce.*apply_lfce\\(model\\) again"):
        model(input_ids=ids, labels=labels)
    assert model.eval()(input_ids=ids).logits is not None  # without lfce's loss the stock forward runs
    lfce.transformers.apply_lfce(model.train())
    check_patched(model, lfce_calls)


def test_a_class_made_from_the_patched_one_survives_a_copy_as_itself(lfce_calls):
    model = lfce.transformers.apply_lfce(llama())
    wrapper = type("FSDPLlamaForCausalLM", (type(model),), {})  # as FSDP2's fully_shard makes one
    model.__class__ = wrapper
    copied = copy.deepcopy(model)
    assert type(copied) is wrapper
    check_patched(copied, lfce_calls)
