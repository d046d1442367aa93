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

import lfce.transformers

transformers.logging.set_verbosity_error()

VOCAB = 96
# The tiny sizes, each given to a config that has the field (hasattr on its defaults) unless its default is a
# list or a dict; its per-layer lists and per_layer_config are cut to one layer of each kind (_tiny_layers).
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
SAM_VISION = {"output_channels": 8, "mlp_dim": 48, "global_attn_indexes": [1]}  # a SAM image encoder's sizes
QWEN4_EXP_INDEXER = {"indexer_n_heads": 2, "indexer_kv_heads": 1, "indexer_head_dim": 16, "indexer_budget": 8,
                     "indexer_compress_ratio": 4}
# Gemma 3n's decoder: its last layers reuse the KV cache of the last earlier layer of their kind
GEMMA3N_TEXT = {"layer_types": ["sliding_attention", "full_attention"] * 2, "num_hidden_layers": 4,
                "num_kv_shared_layers": 2, "intermediate_size": [48] * 4, "laurel_rank": 8,
                "activation_sparsity_pattern": [0.95, 0.0, 0.0, 0.0]}


def timm_stand_in(**fields):
    """A SigLIP vision tower's config in place of a timm one (timm, which builds those, is no dependency of this
    test): built but never run, as the batches are text only; fields: what the model reads from it."""
    return transformers.SiglipVisionConfig(hidden_size=32, intermediate_size=48, num_hidden_layers=1,
                                           num_attention_heads=2, image_size=28, patch_size=14, **fields)


# Vision towers built by timm: their tiny config's vision_config is the stand-in (set on the built config, whose
# type check would refuse another config class).
TIMM_VISION = {
    "FastVlmForConditionalGeneration": timm_stand_in(),
    "PerceptionLMForConditionalGeneration": timm_stand_in(model_args={"embed_dim": 32}),
    "Gemma3nForConditionalGeneration": timm_stand_in(vocab_size=128, vocab_offset=VOCAB + 128, rms_norm_eps=1e-6),
}


