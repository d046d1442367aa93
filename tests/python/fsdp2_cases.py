"""The cases of test_fsdp2.py, run on each rank of a two-process gloo group: a tiny causal LM
patched by lfce.transformers.apply_lfce, wrapped with FSDP2's fully_shard (each decoder layer, then
the root, as users do), trains two SGD steps; on every step each rank's loss and every parameter's
gradient (full_tensor()) are checked against the unsharded patched model and the stock model, both
run in this process on both ranks' batches (their gradients averaged, as FSDP2's reduce-scatter
averages them). The first step takes labels (the mean), the second shift_labels and
num_items_in_batch (the sum over a count, as a trainer with gradient accumulation passes). fp64
throughout, the stock loss taken in fp64 as in test_transformers.py (its fp32 upcast replaced);
under FSDP2's mixed precision (computing in fp32) the sharded patched model is checked against the
sharded stock model with the same policy.

Then lfce.linear_cross_entropy called directly with the sharded lm_head weight (a DTensor outside
the forward) must raise lfce's error naming DTensor and the fix, and compute with
weight.full_tensor().

Each check returns a failure text (None when it passes) and the measured worst relative error.
"""

import copy
import warnings

import torch
import torch.nn.functional as F
import transformers
from torch.distributed.device_mesh import init_device_mesh
from torch.distributed.fsdp import MixedPrecisionPolicy, fully_shard
from torch.distributed.tensor import DTensor
from transformers.loss import loss_utils

import lfce
import lfce.transformers

VOCAB = 96
TINY = {"vocab_size": VOCAB, "hidden_size": 32, "intermediate_size": 48, "num_hidden_layers": 2,
        "num_attention_heads": 2, "num_key_value_heads": 2, "head_dim": 16, "max_position_embeddings": 64,
        "pad_token_id": 0, "bos_token_id": 1, "eos_token_id": 2, "attn_implementation": "eager"}
# name -> (class, config changes). "llama-head-sharded" shards the lm_head on its own too;
# "llama-patched-after-sharding" calls apply_lfce after fully_shard; "llama-fp32-compute" shards with
# FSDP2's mixed precision (fp64 parameters computed in fp32).
MODELS = {
    "llama": ("LlamaForCausalLM", {}),
    "llama-head-sharded": ("LlamaForCausalLM", {}),
    "llama-patched-after-sharding": ("LlamaForCausalLM", {}),
    "llama-fp32-compute": ("LlamaForCausalLM", {}),
    "mixtral": ("MixtralForCausalLM", {"num_local_experts": 4, "num_experts_per_tok": 2, "router_aux_loss_coef": 0.25,
                                       "output_router_logits": True, "experts_implementation": "eager"}),
    "gemma2": ("Gemma2ForCausalLM", {"final_logit_softcapping": 3.0}),  # softcap, tied embeddings
}
# fp64 on both sides; the measured worst is ~3e-16 (reassociation in the sharded reduce and the kernels).
TOLERANCE = 1e-10
# FSDP2's mixed precision computing in fp32 (parameters gathered in fp32, gradients reduced in fp64):
# the sharded patched model against the sharded stock one, whose logits are fp32 too; measured ~1e-7.
MIXED_PRECISION = MixedPrecisionPolicy(param_dtype=torch.float32, reduce_dtype=torch.float64)
REL_FP32 = 1e-5
STEPS = 2
LR = 0.5


def exact_causal_lm_loss(logits, labels, vocab_size, num_items_in_batch=None, ignore_index=-100, shift_labels=None,
                         **kwargs):
    """transformers' ForCausalLMLoss in the logits' own dtype (it upcasts them to fp32 first)."""
    if shift_labels is None:
        shift_labels = F.pad(labels, (0, 1), value=ignore_index)[..., 1:]
    reduction = "sum" if num_items_in_batch is not None else "mean"
    loss = F.cross_entropy(logits.reshape(-1, vocab_size), shift_labels.reshape(-1), ignore_index=ignore_index,
                           reduction=reduction)
    return loss / num_items_in_batch if num_items_in_batch is not None else loss


