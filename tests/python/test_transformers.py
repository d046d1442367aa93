"""lfce.transformers.apply_lfce without a GPU: every served class against its stock self, what it
refuses, and what it leaves unchanged.

Each served class of the pinned transformers is built from a tiny random config (no download) in
fp64, with lfce's CPU path computing the loss: a patched deep copy and the stock model run the same
batches (labels with -100 in them; num_items_in_batch; shift_labels; the router's logits for a
mixture of experts) and the loss and every parameter's gradient match to 1e-10 relative; in eval
mode the logits and generate() are the stock model's. The stock loss is taken in fp64 too (its
``logits.float()`` upcast replaced by the same computation in the logits' dtype); classes whose
forward casts the logits to fp32 itself are compared at fp32's tolerance. Skipped (visibly) where
transformers is not installed (a failure in ctest's python.cpu.torch).
"""

import copy
import io
import pickle
import re
import warnings

import pytest
import torch
import torch.nn.functional as F
from conftest import missing_dependency

try:
    import transformers
except ImportError:
    pytest.skip(missing_dependency("transformers is not installed (optional dependency)"), allow_module_level=True)

from transformers.loss import loss_utils
from transformers.models.auto import modeling_auto

import lfce.transformers

transformers.logging.set_verbosity_error()

VOCAB = 96
# The tiny sizes, each given to a config that has the field (hasattr on its defaults).
TINY = {"vocab_size": VOCAB, "hidden_size": 32, "intermediate_size": 48, "num_hidden_layers": 2,
        "num_attention_heads": 2, "num_key_value_heads": 2, "head_dim": 16, "max_position_embeddings": 64,
        "num_experts": 4, "num_local_experts": 4, "n_routed_experts": 4, "num_experts_per_tok": 2,
        "moe_intermediate_size": 16, "shared_expert_intermediate_size": 16, "n_layer": 2, "n_head": 2, "n_embd": 32,
        "n_positions": 64, "d_model": 32, "num_layers": 2, "num_heads": 2, "kv_lora_rank": 8, "q_lora_rank": 8,
        "qk_rope_head_dim": 16, "qk_nope_head_dim": 16, "v_head_dim": 16, "first_k_dense_replace": 1,
        "n_shared_experts": 1, "n_group": 1, "topk_group": 1, "rotary_dim": 8, "pad_token_id": 0, "bos_token_id": 1,
        "eos_token_id": 2, "router_aux_loss_coef": 0.25, "aux_loss_coef": 0.25,
        # state-space layers
        "mamba_n_heads": 4, "mamba_d_head": 16, "mamba_d_ssm": 64, "mamba_d_state": 8, "mamba_chunk_size": 8,
        "state_size": 8, "ssm_state_size": 8, "mamba_num_heads": 4, "mamba_head_dim": 16, "chunk_size": 8,
        "n_mamba_heads": 2, "attention_head_dim": 16, "mamba_dt_rank": 4, "time_step_rank": 4,
        "linear_key_head_dim": 8, "linear_value_head_dim": 8, "linear_num_key_heads": 2, "linear_num_value_heads": 2,
        "vocab_size_per_layer_input": VOCAB, "hidden_size_per_layer_input": 8, "n_groups": 1,
        # vision towers (built, not run: the batches are text only)
        "depth": 1, "embed_dim": 32, "out_hidden_size": 32, "projection_dim": 32, "image_size": 28, "patch_size": 14}