# Per-class changes to the tiny config (fields the generic sizes do not fit).
OVERRIDES = {
    "MistralLarge4ForConditionalGeneration": {"text_config": {
        "num_hidden_layers": 2, "mlp_layer_types": ["dense", "sparse"], "layer_types": ["indexed_attention"] * 2,
        "indexer_types": ["full"] * 2, "no_rope_layers": [1, 0], "kv_source_layers": [0, 1], "index_topk": 8,
        "index_head_dim": 16, "index_n_heads": 2, "qk_head_dim": 32}},
    "MuseGlimmerForConditionalGeneration": {"projector_hidden_size": 32},
    "MuseSparkForConditionalGeneration": {"projector_hidden_size": 32, "text_config": {"moe_hidden_size": 16},
                                          "audio_config": {"hidden_sizes": [8, 8, 16, 16], "depths": [1, 1, 1, 1]}},
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
    "KimiLinearForCausalLM": {"linear_head_dim": 8, "linear_num_heads": 2, "num_experts_per_token": 2},
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
    # M-RoPE: the sections of the rotary frequencies, for the tiny head size
    **{name: {"text_config": {"rope_parameters": {"mrope_section": section}}} for name, section in {
        "Glm4vForConditionalGeneration": [2, 3, 3], "Glm46VForConditionalGeneration": [2, 3, 3],
        "GlmOcrForConditionalGeneration": [2, 3, 3], "Glm4vMoeForConditionalGeneration": [2, 1, 1],
        "PaddleOCRVLForConditionalGeneration": [2, 3, 3],
        "Cosmos3EdgeForConditionalGeneration": [4, 2, 2], "HYV4VLForConditionalGeneration": [4, 2, 2],
        "HunYuanVLForConditionalGeneration": [4, 2, 2]}.items()},
    # vision_start_token_id: their generate() reads it, their config has no such field
    "Qwen2_5OmniThinkerForConditionalGeneration": {"text_config": {"rope_parameters": {"mrope_section": [2, 3, 3]}},
                                                   "vision_start_token_id": 151652},
    "Qwen3OmniMoeThinkerForConditionalGeneration": {
        "audio_config": {"encoder_ffn_dim": 48, "output_dim": 32, "downsample_hidden_size": 8},
        "vision_start_token_id": 151652},
    "Ernie4_5_VLMoeForConditionalGeneration": {"text_config": {
        "moe_intermediate_size": [16, 16], "moe_num_experts": 4, "moe_k": 2,
        "rope_parameters": {"mrope_section": [3, 3, 2]}}},
    # image tokenizers (VQ-VAEs: group norms of 32 groups) and their vocabularies; Emu3's map has no image token
    "Emu3ForConditionalGeneration": {
        "vocabulary_map": {"<image>": 200, "<|extra_200|>": 201},
        "vq_config": {"codebook_size": 64, "base_channels": 32, "channel_multiplier": [1, 1], "num_res_blocks": 1,
                      "attn_resolutions": []}},
    "JanusForConditionalGeneration": {"vq_config": {
        "num_embeddings": 64, "latent_channels": 32, "base_channels": 32, "channel_multiplier": [1, 1],
        "num_res_blocks": 1, "image_token_embed_dim": 32}},
    # its image and audio codes are the vocabulary's last 16 and 32 tokens (their marker ids out of the batches')
    "Apertus1p5ForConditionalGeneration": {
        "image_token_id": 1000, "audio_token_id": 1001, "image_token_offset": 48, "audio_token_offset": 64,
        "vision_config": {"codebook_size": 16, "latent_channels": 32, "base_channels": 32, "channel_multiplier": [1, 1],
                          "num_res_blocks": 1, "attn_resolutions": []},
        "audio_config": {"codebook_size": 32, "codebook_dim": 32, "num_filters": 8, "upsampling_ratios": [2, 2],
                         "decoder_hidden_size": 32, "decoder_intermediate_size": 48}},
    # SAM image encoders and the projections after them
    "DeepseekVLHybridForConditionalGeneration": {"high_res_vision_config": SAM_VISION},
    "DeepseekOcr2ForConditionalGeneration": {
        "vision_config": {"sam_config": {**SAM_VISION, "downsample_channels": [16, 32]}},
        "text_config": {"mlp_layer_types": ["dense", "sparse"], "num_hidden_layers": 2}},  # None by default
    "UnlimitedOcrForConditionalGeneration": {
        "vision_config": {"sam_config": {**SAM_VISION, "downsample_channels": [16, 32]}}},
    "Cohere2VisionForConditionalGeneration": {"alignment_intermediate_size": 64},
    "Phi4MultimodalForCausalLM": {"audio_config": {
        "ext_pw_out_channel": 32, "depthwise_separable_out_channel": 32, "nemo_conv_channels": 32}},
    # deepstack_layer_map is None by default; its Q-Former has vision hidden_size // 64 heads
    "Granite4VisionForConditionalGeneration": {
        "deepstack_layer_map": [[-1, 0]], "spatial_target_layers": [0, 1, 0, 1], "downsample_rate": "1/2",
        "vision_config": {"hidden_size": 64}},
    "Molmo2ForConditionalGeneration": {"adapter_config": {"vision_feature_layer": [1, 0]}},
    "Glm5NextForConditionalGeneration": {
        "text_config": {"qk_rope_head_dim": 0,  # its DSA layers have no RoPE
                        "linear_head_dim": 8, "linear_num_heads": 2, "index_head_dim": 16, "index_n_heads": 2},
        "vision_config": {"projection_intermediate_size": 48}},
    # its sliding layers' head_dim is qk_nope_head_dim + qk_rope_head_dim; its adapters' widths are the models'
    "Dots3NoteForCausalLM": {"head_dim": 24, "qk_rope_head_dim": 8},
    "Dots3NoteForConditionalGeneration": {
        "text_config": {"head_dim": 24, "qk_rope_head_dim": 8},
        "vision_config": {"adapter_in_dim": 32, "adapter_out_dim": 32},
        "audio_config": {"adapter_input_size": 32, "adapter_out_dim": 32, "downsample_hidden_size": 8}},
    "Mistral4ForCausalLM": {"qk_nope_head_dim": 8, "qk_rope_head_dim": 8},  # head_dim is their sum
    "MiMoV2FlashForCausalLM": {"num_attention_heads": 4, "num_key_value_heads": 1},  # sliding layers: 2 KV heads
    "Step3p7ForConditionalGeneration": {"text_config": {"sliding_window": 4}},  # None by default
    # max_patch_length: no empty last patch (its cross-attention rows, all masked, are NaN); num_hidden_layers: its
    # config has none, and its cache (eval, generate()) reads it
    "BltForCausalLM": {"patch_size": 4, "max_patch_length": 4, "num_hidden_layers": 2,
                       "encoder_hash_byte_group_vocab": 64, "encoder_config": {"hidden_size_global": 32},
                       "decoder_config": {"hidden_size_global": 32}},
    # its default rope_parameters name no layer type (KeyError): sliding layers with RoPE, full ones without
    "CohereCompassForCausalLM": {"layer_types": ["sliding_attention", "full_attention"], "num_hidden_layers": 2,
                                 "sliding_window": 4, "rope_parameters": {
                                     "sliding_attention": {"rope_type": "default", "rope_theta": 10000.0},
                                     "full_attention": None}},
    # its attention reads rope_theta and clamps to clip_qkv (None fails), which its checkpoints give
    "DbrxForCausalLM": {"attn_config": {"rope_theta": 10000.0, "clip_qkv": 8.0},
                        "ffn_config": {"ffn_hidden_size": 48, "moe_top_k": 2}},
    # two hybrid layers: their shared attention block is tied across them
    "ZambaForCausalLM": {"layer_types": ["mamba", "hybrid", "hybrid"], "num_hidden_layers": 3},
    "Gemma3nForCausalLM": GEMMA3N_TEXT,
    "Gemma3nForConditionalGeneration": {"text_config": GEMMA3N_TEXT},
    "Lfm2MoeForCausalLM": {"layer_types": ["conv", "full_attention"], "num_hidden_layers": 2},  # None by default
    "Qwen4ExpForCausalLM": QWEN4_EXP_INDEXER,
    "Qwen4ExpForConditionalGeneration": {"text_config": QWEN4_EXP_INDEXER},
}
# Served classes whose tiny config this file does not build, with the reason: none (every served class is
# checked; test_gpu_transformers skips the ones named here).
NOT_BUILT = {}
# Mixtures of experts whose stock forward fails with output_router_logits=True at the tiny config (IndexError
# in its router loss over an empty tuple of router logits): checked without the router's auxiliary loss.
NO_ROUTER_LOSS = {"DeepseekV4ForCausalLM", "FlintForCausalLM", "LagunaForCausalLM"}
# What a model needs besides input_ids to train on a text-only batch.
TEXT_ONLY_INPUTS = {"Molmo2ForConditionalGeneration": lambda ids: {"mm_token_type_ids": torch.zeros_like(ids)}}
UPCAST = {"MllamaForCausalLM", "NemotronHForCausalLM", "BltForCausalLM", "MambaForCausalLM", "Mamba2ForCausalLM",
          "FalconMambaForCausalLM", "BeamForCausalLM"}  # forwards that cast the logits to fp32 themselves