def tiny_model(name):
    class_name, changes = MODELS[name]
    cls = getattr(transformers, class_name)
    config = cls.config_class(**TINY, **changes)
    torch.manual_seed(0)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        return cls(config).to(torch.float64).train()


def batch(rank, step):
    """This rank's inputs of this step: labels (mean) on the first step, shift_labels and
    num_items_in_batch (sum over the count) on the second."""
    generator = torch.Generator().manual_seed(100 * step + rank)
    ids = torch.randint(3, VOCAB, (2, 9), generator=generator)
    labels = ids.clone()
    labels[0, :3] = -100
    labels[1, -2:] = -100
    if step == 0:
        return {"input_ids": ids, "labels": labels}
    shift_labels = F.pad(labels, (0, 1), value=-100)[..., 1:]
    return {"input_ids": ids, "labels": labels, "shift_labels": shift_labels, "num_items_in_batch": torch.tensor(11)}


def rel(actual, expected, floor=1e-6):
    actual, expected = actual.detach().double(), expected.detach().double()
    return float((actual - expected).norm() / expected.norm().clamp_min(floor))


def shard(model, name, mesh):
    policy = {"mp_policy": MIXED_PRECISION} if name == "llama-fp32-compute" else {}
    for layer in model.model.layers:
        fully_shard(layer, mesh=mesh, **policy)
    if name == "llama-head-sharded":
        fully_shard(model.lm_head, mesh=mesh, **policy)
    fully_shard(model, mesh=mesh, **policy)
    return model


def reference_step(model, optimizer, step, world_size):
    """Each rank's loss, and the gradients averaged over the ranks, of an unsharded model."""
    optimizer.zero_grad(set_to_none=True)
    losses = []
    for rank in range(world_size):
        loss = model(**batch(rank, step), use_cache=False).loss
        (loss / world_size).backward()
        losses.append(loss.detach())
    grads = {n: p.grad.clone() for n, p in model.named_parameters() if p.grad is not None}
    optimizer.step()
    return losses, grads


def sharded_step(model, optimizer, rank, step):
    """(output, whole gradients) of this rank's step of a fully sharded model."""
    optimizer.zero_grad(set_to_none=True)
    out = model(**batch(rank, step), use_cache=False)
    out.loss.backward()
    grads = {n: p.grad.full_tensor() if isinstance(p.grad, DTensor) else p.grad
             for n, p in model.named_parameters() if p.grad is not None}
    optimizer.step()
    return out, grads