# Per-class changes to the tiny config (fields the generic sizes do not fit).
OVERRIDES = {
    "Gemma2ForCausalLM": {"final_logit_softcapping": 3.0},
    "Gemma3ForCausalLM": {"final_logit_softcapping": 3.0},
    "GraniteForCausalLM": {"logits_scaling": 3.0},
    "GraniteMoeForCausalLM": {"logits_scaling": 3.0},
    "GraniteMoeSharedForCausalLM": {"logits_scaling": 3.0},
    "GraniteMoeSWAForCausalLM": {"logits_scaling": 3.0},
    "GraniteSWAForCausalLM": {"logits_scaling": 3.0},
    "CohereForCausalLM": {"logit_scale": 0.3},
    "Cohere2ForCausalLM": {"logit_scale": 0.3},
    "Cohere2MoeForCausalLM": {"logit_scale": 0.3},
    "HyperCLOVAXForCausalLM": {"logits_scaling": 0.3},
    "FalconH1ForCausalLM": {"lm_head_multiplier": 0.3},
    "CTRLLMHeadModel": {"dff": 48},
    "KimiLinearForCausalLM": {"linear_head_dim": 8, "linear_num_heads": 2, "num_experts_per_token": 2,
                              "mlp_layer_types": ["dense", "sparse"]},
    "Mamba2ForCausalLM": {"num_heads": 4},
    "JambaForCausalLM": {"attn_layer_offset": 1, "attn_layer_period": 2},
    "RecurrentGemmaForCausalLM": {"num_hidden_layers": 3},  # its third block is attention
    "ZayaForCausalLM": {"num_experts_per_tok": 1},
    "GPTNeoForCausalLM": {"attention_types": [[["global", "local"], 1]]},
    "GraniteMoeHybridForCausalLM": {"layer_types": ["linear_attention", "full_attention"], "num_hidden_layers": 2},
    "Qwen2VLForConditionalGeneration": {"text_config": {"rope_parameters": {
        "rope_type": "default", "rope_theta": 10000.0, "mrope_section": [2, 3, 3]}}},
    "Qwen2_5_VLForConditionalGeneration": {"text_config": {"rope_parameters": {
        "rope_type": "default", "rope_theta": 10000.0, "mrope_section": [2, 3, 3]}}},
    "OPTForCausalLM": {"ffn_dim": 48, "word_embed_proj_dim": 32},
}
# Served classes whose tiny config this file does not build, with the reason (they are skipped, visibly).
NOT_BUILT = {
    "BltForCausalLM": "its byte-patch encoder's sizes are not among the tiny fields (96M parameters)",
    "CohereCompassForCausalLM": "its tiny config's layer types lack 'full_attention' (KeyError in the model)",
    "DbrxForCausalLM": "its attention sub-config is built without rope_theta (AttributeError)",
    "Dots3NoteForCausalLM": "its per-layer configs keep their full sizes (48M parameters)",
    "Gemma3nForCausalLM": "its KV-sharing layer pattern does not fit 2 layers",
    "Gemma3nForConditionalGeneration": "its activation sparsity pattern must list every layer (35)",
    "Gemma4ForConditionalGeneration": "its per-layer configs name layers up to 29",
    "Gemma4UnifiedForConditionalGeneration": "its per-layer configs name layers up to 29",
    "Lfm2MoeForCausalLM": "its tiny config leaves a layer list None (TypeError in the model)",
    "MiMoV2FlashForCausalLM": "its attention head split does not fit the tiny sizes",
    "Phi4MultimodalForCausalLM": "its audio and vision encoders keep their sizes (6M parameters)",
    "Qwen4ExpForCausalLM": "its tiny config leaves the linear-attention head sizes None",
    "Zamba2ForCausalLM": "its shared-block pattern needs its default layer count",
    "ZambaForCausalLM": "its shared-block weight tying needs its default layer count",
}
# Mixtures of experts whose stock forward fails with output_router_logits=True at the tiny config (IndexError
# in its router loss over an empty tuple of router logits): checked without the router's auxiliary loss.
NO_ROUTER_LOSS = {"DeepseekV4ForCausalLM", "FlintForCausalLM", "LagunaForCausalLM"}
UPCAST = {"MllamaForCausalLM", "NemotronHForCausalLM", "BltForCausalLM", "MambaForCausalLM", "Mamba2ForCausalLM",
          "FalconMambaForCausalLM", "BeamForCausalLM"}  # forwards that cast the logits to fp32 themselves
REL_FP64, REL_FP32 = 1e-10, 1e-5
MAX_PARAMETERS = 2_500_000