REL_FP64, REL_FP32 = 1e-10, 1e-5
MAX_PARAMETERS = 2_500_000

SERVED = lfce.transformers.supported()
# Every served class: the causal LMs, and the image-text-to-text ones (run on text-only batches; their vision
# and audio towers are built, at their own tiny sizes, but not run).
CAUSAL = sorted(SERVED)


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
    if hasattr(type(config), "_hasattr_without_heterogeneous_validation"):  # a field some layers' configs change
        return config._hasattr_without_heterogeneous_validation(key)
    return hasattr(config, key)


def _get(config, key):
    if hasattr(type(config), "_getattr_without_heterogeneous_validation"):  # its global value
        return config._getattr_without_heterogeneous_validation(key)
    return getattr(config, key)


def _fits(default, value):
    """A tiny value for a field whose default is a list or a dict is not given (its own override is)."""
    return not isinstance(default, (list, tuple, dict)) or isinstance(value, type(default))


def _tiny_layers(fields):
    """The per-layer fields (lists as long as the layers, a per_layer_config) for one layer of each kind
    (the first layer of each value of each list, in the default order): num_hidden_layers then counts them."""
    layers = fields.get("num_hidden_layers")
    if not isinstance(layers, int) or layers < 2:
        return {}
    lists = {key: list(value) for key, value in fields.items()
             if isinstance(value, (list, tuple)) and len(value) == layers and key != "per_layer_config"}
    per_layer = fields.get("per_layer_config")
    per_layer = {int(k): v for k, v in per_layer.items()} if isinstance(per_layer, dict) and per_layer else None
    if not lists and per_layer is None:
        return {}
    kinds = [[repr(v) for v in value] for value in lists.values()]
    if per_layer is not None:
        kinds.append([i in per_layer for i in range(layers)])
    indices = sorted({kind.index(v) for kind in kinds for v in kind})
    kwargs = {"num_hidden_layers": len(indices)}
    for key, value in lists.items():
        if key in TINY and all(isinstance(v, int) and not isinstance(v, bool) for v in value):
            kwargs[key] = [TINY[key]] * len(indices)  # a per-layer size
        else:
            kwargs[key] = [value[i] for i in indices]
    if per_layer is not None:
        kwargs["per_layer_config"] = {
            j: {k: TINY[k] if k in TINY and isinstance(v, int) else v for k, v in per_layer[i].items()}
            for j, i in enumerate(indices) if i in per_layer}
    return kwargs