def check_model(name, rank, world_size, mesh):
    """(failure or None, worst relative error against the stock model) of one model."""
    stock = tiny_model(name)
    patched = lfce.transformers.apply_lfce(copy.deepcopy(stock))
    if name == "llama-patched-after-sharding":
        sharded = lfce.transformers.apply_lfce(shard(copy.deepcopy(stock), name, mesh))
    else:
        sharded = shard(lfce.transformers.apply_lfce(copy.deepcopy(stock)), name, mesh)
    models = {"stock": stock, "patched": patched, "sharded": sharded}
    if name == "llama-fp32-compute":  # the sharded patched model against the sharded stock one
        models["sharded stock"] = shard(copy.deepcopy(stock), name, mesh)
    optimizers = {key: torch.optim.SGD(m.parameters(), lr=LR) for key, m in models.items()}
    worst = 0.0
    for step in range(STEPS):
        expected, expected_grads = reference_step(stock, optimizers["stock"], step, world_size)
        losses, grads = reference_step(patched, optimizers["patched"], step, world_size)
        out, sharded_grads = sharded_step(sharded, optimizers["sharded"], rank, step)
        if out.logits is not None:
            return f"step {step}: the sharded patched model materialised logits", worst
        sharded_loss, sharded_tolerance = expected[rank], TOLERANCE
        sharded_expected_grads = expected_grads
        if "sharded stock" in models:
            stock_out, sharded_expected_grads = sharded_step(models["sharded stock"], optimizers["sharded stock"],
                                                             rank, step)
            sharded_loss, sharded_tolerance = stock_out.loss, REL_FP32
        if not sorted(sharded_grads) == sorted(grads) == sorted(expected_grads) == sorted(sharded_expected_grads):
            return (f"step {step}: gradients cover other parameters: sharded {sorted(sharded_grads)}, unsharded "
                    f"{sorted(grads)}, stock {sorted(expected_grads)}"), worst
        checks = [(f"unsharded patched loss of rank {r}", losses[r], expected[r], TOLERANCE)
                  for r in range(world_size)]
        checks.append((f"sharded loss of rank {rank}", out.loss, sharded_loss, sharded_tolerance))
        checks += [(f"unsharded patched gradient of {n}", grads[n], g, TOLERANCE) for n, g in expected_grads.items()]
        checks += [(f"sharded gradient of {n}", sharded_grads[n], g, sharded_tolerance)
                   for n, g in sharded_expected_grads.items()]
        for what, actual, reference, tolerance in checks:
            error = rel(actual, reference)
            worst = max(worst, error)
            if not error <= tolerance:
                return (f"step {step}: {what}: relative L2 error {error:.3g} > {tolerance:g} (got "
                        f"{actual.detach().flatten()[:4].tolist()}, expected "
                        f"{reference.detach().flatten()[:4].tolist()})"), worst
    return None, worst


def check_direct_call_with_a_dtensor_weight(rank, world_size, mesh):
    """lfce.linear_cross_entropy given the sharded lm_head weight: lfce's error naming DTensor and
    the fix; given its full_tensor(): the loss of the whole weight."""
    model = shard(lfce.transformers.apply_lfce(tiny_model("llama")), "llama", mesh)
    weight = model.lm_head.weight
    if not isinstance(weight, DTensor):
        return f"the lm_head weight outside the forward is a {type(weight).__name__}, not a DTensor", 0.0
    generator = torch.Generator().manual_seed(7)
    hidden = torch.randn(10, TINY["hidden_size"], generator=generator, dtype=torch.float64)
    targets = torch.randint(0, VOCAB, (10,), generator=generator)
    try:
        lfce.linear_cross_entropy(hidden, weight, targets)
        return "a DTensor weight was taken without an error", 0.0
    except lfce.UnsupportedError as error:
        text = str(error)
        missing = [word for word in ("weight is a DTensor", "Shard(dim=0)", "apply_lfce", "weight.full_tensor()")
                   if word not in text]
        if missing:
            return f"the error does not name {missing}: {text}", 0.0
    except Exception as error:  # noqa: BLE001 - the wrong kind of error is the failure reported
        return f"not lfce's UnsupportedError: {type(error).__name__}: {error}", 0.0
    full = weight.full_tensor()
    loss = lfce.linear_cross_entropy(hidden, full, targets)
    error = rel(loss, F.cross_entropy(hidden @ full.T, targets))
    if not error <= TOLERANCE:
        return f"with weight.full_tensor(): relative error {error:.3g} > {TOLERANCE:g}", error
    return None, error


def run_all(rank, world_size, record):
    """Runs every case on this rank; record(name, failure, worst) after each."""
    loss_utils.LOSS_MAPPING["ForCausalLM"] = exact_causal_lm_loss
    transformers.logging.set_verbosity_error()
    mesh = init_device_mesh("cpu", (world_size,))
    for name in MODELS:
        try:
            failure, worst = check_model(name, rank, world_size, mesh)
        except Exception as error:  # noqa: BLE001 - recorded with its type, the test shows it
            failure, worst = f"{type(error).__name__}: {error}", None
        record(name, failure, worst)
    try:
        failure, worst = check_direct_call_with_a_dtensor_weight(rank, world_size, mesh)
    except Exception as error:  # noqa: BLE001
        failure, worst = f"{type(error).__name__}: {error}", None
    record("direct-dtensor-weight", failure, worst)