SERVED = lfce.transformers.supported()
# The served causal LMs, and the multimodal models among the served image-text-to-text ones whose tiny
# configs build here (run on text-only batches; the others' vision or audio configs need their own sizes).
MULTIMODAL = [
    "AriaForConditionalGeneration", "AyaVisionForConditionalGeneration", "Cosmos3OmniForConditionalGeneration",
    "DeepseekVLForConditionalGeneration", "EvollaForProteinText2Text", "Exaone4_5_ForConditionalGeneration",
    "Gemma3ForConditionalGeneration", "HyperCLOVAXVisionV2ForConditionalGeneration", "Idefics2ForConditionalGeneration",
    "Idefics3ForConditionalGeneration", "InternVLForConditionalGeneration", "Kimi_K25ForConditionalGeneration",
    "Lfm2VlForConditionalGeneration", "Lfm3VlForConditionalGeneration", "LightOnOcrForConditionalGeneration",
    "LlavaForConditionalGeneration", "LlavaNextForConditionalGeneration", "LlavaNextVideoForConditionalGeneration",
    "LlavaOnevisionForConditionalGeneration", "MiniCPMOcrForConditionalGeneration",
    "MiniCPMV4_6ForConditionalGeneration", "MiniCPMV4_7ForConditionalGeneration", "Mistral3ForConditionalGeneration",
    "MllamaForConditionalGeneration", "Ovis2ForConditionalGeneration", "PaliGemmaForConditionalGeneration",
    "QianfanOCRForConditionalGeneration", "Qwen2VLForConditionalGeneration", "Qwen2_5_VLForConditionalGeneration",
    "Qwen3VLForConditionalGeneration", "Qwen3VLMoeForConditionalGeneration", "Qwen3_5ForConditionalGeneration",
    "Qwen3_5MoeForConditionalGeneration", "SmolVLMForConditionalGeneration", "VideoLlama3ForConditionalGeneration",
    "VideoLlavaForConditionalGeneration", "VipLlavaForConditionalGeneration"]
CAUSAL = sorted((set(modeling_auto.MODEL_FOR_CAUSAL_LM_MAPPING_NAMES.values()) | set(MULTIMODAL)) & set(SERVED))


def exact_causal_lm_loss(logits, labels, vocab_size, num_items_in_batch=None, ignore_index=-100, shift_labels=None,
                         **kwargs):
    """transformers' ForCausalLMLoss in the logits' own dtype (it upcasts them to fp32 first)."""
    if shift_labels is None:
        shift_labels = F.pad(labels, (0, 1), value=ignore_index)[..., 1:]
    reduction = "sum" if num_items_in_batch is not None else "mean"
    loss = F.cross_entropy(logits.reshape(-1, vocab_size), shift_labels.reshape(-1).to(logits.device),
                           ignore_index=ignore_index, reduction=reduction)
    return loss / num_items_in_batch if num_items_in_batch is not None else loss


@pytest.fixture(autouse=True)
def fp64_stock_loss(monkeypatch):
    for key in ("ForCausalLM", "ForConditionalGeneration"):
        monkeypatch.setitem(loss_utils.LOSS_MAPPING, key, exact_causal_lm_loss)


def _has(config, key):
    try:
        return hasattr(config, key)
    except RuntimeError:  # a per-layer field of a config with layer configs (AmbiguousGlobalPerLayerAttributeError)
        return False


def tiny_fields(defaults):
    """The tiny sizes for a config with these defaults, its sub-configs' (text, vision) included."""
    kwargs = {key: value for key, value in TINY.items() if _has(defaults, key)}
    layer_types = getattr(defaults, "layer_types", None) if _has(defaults, "layer_types") else None
    if isinstance(layer_types, (list, tuple)) and layer_types:  # one layer of each kind, in the default order
        kinds = list(dict.fromkeys(layer_types))
        kwargs.update(layer_types=kinds, num_hidden_layers=len(kinds))
    for key in getattr(defaults, "sub_configs", {}):
        sub = getattr(defaults, key, None)
        if isinstance(sub, transformers.PretrainedConfig):
            kwargs[key] = {**sub.to_dict(), **tiny_fields(sub)}
    return kwargs


