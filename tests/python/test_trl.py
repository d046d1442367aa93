"""lfce.transformers under TRL's SFTTrainer without a GPU: a tiny Llama patched by apply_lfce trains
three optimizer steps on packed sequences (TRL's best-fit packing: padding-free rows with
position_ids and the sequence boundaries, the first label of each sequence -100) with gradient
accumulation (num_items_in_batch), and logs the same per-step losses and gradient norms as the
stock model, in fp32.

TRL's SFTTrainer computes its loss with its own fused LM head (``model(..., fused_lm_head=True)``,
a forward set on the instance that calls the backbone and TRL's chunked log-probabilities), which
bypasses the model's forward and so lfce's. lfce computes the loss when the trainer takes the
model's own loss, as transformers' Trainer does: a subclass with ``compute_loss =
transformers.Trainer.compute_loss`` (LfceSFTTrainer below); TRL's entropy and token-accuracy
metrics, which need its fused head's outputs, are then not logged. The stock model is run under the
same subclass and under SFTTrainer itself. Skipped (visibly) where TRL is not installed (a failure
in ctest's python.cpu.torch).
"""

import copy
import warnings

import pytest
import torch
from conftest import missing_dependency

try:
    import transformers
    from datasets import Dataset
    from tokenizers import Tokenizer, models
    from trl import SFTConfig, SFTTrainer
except ImportError as missing:
    pytest.skip(missing_dependency(f"TRL is not installed (optional dependency: {missing})"), allow_module_level=True)

import lfce.transformers

transformers.logging.set_verbosity_error()

VOCAB = 96
STEPS = 3
# fp32 on both sides: the stock loss reduces [tokens, vocab] logits, lfce its own chunks; the
# measured worst over the steps is ~1e-7 (reassociation), and the losses feed back through three
# optimizer steps.
REL_FP32 = 1e-5


class LfceSFTTrainer(SFTTrainer):
    """SFTTrainer taking the model's own loss (lfce's, in a patched model) in place of TRL's fused head."""

    compute_loss = transformers.Trainer.compute_loss


def tokenizer():
    vocab = {"<pad>": 0, "<bos>": 1, "<eos>": 2, **{f"t{i}": i for i in range(3, VOCAB)}}
    return transformers.PreTrainedTokenizerFast(tokenizer_object=Tokenizer(models.WordLevel(vocab, unk_token="<pad>")),
                                                pad_token="<pad>", eos_token="<eos>", bos_token="<bos>")


def dataset():
    """48 tokenised documents of 4 to 13 tokens (packed into rows of up to 24: more than the steps take)."""
    generator = torch.Generator().manual_seed(0)
    lengths = torch.randint(4, 14, (48,), generator=generator)
    return Dataset.from_dict({"input_ids": [torch.randint(3, VOCAB, (int(n),), generator=generator).tolist()
                                            for n in lengths]})


def tiny_llama():
    config = transformers.LlamaConfig(vocab_size=VOCAB, hidden_size=32, intermediate_size=48, num_hidden_layers=2,
                                      num_attention_heads=2, num_key_value_heads=2, head_dim=16,
                                      max_position_embeddings=64, pad_token_id=0, bos_token_id=1, eos_token_id=2,
                                      attn_implementation="eager")
    torch.manual_seed(0)
    return transformers.LlamaForCausalLM(config)


def train(model, trainer_class, out_dir):
    """(per-step losses, per-step gradient norms, the first training batch)."""
    args = SFTConfig(output_dir=str(out_dir), packing=True, max_length=24, per_device_train_batch_size=2,
                     gradient_accumulation_steps=2, max_steps=STEPS, learning_rate=0.05, logging_steps=1,
                     report_to=[], use_cpu=True, bf16=False, save_strategy="no", seed=0, disable_tqdm=True)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        trainer = trainer_class(model=model, args=args, train_dataset=dataset(), processing_class=tokenizer())
        first = next(iter(trainer.get_train_dataloader()))
        trainer.train()
    logged = [entry for entry in trainer.state.log_history if "loss" in entry]
    return [e["loss"] for e in logged], [e["grad_norm"] for e in logged], first


@pytest.fixture(scope="module")
def runs(tmp_path_factory):
    stock = tiny_llama()
    calls = []
    loss = lfce.transformers.linear_cross_entropy

    def counted(*args, **options):
        calls.append(options)
        return loss(*args, **options)

    lfce.transformers.linear_cross_entropy = counted
    try:
        patched = train(lfce.transformers.apply_lfce(copy.deepcopy(stock)), LfceSFTTrainer,
                        tmp_path_factory.mktemp("lfce"))
    finally:
        lfce.transformers.linear_cross_entropy = loss
    return {"lfce": patched, "lfce calls": calls,
            "stock": train(copy.deepcopy(stock), LfceSFTTrainer, tmp_path_factory.mktemp("stock")),
            "trl": train(copy.deepcopy(stock), SFTTrainer, tmp_path_factory.mktemp("trl"))}


def test_the_batches_are_packed_with_position_ids_and_sequence_boundaries(runs):
    batch = runs["lfce"][2]
    ids, labels, positions = batch["input_ids"], batch["labels"], batch["position_ids"]
    assert ids.shape[0] == 1 and "attention_mask" not in batch, "not a padding-free packed row"
    starts = (positions[0] == 0).nonzero().flatten().tolist()
    assert len(starts) > 1, f"one sequence in the row: position_ids {positions.tolist()}"
    assert all(labels[0, s] == -100 for s in starts), f"a sequence's first label counts: {labels.tolist()}"


def test_lfce_computes_every_micro_batch_loss(runs):
    calls = runs["lfce calls"]
    assert len(calls) == 2 * STEPS, f"{len(calls)} lfce calls for {STEPS} steps of 2 micro-batches"
    assert all(call["reduction"] == "sum" for call in calls), calls  # over num_items_in_batch


@pytest.mark.parametrize("reference", ["stock", "trl"])
def test_patched_model_logs_the_stock_losses_and_gradient_norms_each_step(runs, reference):
    losses, norms, _ = runs["lfce"]
    expected_losses, expected_norms, _ = runs[reference]
    assert len(losses) == len(expected_losses) == STEPS
    for step, (got, expected) in enumerate(zip(losses, expected_losses)):
        assert abs(got - expected) <= REL_FP32 * abs(expected), f"step {step}: loss {got!r} vs {expected!r}"
    for step, (got, expected) in enumerate(zip(norms, expected_norms)):
        assert abs(got - expected) <= REL_FP32 * abs(expected), f"step {step}: grad norm {got!r} vs {expected!r}"
    assert len(set(expected_losses)) == STEPS, f"the steps did not change the model: {expected_losses}"