def tiny_fields(defaults):
    """The tiny sizes for a config with these defaults, its sub-configs' (text, vision) included."""
    kwargs = {key: value for key, value in TINY.items()
              if _has(defaults, key) and _fits(_get(defaults, key), value)}
    fields = defaults.to_dict()
    if _has(defaults, "layer_types"):  # a derived one too
        fields["layer_types"] = _get(defaults, "layer_types")
    kwargs.update(_tiny_layers(fields))
    for key in getattr(defaults, "sub_configs", {}):
        sub = getattr(defaults, key, None)
        if isinstance(sub, transformers.PretrainedConfig):
            kwargs[key] = {**sub.to_dict(), **tiny_fields(sub)}
    return kwargs


def _merged(value, override):
    """override on value, dict fields merged (a nested sub-config's own override)."""
    if isinstance(value, dict) and isinstance(override, dict):
        return {**value, **{key: _merged(value.get(key), item) for key, item in override.items()}}
    return override


def tiny_config(name):
    config_class = getattr(transformers, name).config_class
    kwargs = _merged(tiny_fields(config_class()), OVERRIDES.get(name, {}))
    while True:
        try:
            config = config_class(**kwargs, attn_implementation="eager", experts_implementation="eager")
            if name in TIMM_VISION:
                object.__setattr__(config, "vision_config", copy.deepcopy(TIMM_VISION[name]))
            return config
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
    stock = tiny_model(name)
    patched = lfce.transformers.apply_lfce(copy.deepcopy(stock))
    tolerance = REL_FP32 if name in UPCAST else REL_FP64
    ids, labels = batch()
    moe = lfce.transformers._recipe(type(stock))[0].aux_coefficient is not None
    extra = TEXT_ONLY_INPUTS[name](ids) if name in TEXT_ONLY_INPUTS else {}
    check_training_step(stock, patched, tolerance, input_ids=ids, labels=labels, use_cache=False, **extra)
    shift_labels = F.pad(labels, (0, 1), value=-100)[..., 1:]  # with the sum over num_items_in_batch
    check_training_step(stock, patched, tolerance, input_ids=ids, labels=labels, shift_labels=shift_labels,
                        num_items_in_batch=torch.tensor(11), use_cache=False, **extra)
    if moe and name not in NO_ROUTER_LOSS:
        check_training_step(stock, patched, tolerance, input_ids=ids, labels=labels, use_cache=False,
                            output_router_logits=True, **extra)
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