def tiny_config(name):
    config_class = getattr(transformers, name).config_class
    kwargs = tiny_fields(config_class())
    for key, value in OVERRIDES.get(name, {}).items():
        if isinstance(value, dict):
            kwargs[key] = {**kwargs[key], **value}
        else:
            kwargs[key] = value
    while True:
        try:
            return config_class(**kwargs, attn_implementation="eager", experts_implementation="eager")
        except AttributeError as error:  # a field this config derives (a property without a setter): not given
            derived = re.match(r"property '(\w+)' of '\w+' object has no setter", str(error))
            if derived is None or not {derived.group(1), "layer_types"} & set(kwargs):
                raise
            field = derived.group(1) if derived.group(1) in kwargs else "layer_types"  # layer_types sets it
            del kwargs[field]
            if field == "layer_types":
                kwargs["num_hidden_layers"] = OVERRIDES.get(name, {}).get("num_hidden_layers", TINY["num_hidden_layers"])


def tiny_model(name, dtype=torch.float64, seed=0):
    config = tiny_config(name)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        with torch.device("meta"):
            size = sum(p.numel() for p in getattr(transformers, name)(config).parameters())
        assert size <= MAX_PARAMETERS, f"{name}'s tiny config has {size} parameters: give it an override"
        torch.manual_seed(seed)
        return getattr(transformers, name)(config).to(dtype).train()


def batch(seed=1, batch_size=2, length=9):
    generator = torch.Generator().manual_seed(seed)
    ids = torch.randint(3, VOCAB, (batch_size, length), generator=generator)
    labels = ids.clone()
    labels[0, :3] = -100  # a prompt that is not scored
    labels[1, -2:] = -100  # padding
    return ids, labels


def rel(actual, expected, floor=1e-6):
    """The relative L2 error, relative to at least `floor` (a gradient that is 0 analytically, such as
    an attention key bias's, is rounding noise in both models)."""
    actual, expected = actual.detach().double(), expected.detach().double()
    return float((actual - expected).norm() / expected.norm().clamp_min(floor))


def step(model, **inputs):
    model.zero_grad(set_to_none=True)
    torch.manual_seed(2)  # the same dropout masks in both models
    out = model(**inputs)
    out.loss.backward()
    return out, {name: p.grad for name, p in model.named_parameters() if p.grad is not None}


def check_training_step(stock, patched, tolerance, **inputs):
    expected, expected_grads = step(stock, **inputs)
    out, grads = step(patched, **inputs)
    assert out.logits is None, "the patched model materialised logits"
    assert rel(out.loss, expected.loss) <= tolerance, f"loss {float(out.loss)!r} vs {float(expected.loss)!r}"
    assert sorted(grads) == sorted(expected_grads), "the patched model's gradients cover other parameters"
    worst = max((rel(grads[n], expected_grads[n]), n) for n in expected_grads)
    assert worst[0] <= tolerance, f"gradient of {worst[1]}: relative L2 error {worst[0]:.3g} > {tolerance:g}"
    return out


@pytest.mark.parametrize("name", CAUSAL)
def test_patched_model_matches_stock_loss_gradients_logits_and_generation(name):
    if name in NOT_BUILT:
        pytest.skip(f"{name}: no tiny config here ({NOT_BUILT[name]})")
    stock = tiny_model(name)
    patched = lfce.transformers.apply_lfce(copy.deepcopy(stock))
    tolerance = REL_FP32 if name in UPCAST else REL_FP64
    ids, labels = batch()
    moe = lfce.transformers._recipe(type(stock))[0].aux_coefficient is not None
    check_training_step(stock, patched, tolerance, input_ids=ids, labels=labels, use_cache=False)
    shift_labels = F.pad(labels, (0, 1), value=-100)[..., 1:]  # with the sum over num_items_in_batch
    check_training_step(stock, patched, tolerance, input_ids=ids, labels=labels, shift_labels=shift_labels,
                        num_items_in_batch=torch.tensor(11), use_cache=False)
    if moe and name not in NO_ROUTER_LOSS:
        check_training_step(stock, patched, tolerance, input_ids=ids, labels=labels, use_cache=False,
                            output_router_logits=True)
    stock.eval()
    patched.eval()
    with torch.no_grad():
        expected, out = stock(input_ids=ids, labels=labels), patched(input_ids=ids, labels=labels)
    torch.testing.assert_close(out.logits, expected.logits, rtol=0, atol=0)
    torch.testing.assert_close(out.loss, expected.loss, rtol=0, atol=0)
    generation = {"max_new_tokens": 3, "do_sample": False, "pad_token_id": 0}
    torch.testing.assert_close(patched.generate(ids[:1], **generation), stock.generate(ids[:1], **generation))


# --- what is served and what is refused ----------------------------------------------------------------

def test_the_served_list_has_the_common_families_and_the_softcapped_and_scaled_ones():
    for name in ("LlamaForCausalLM", "MistralForCausalLM", "Qwen2ForCausalLM", "Gemma2ForCausalLM",
                 "GraniteForCausalLM", "CohereForCausalLM", "MixtralForCausalLM", "FalconH1ForCausalLM"):
        assert name in SERVED, name


@pytest.mark.parametrize("name, reason", [
    ("RobertaForCausalLM", "RobertaLMHead\\(config\\)`, not a torch.nn.Linear"),
    ("BambaForCausalLM", "z_loss_coefficient"),
    ("InklingForCausalLM", "unpadded_vocab_size"),
    ("MusicgenForCausalLM", "assigns no torch.nn.Linear to self.lm_head"),
])
def test_a_class_that_is_not_served_is_named_with_the_reason(name, reason):
    cls = getattr(transformers, name)
    assert name not in SERVED
    model = cls.__new__(cls)
    torch.nn.Module.__init__(model)
    model.config = None
    model.get_output_embeddings = lambda: None
    with pytest.raises(NotImplementedError, match=f"{name} is not served: .*{reason}"):
        lfce.transformers.apply_lfce(model)


def test_an_unsupported_model_is_named():
    with pytest.raises(ValueError, match="got Linear"):
        lfce.transformers.apply_lfce(torch.nn.Linear(4, 4))


def test_patching_keeps_the_state_dict_the_class_name_and_is_idempotent():
    model = tiny_model("LlamaForCausalLM", torch.float32)
    keys = list(model.state_dict())
    assert lfce.transformers.apply_lfce(model) is model
    patched = type(model)
    lfce.transformers.apply_lfce(model)
    assert type(model) is patched and isinstance(model, transformers.LlamaForCausalLM)
    assert type(model).__name__ == "LlamaForCausalLM"
    assert list(model.state_dict()) == keys
    assert isinstance(model.lm_head, torch.nn.Linear)


# --- the patch through copies, pickles and re-application -----------------------------------------------

@pytest.fixture
def lfce_calls(monkeypatch):
    """Records the options of each call to lfce's loss (which still computes it)."""
    calls = []
    loss = lfce.transformers.linear_cross_entropy

    def recorded(*args, **options):
        calls.append(options)
        return loss(*args, **options)

    monkeypatch.setattr(lfce.transformers, "linear_cross_entropy", recorded)
    return calls


def llama(seed=0):
    return tiny_model("LlamaForCausalLM", seed=seed)


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
    torch.testing.assert_close(out.loss, stock_loss(model, ids, labels), rtol=1e-12, atol=0)


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


def test_a_config_changed_after_the_patch_is_honoured(lfce_calls):
    model = lfce.transformers.apply_lfce(tiny_model("Gemma2ForCausalLM"))
    model.config.final_logit_softcapping = 5.0
    check_patched(model, lfce_calls)
    assert lfce_calls[-1]["softcap"] == 5.0
    model.config.final_logit_softcapping = None
    check_patched(model, lfce_calls)
    assert "softcap" not in lfce_calls[-1]


def test_a_class_named_like_a_supported_model_that_is_not_one_is_named():
    class LlamaForCausalLM:  # not transformers' class
        pass

    with pytest.raises(TypeError, match="LlamaForCausalLM is named like a transformers model but is not one"):
        lfce.transformers.apply_lfce(LlamaForCausalLM())


def test_bad_mode_is_named():
    with pytest.raises(ValueError, match="'fast'"):
        lfce.transformers.apply_lfce(llama(), mode="fast")


def test_a_model_whose_forward_was_wrapped_on_the_instance_is_refused_naming_it():
    model = llama()
    model.forward = model.forward  # as accelerate's prepare leaves it: an instance attribute
    with pytest.raises(lfce.InvalidArgumentError, match="has its own forward attribute.*before wrapping it"):
        lfce.transformers.apply_lfce(model)


def test_a_head_replaced_after_the_patch_is_named_in_training(lfce_calls):
    model = lfce.transformers.apply_lfce(llama())
    model.lm_head = torch.nn.Linear(TINY["hidden_size"], VOCAB, bias=False, dtype=torch.float64)
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


def test_hooks_on_the_head_see_its_call_and_its_backward():
    model = lfce.transformers.apply_lfce(llama())
    seen = []
    model.lm_head.register_forward_pre_hook(lambda module, args: seen.append("forward"))
    model.lm_head.register_full_backward_pre_hook(lambda module, grad: seen.append("backward"))
    ids, labels = batch()
    model(input_ids=ids, labels=labels).loss.backward()
    assert seen == ["forward", "backward"]


# --- under transformers' Trainer ------------------------------------------------------------------------

class _Examples(torch.utils.data.Dataset):
    """Eight sequences, each with its own count of -100 labels (so num_items_in_batch matters)."""

    def __init__(self):
        generator = torch.Generator().manual_seed(3)
        self.ids = torch.randint(3, VOCAB, (8, 12), generator=generator)

    def __len__(self):
        return len(self.ids)

    def __getitem__(self, index):
        labels = self.ids[index].clone()
        labels[: index + 1] = -100
        return {"input_ids": self.ids[index], "labels": labels}


def trainer_losses(model, tmp_path):
    arguments = transformers.TrainingArguments(
        output_dir=str(tmp_path), use_cpu=True, report_to=[], per_device_train_batch_size=2,
        gradient_accumulation_steps=2, max_steps=3, learning_rate=1e-2, logging_steps=1, seed=0,
        save_strategy="no", disable_tqdm=True, dataloader_num_workers=0)
    trainer = transformers.Trainer(model=model, args=arguments, train_dataset=_Examples())
    trainer.train()
    return [entry["loss"] for entry in trainer.state.log_history if "loss" in entry]


def test_a_patched_model_under_the_trainer_gives_the_stock_per_step_losses(tmp_path):
    try:
        import accelerate  # noqa: F401  (transformers' Trainer needs it)
    except ImportError:
        pytest.skip(missing_dependency("accelerate is not installed (transformers' Trainer needs it)"))
    stock = tiny_model("LlamaForCausalLM", torch.float32)
    patched = lfce.transformers.apply_lfce(copy.deepcopy(stock))
    expected = trainer_losses(stock, tmp_path / "stock")
    losses = trainer_losses(patched, tmp_path / "patched")
    assert len(losses) == 3
    torch.testing.assert_close(torch.tensor(losses), torch.tensor(expected), rtol=1e-5, atol=0)


def test_a_model_with_a_loss_function_of_its_own_is_refused_naming_it():
    model = llama()
    model.loss_function = lambda logits, labels, vocab_size, **kwargs: logits.sum()
    with pytest.raises(NotImplementedError, match="LlamaForCausalLM computes its loss with a loss_function set on"):
        lfce.transformers.apply_lfce(model)
