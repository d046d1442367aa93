"""lfce.distributed without a GPU: the layout checks, the target mapping and the LSE combination as
pure functions, the argument checks, and the whole algorithm over torch.distributed's gloo backend
with two processes (and three for a subset), each shard through lfce's CPU operators
(distributed_model.py), against the fp64 reference and against lfce.linear_cross_entropy on CPU
tensors with the whole weight (distributed_cases.py: both layouts, both modes, every reduction, fp32
and bf16, uneven shards, targets in one shard, an ignore_index that is a class id, shards in swapped
order; softcap and temperature alone and together; lse / entropy / logprob, predicted / accuracy and
z_loss). The same cases run on two GPUs in test_multigpu_distributed.py. Also the argmax's combine
(best_of, shard_argmax) as pure functions and, over gloo, exact ties between rows of two shards, and
torch.compile(fullgraph=True) of a model ending in the loss: one graph, no break, the uncompiled
results (PyTorch 2.4+).
"""

import datetime
import json
import math
import os

import distributed_cases
import pytest
import torch
import torch.distributed as dist
import torch.multiprocessing as mp
import torch.nn.functional as F
from gloo_launch import free_port, run_ranks

import lfce
import lfce.distributed as lfce_dist

WORLD_SIZE = 2
N, H, V = 12, 16, 37  # shards of 18 and 19 rows


# --- pure pieces ----------------------------------------------------------------------------------

@pytest.mark.parametrize("vocab, world, expected", [
    (151937, 2, [(0, 75968), (75968, 75969)]),
    (10, 4, [(0, 2), (2, 2), (4, 3), (7, 3)]),
    (8, 2, [(0, 4), (4, 4)]),
    (3, 3, [(0, 1), (1, 1), (2, 1)]),
])
def test_vocab_shard_splits_evenly_with_the_remainder_on_the_last_ranks(vocab, world, expected):
    assert [lfce_dist.vocab_shard(vocab, r, world) for r in range(world)] == expected


def test_vocab_shard_names_a_rank_outside_the_group():
    with pytest.raises(ValueError, match=r"rank must be in \[0, 1\], got 2"):
        lfce_dist.vocab_shard(100, 2, 2)


def test_local_targets_map_each_target_to_its_shard_or_a_code_that_matches_no_column():
    targets = torch.tensor([0, 9, 10, 14, 15, -100, 5, 12, -1, 99], dtype=torch.int32)
    local = lfce_dist.local_targets(targets, v0=10, shard=5, ignore_index=12)
    not_here, ignored = lfce_dist.NOT_IN_SHARD, lfce_dist.LOCAL_IGNORE
    assert local.dtype == torch.int32
    # 12 is the ignore_index although it is a class of this shard; -100 and -1 are bad targets here.
    assert local.tolist() == [not_here, not_here, 0, 4, not_here, not_here, not_here, ignored, not_here, not_here]
    assert ignored != not_here and ignored < 0 and not_here < 0


def test_combined_shard_lse_equals_the_lse_of_the_whole_row(monkeypatch):
    g = torch.Generator().manual_seed(0)
    logits = torch.randn(6, 37, generator=g, dtype=torch.float64) * 4
    targets = torch.tensor([0, 17, 18, 36, -100, 5])
    parts = []
    for start, size in (lfce_dist.vocab_shard(37, r, 2) for r in range(2)):
        local = lfce_dist.local_targets(targets, start, size, -100)
        z = logits[:, start:start + size]
        picked = z.gather(1, local.clamp(min=0)[:, None])[:, 0]
        parts.append(torch.stack((z.logsumexp(1), torch.where(local >= 0, picked, torch.zeros_like(picked)))))
    # What the all-gather of the two ranks' [2, N] parts gives.
    monkeypatch.setattr(lfce_dist, "_all_gather", lambda tensor, group, nccl: torch.cat(parts))
    combined = lfce_dist.combine(parts[0][0], parts[0][1], group="two ranks")
    assert combined.predicted is None and combined.smoothing is None and combined.target_weight is None
    torch.testing.assert_close(combined.lse, logits.logsumexp(1))
    expected = logits.gather(1, targets.clamp(min=0)[:, None])[:, 0]
    torch.testing.assert_close(combined.target_logit[targets >= 0], expected[targets >= 0])
    terms = lfce_dist.loss_terms(combined.lse, combined.target_logit, targets, 37, -100)
    torch.testing.assert_close(lfce_dist.reduced(terms, "none"), F.cross_entropy(logits, targets, reduction="none"))
    assert terms.count.tolist() == [5.0] and terms.scale is None


def test_combined_smoothing_and_class_weight_rows_give_one_processes_weighted_loss(monkeypatch):
    """Each shard's R_r = Σ_{v in r} w_v (LSE_r - u_v) and its target's class weight, through the
    all-gather, give the smoothed, class-weighted, token-scaled loss of the whole row (PyTorch's
    cross_entropy with weight and label_smoothing, times p(target)); mean divides by Σ w_y."""
    g = torch.Generator().manual_seed(3)
    logits = torch.randn(6, 37, generator=g, dtype=torch.float64) * 4
    weights = torch.rand(37, generator=g, dtype=torch.float64) + 0.5
    targets = torch.tensor([0, 17, 18, 36, -100, 5])
    parts, sums = [], []
    for start, size in (lfce_dist.vocab_shard(37, r, 2) for r in range(2)):
        local = lfce_dist.local_targets(targets, start, size, -100)
        z, w = logits[:, start:start + size], weights[start:start + size]
        lse_r = z.logsumexp(1)
        picked = torch.where(local >= 0, z.gather(1, local.clamp(min=0)[:, None])[:, 0], torch.zeros_like(lse_r))
        own_weight = torch.where(local >= 0, w[local.clamp(min=0)], torch.zeros_like(lse_r))
        parts.append(torch.stack((lse_r, picked, own_weight, ((lse_r[:, None] - z) * w).sum(1))))
        sums.append(float(w.sum()))
    monkeypatch.setattr(lfce_dist, "_all_gather", lambda tensor, group, nccl: torch.cat(parts))
    combined = lfce_dist.combine(parts[0][0], parts[0][1], group="two ranks", target_weight=parts[0][2],
                                 smoothing=(parts[0][3], sums))
    terms = lfce_dist.loss_terms(combined.lse, combined.target_logit, targets, 37, -100, label_smoothing=0.1,
                                 target_weight=combined.target_weight, smoothing=combined.smoothing,
                                 weight_total=sum(sums), token_scaling=True)
    expected = F.cross_entropy(logits, targets, weight=weights, label_smoothing=0.1, reduction="none")
    scale = torch.where(targets >= 0, logits.log_softmax(1).gather(1, targets.clamp(min=0)[:, None])[:, 0].exp(),
                        torch.zeros(6, dtype=torch.float64))
    torch.testing.assert_close(lfce_dist.reduced(terms, "none"), expected * scale)
    counted = weights[targets.clamp(min=0)][targets >= 0].sum()
    torch.testing.assert_close(terms.count, torch.stack([torch.tensor(5.0, dtype=torch.float64), counted,
                                                         weights.sum()]).float(), check_dtype=False)
    torch.testing.assert_close(lfce_dist.reduced(terms, "mean"), (expected * scale).sum() / counted)


def test_the_argmax_across_the_shards_takes_the_largest_logit_and_the_lowest_id_among_equal_ones():
    values = torch.tensor([[1.0, 2.0, 0.0, -0.0, float("-inf"), 3.0, float("nan"), -1.0],
                           [1.0, 1.5, -0.0, 0.0, float("-inf"), float("nan"), 1.0, -0.5]])
    ids = torch.tensor([[30, 3, 30, 30, 30, 3, 30, 2], [5, 20, 5, 5, 5, 20, 5, 21]])
    # equal: the lower id, whichever rank holds it; -0.0 equals 0.0; a NaN is the largest (torch.argmax)
    assert lfce_dist.best_of(values, ids).tolist() == [5, 3, 5, 5, 5, 20, 30, 21]
    assert lfce_dist.best_of(values.flip(0), ids.flip(0)).tolist() == [5, 3, 5, 5, 5, 20, 30, 21]


@pytest.mark.parametrize("order", [(0, 1), (1, 0)])
def test_combined_shard_argmaxes_equal_the_argmax_of_the_whole_row(monkeypatch, order):
    """Each shard's (best logit, global id) through the all-gather (as its int32 bits in an fp32 row)
    gives torch.argmax of the whole row, ties across the shards included, whatever the ranks' order."""
    g = torch.Generator().manual_seed(1)
    logits = (torch.randn(8, 37, generator=g) * 4).float()
    logits[:3, 2] = logits[:3, 30] = 20.0  # equal maxima on both shards: the lower id
    logits[3, 18] = logits[3, 0] = 20.0
    logits[4] = 0.0  # every logit equal: id 0
    sent, shards = [], [lfce_dist.vocab_shard(37, r, 2) for r in range(2)]
    monkeypatch.setattr(lfce_dist, "_all_gather", lambda tensor, group, nccl: sent.append(tensor) or tensor)
    for start, size in (shards[r] for r in order):
        z = logits[:, start:start + size]
        best = (z.max(1).values, z.argmax(1) + start)
        lfce_dist.combine(torch.zeros(8), torch.zeros(8), group="two ranks", shard_best=best)
    monkeypatch.setattr(lfce_dist, "_all_gather", lambda tensor, group, nccl: torch.cat(sent))
    predicted = lfce_dist.combine(torch.zeros(8), torch.zeros(8), group="two ranks", shard_best=best).predicted
    assert predicted.dtype == torch.int64
    assert predicted.tolist() == logits.argmax(1).tolist()
    assert predicted[:5].tolist() == [2, 2, 2, 0, 0]


@pytest.mark.parametrize("softcap, temperature", [(None, 1.0), (None, 0.7), (5.0, 1.0), (5.0, 0.7)])
def test_shard_argmax_recomputes_the_chosen_logit_as_the_shard_forward_maps_it(softcap, temperature):
    g = torch.Generator().manual_seed(2)
    x, w, b = torch.randn(6, 16, generator=g).bfloat16(), torch.randn(19, 16, generator=g).bfloat16(), \
        torch.randn(19, generator=g).bfloat16()
    local = torch.tensor([0, 18, -1, 7, 7, 3])
    options = lfce.LossOptions(softcap=softcap, temperature=temperature)
    u, ids = lfce_dist.shard_argmax(x, w, b, local, 18, options)
    z = F.linear(x.double(), w.double(), b.double())
    if softcap is not None:
        z = softcap * torch.tanh(z / softcap)
    expected = (z / temperature).gather(1, local.clamp(min=0)[:, None])[:, 0]
    assert u.dtype == torch.float32 and ids.tolist()[:2] == [18, 36] and ids[3] == 25
    assert u[2] == float("-inf")
    keep = local >= 0
    torch.testing.assert_close(u[keep].double(), expected[keep], rtol=1e-6, atol=1e-6)
    # The kernels' formula (tanh from one exponential, constants in fp32), as CUDA tensors take it.
    z32 = torch.linspace(-60, 60, 2001)
    kernels = lfce_dist.mapped_logits(z32, softcap, temperature, cpu=False)
    torch.testing.assert_close(kernels, lfce_dist.mapped_logits(z32, softcap, temperature, cpu=True), rtol=1e-6,
                               atol=1e-6)
    assert bool((kernels.diff() >= 0).all()), "the map must keep the logits' order"


def test_the_logprob_gradient_of_a_target_on_another_shard_moves_to_the_lse_row():
    """lfce's kernels apply a logprob gradient g only where the target is one of their columns; a
    token whose target is on another rank still needs -g·p on this shard: it travels as -g in the
    lse row's gradient (which adds +g_L·p). Ignored tokens and targets outside [0, V) get none."""
    options = lfce.LossOptions(return_lse=True, return_entropy=True, return_logprob=True)
    targets = torch.tensor([3, 30, -100, 37, 12])  # in the shard [0, 18), elsewhere, ignored, bad, in the shard
    local = lfce_dist.local_targets(targets, 0, 18, -100)
    g_lse, g_entropy, g_logprob = torch.tensor([1.0, 2, 3, 4, 5]), torch.full((5,), 7.0), torch.full((5,), 0.5)
    rows = lfce_dist.shard_row_gradients(options, torch.cat((g_lse, g_entropy, g_logprob)), local, targets, 37)
    lse, entropy, logprob = rows.reshape(3, 5)
    assert lse.tolist() == [1.0, 1.5, 3.0, 4.0, 5.0]
    assert entropy.tolist() == g_entropy.tolist()
    assert logprob.tolist() == [0.5, 0.0, 0.5, 0.0, 0.5]  # ignored: no gradient in the kernels either
    without = lfce.LossOptions(return_lse=True)
    assert lfce_dist.shard_row_gradients(without, g_lse, local, targets, 37) is g_lse


def test_a_target_outside_the_vocabulary_gives_a_nan_loss_like_one_gpu():
    lse = torch.zeros(4)
    terms = lfce_dist.loss_terms(lse, torch.zeros(4), torch.tensor([0, 37, -5, -100]), 37, -100)
    loss = lfce_dist.reduced(terms, "none")
    assert loss[0] == 0 and math.isnan(loss[1]) and math.isnan(loss[2]) and loss[3] == 0
    assert terms.count.tolist() == [3.0]


def test_a_causal_shift_scores_each_position_against_the_next_across_the_ranks():
    """Tensor parallel: sequences of T consecutive targets. Sequence parallel: rank r holds positions
    [r T_r, (r + 1) T_r) of each sequence, so a rank's last position takes the next rank's first."""
    tensor = lfce_dist.Layout(None, 0, 2, False, 0, 5, 10, 6, False, sequence_length=3)
    targets = torch.tensor([1, 2, 3, 4, 5, 6])
    assert lfce_dist.scored_targets(targets, tensor, -100).tolist() == [2, 3, -100, 5, 6, -100]
    # Two ranks, two sequences of 4: rank 0 holds positions 0-1 of both, rank 1 positions 2-3.
    gathered = torch.tensor([10, 11, 20, 21, 12, 13, 22, 23])  # rank 0's [2, 2], then rank 1's
    sequence = lfce_dist.Layout(None, 0, 2, False, 0, 5, 10, 4, True, sequence_length=2)
    sequence.world_size = 2
    original = lfce_dist._gather_tokens
    lfce_dist._gather_tokens = lambda tensor, layout: gathered
    try:
        assert lfce_dist.scored_targets(gathered[:4], sequence, -1).tolist() == [11, 12, 21, 22, 13, -1, 23, -1]
    finally:
        lfce_dist._gather_tokens = original


def rows(**changes):
    base = {"vocab_shard": 18, "vocab_start": -1, "tokens": 12, "hidden": 16, "dtype": 0, "target_dtype": 0,
            "has_bias": 0, "ignore_index": -100, "softcap": 0, "temperature": lfce_dist.float_bits(1.0),
            "z_loss_scale": 0, "reduction": 0, "mode": 0, "sequence_parallel": 0, "class_weight_sum": 0,
            "has_class_weight": 0, "label_smoothing": 0, "token_scaling": 0, "sequence_length": 0,
            "need_hidden": 1, "need_weight": 1, "need_bias": 0, "outputs": 0}
    second = dict(base, vocab_shard=19)
    for key, value in changes.items():
        second[key] = value
    return [base, second]


def test_check_layout_places_the_shards_in_rank_order():
    assert lfce_dist.check_layout(rows(), 0) == (0, 37)
    assert lfce_dist.check_layout(rows(), 1) == (18, 37)


def test_check_layout_accepts_explicit_starts_in_any_order():
    table = rows()
    table[0]["vocab_start"], table[1]["vocab_start"] = 19, 0
    assert lfce_dist.check_layout(table, 0) == (19, 37)
    assert lfce_dist.check_layout(table, 1) == (0, 37)


def test_check_layout_names_the_rank_whose_shard_leaves_a_gap():
    table = rows()
    table[0]["vocab_start"], table[1]["vocab_start"] = 0, 20
    with pytest.raises(ValueError, match=r"rank 1's shard starts at vocab_start=20 but the shards before it end at "
                                         r"18 \(a gap"):
        lfce_dist.check_layout(table, 0)


def test_check_layout_names_the_rank_whose_shard_overlaps():
    table = rows()
    table[0]["vocab_start"], table[1]["vocab_start"] = 0, 10
    with pytest.raises(ValueError, match=r"rank 1's shard starts at vocab_start=10 .*overlap"):
        lfce_dist.check_layout(table, 1)


def test_check_layout_rejects_a_vocab_start_given_on_some_ranks_only():
    table = rows()
    table[1]["vocab_start"] = 18
    with pytest.raises(ValueError, match=r"vocab_start is given on some ranks and None on others \(rank 0: None, "
                                         r"rank 1: 18\)"):
        lfce_dist.check_layout(table, 0)


@pytest.mark.parametrize("field, value, shown", [
    ("tokens", 13, "rank 0: 12, rank 1: 13"),
    ("dtype", 2, "rank 0: torch.bfloat16, rank 1: torch.float32"),
    ("reduction", 1, "rank 0: mean, rank 1: sum"),
    ("ignore_index", 0, "rank 0: -100, rank 1: 0"),
    ("need_hidden", 0, "rank 0: 1, rank 1: 0"),
    ("hidden", 32, "rank 0: 16, rank 1: 32"),
    ("softcap", lfce_dist.float_bits(30.0), "rank 0: None, rank 1: 30.0"),
    ("temperature", lfce_dist.float_bits(0.5), "rank 0: 1.0, rank 1: 0.5"),
    ("z_loss_scale", lfce_dist.float_bits(1e-4), "rank 0: 0.0, rank 1: 0.0001"),
    ("outputs", 5, "rank 0: none, rank 1: return_lse\\+return_logprob"),
    ("outputs", 1 << 3 | 1 << 5, "rank 0: none, rank 1: return_accuracy\\+return_z_loss"),
    ("label_smoothing", lfce_dist.float_bits(0.1), "rank 0: 0.0, rank 1: 0.1"),
    ("token_scaling", 1, "rank 0: 0, rank 1: 1"),
    ("has_class_weight", 1, "rank 0: 0, rank 1: 1"),
    ("sequence_length", 6, "rank 0: 0, rank 1: 6"),
])
def test_check_layout_names_the_ranks_that_disagree(field, value, shown):
    with pytest.raises(ValueError, match=r"differs across the ranks of the group \(" + shown + r"\)"):
        lfce_dist.check_layout(rows(**{field: value}), 0)


# --- argument checks (no process group needed for these) ------------------------------------------

def args():
    return torch.zeros(4, 16), torch.zeros(5, 16), torch.zeros(4, dtype=torch.int64)


def test_sequence_parallel_must_be_a_bool():
    with pytest.raises(TypeError, match="sequence_parallel must be a bool, got str 'yes'"):
        lfce_dist.linear_cross_entropy(*args(), sequence_parallel="yes")


def test_vocab_start_must_not_be_negative():
    with pytest.raises(ValueError, match=r"vocab_start must be in \[0, 2\*\*63 - 1\], got -1"):
        lfce_dist.linear_cross_entropy(*args(), vocab_start=-1)


def test_cpu_tensors_are_rejected_naming_the_tensor():
    with pytest.raises(ValueError, match="CUDA tensors only; hidden is on cpu"):
        lfce_dist.linear_cross_entropy(*args())


def test_z_loss_with_fp16_is_refused_as_on_one_gpu(monkeypatch):
    monkeypatch.setattr(lfce_dist.functional, "_DEVICE_TYPE", "cpu")
    x, w, y = args()
    with pytest.raises(ValueError, match=r"z_loss_scale=0.0001 is not supported with torch.float16"):
        lfce_dist.linear_cross_entropy(x.half(), w.half(), y, z_loss_scale=1e-4)


def test_a_bad_reduction_is_named():
    with pytest.raises(ValueError, match="reduction must be one of .* got 'avg'"):
        lfce_dist.linear_cross_entropy(*args(), reduction="avg")


@pytest.mark.parametrize("option, value", [("label_smoothing", 0.1), ("token_scaling", True)])
def test_weighted_options_with_fp16_are_refused_naming_the_option(monkeypatch, option, value):
    monkeypatch.setattr(lfce_dist.functional, "_DEVICE_TYPE", "cpu")
    x, w, y = args()
    with pytest.raises(ValueError, match=f"{option}={value!r} is not supported with torch.float16 inputs on a "
                                         "vocabulary-sharded weight"):
        lfce_dist.linear_cross_entropy(x.half(), w.half(), y, **{option: value})


def test_class_weight_must_be_this_ranks_shard(monkeypatch):
    monkeypatch.setattr(lfce_dist.functional, "_DEVICE_TYPE", "cpu")
    with pytest.raises(ValueError, match=r"class_weight must have shape \[V\] = \(5,\) with V from weight, got "
                                         r"shape \(37,\)"):
        lfce_dist.linear_cross_entropy(*args(), class_weight=torch.ones(37))


def test_shift_needs_a_sequence_dimension(monkeypatch):
    monkeypatch.setattr(lfce_dist.functional, "_DEVICE_TYPE", "cpu")
    with pytest.raises(ValueError, match="shift=True needs a sequence dimension"):
        lfce_dist.linear_cross_entropy(torch.zeros(16), torch.zeros(5, 16), torch.zeros((), dtype=torch.int64),
                                       shift=True)


@pytest.mark.parametrize("option, value", [("weight_grad_accumulator", torch.zeros(5, 16)),
                                           ("bias_grad_accumulator", torch.zeros(5))])
def test_gradient_accumulators_are_arguments_of_the_call_not_of_the_module(option, value):
    with pytest.raises(TypeError, match=f"unexpected keyword argument '{option}'"):
        lfce_dist.VocabParallelLinearCrossEntropyLoss(**{option: value})


def test_gradient_accumulators_need_recompute_mode_as_on_one_gpu(monkeypatch):
    monkeypatch.setattr(lfce_dist.functional, "_DEVICE_TYPE", "cpu")
    with pytest.raises(ValueError, match="weight_grad_accumulator needs mode='recompute', got mode='eager'"):
        lfce_dist.linear_cross_entropy(*args(), mode="eager", weight_grad_accumulator=torch.zeros(5, 16))


def test_supported_options_travel_as_lfce_loss_options():
    options = lfce.LossOptions(reduction="sum", chunk_size=64, softcap=30.0, temperature=0.5)
    module = lfce_dist.VocabParallelLinearCrossEntropyLoss(options=options)
    assert module.options == options
    assert "reduction='sum'" in repr(module) and "chunk_size=64" in repr(module) and "softcap=30.0" in repr(module)
    keywords = lfce_dist.VocabParallelLinearCrossEntropyLoss(softcap=30.0, temperature=0.5, z_loss_scale=1e-4,
                                                              return_entropy=True, return_z_loss=True,
                                                              return_accuracy=True, return_predicted=True)
    assert keywords.options == lfce.LossOptions(softcap=30.0, temperature=0.5, z_loss_scale=1e-4, return_entropy=True,
                                                return_z_loss=True, return_accuracy=True, return_predicted=True)
    with pytest.raises(lfce.UsageError, match="keyword options mode='eager'"):
        lfce_dist.VocabParallelLinearCrossEntropyLoss(options=lfce.LossOptions(), mode="eager")
    weighted = lfce_dist.VocabParallelLinearCrossEntropyLoss(label_smoothing=0.1, token_scaling=True, shift=True,
                                                              class_weight=torch.ones(5))
    assert weighted.options == lfce.LossOptions(label_smoothing=0.1, token_scaling=True, shift=True)
    assert "class_weight" in dict(weighted.named_buffers())
    assert "label_smoothing=0.1" in repr(weighted) and "class_weight=[5]" in repr(weighted)
    with pytest.raises(TypeError, match="class_weight must be None or a torch.Tensor of shape \\[V\\], got list"):
        lfce_dist.VocabParallelLinearCrossEntropyLoss(class_weight=[1.0, 2.0])


def test_eager_backward_scales_the_held_gradients_as_one_gpu_does(monkeypatch):
    """Eager mode's backward multiplies each held gradient (computed for an upstream gradient of 1)
    by the upstream gradient in fp32 and rounds once to its dtype, through the helper of the
    single-GPU operator (lfce._bridge.scaled: lfce_scale_gradient on CUDA), bit for bit, on values
    where rounding the upstream gradient to bf16 first (torch.mul on CUDA tensors; here 1.0029 becomes
    1.0) changes the result. (PyTorch's CPU torch.mul rounds once from 2.x on, so the call of the
    shared helper is checked too.) A second backward through the same forward is refused, as on one GPU."""
    from lfce import _bridge

    g = torch.Generator().manual_seed(0)
    held = (torch.randn(64, 16, generator=g).to(torch.bfloat16), torch.randn(37, 16, generator=g).to(torch.bfloat16),
            None)
    grad_loss = torch.tensor(1.0 + 3 * 2.0 ** -10)  # between bf16's 1.0 and its next value, 1 + 2**-7
    expected = [(t.float() * grad_loss).to(torch.bfloat16) for t in held[:2]]
    doubly_rounded = (held[0].float() * grad_loss.to(torch.bfloat16).float()).to(torch.bfloat16)
    assert not torch.equal(doubly_rounded, expected[0]), "these values cannot tell a double rounding"
    scaled, calls = _bridge.scaled, []
    monkeypatch.setattr(_bridge, "scaled", lambda t, s, out=None: calls.append(t) or scaled(t, s, out))

    class Context:  # what _VocabParallelLinearCrossEntropy.forward leaves for an eager backward
        eager = True
        saved_tensors = held
        needs_input_grad = (True, True, False) + (False,) * 6

    context = Context()
    grads = lfce_dist._VocabParallelLinearCrossEntropy.backward(context, grad_loss, None)
    assert len(grads) == 10 and grads[2:] == (None,) * 8
    for name, got, want in zip(("grad_hidden", "grad_weight"), grads, expected):
        assert got.dtype == torch.bfloat16, f"{name}: {got.dtype}"
        differ = (got.view(torch.int16) != want.view(torch.int16)).flatten().nonzero()
        assert not len(differ), (f"{name}: element {int(differ[0])} is {got.flatten()[differ[0]].item()}, the fp32 "
                                 f"product rounded once is {want.flatten()[differ[0]].item()}")
    assert [t is h for t, h in zip(calls, held)] == [True, True], "not scaled by the single-GPU helper"
    with pytest.raises(lfce.UsageError, match="a second backward through the same forward"):
        lfce_dist._VocabParallelLinearCrossEntropy.backward(context, grad_loss, None)


def test_without_a_process_group_the_error_says_how_to_start_one(monkeypatch):
    monkeypatch.setattr(lfce_dist.functional, "_DEVICE_TYPE", "cpu")
    assert not dist.is_initialized()
    with pytest.raises(RuntimeError, match="needs an initialized default process group"):
        lfce_dist.linear_cross_entropy(*args())


def test_module_checks_its_options_at_construction():
    with pytest.raises(ValueError, match="mode must be one of .* got 'lazy'"):
        lfce_dist.VocabParallelLinearCrossEntropyLoss(mode="lazy")
    module = lfce_dist.VocabParallelLinearCrossEntropyLoss(sequence_parallel=True, reduction="sum")
    assert "sequence_parallel=True" in repr(module) and "reduction='sum'" in repr(module)


# --- two processes over gloo ------------------------------------------------------------------------

def _join_gloo(rank, port, world_size, timeout_s):
    """This worker process as rank ``rank`` of a gloo group on this machine, lfce.distributed taking
    CPU tensors (distributed_model)."""
    import distributed_model

    distributed_model.install()
    dist.init_process_group("gloo", init_method=f"tcp://127.0.0.1:{port}", rank=rank, world_size=world_size,
                            timeout=datetime.timedelta(seconds=timeout_s))


def _worker(rank, port, out_dir, world_size, selected):
    _join_gloo(rank, port, world_size, 120)
    results = {}
    try:
        for case, name in zip(selected, distributed_cases.case_ids(selected)):
            errors = {}
            loss, failure = distributed_cases.check_case(case, rank, world_size, N, H, V, "cpu", errors.__setitem__,
                                                         whole=True)
            if case[2] != "none":  # the loss is the same bits on every rank
                loss = loss.reshape(1)
                losses = [torch.empty_like(loss) for _ in range(world_size)]
                dist.all_gather(losses, loss)
                if not all(torch.equal(other, losses[0]) for other in losses):
                    failure = f"the ranks' losses differ: {losses}"
            results[name] = {"failure": failure,
                             "errors": {check: (m["rel_l2"], m["elementwise"]) for check, m in errors.items()}}
    finally:
        dist.destroy_process_group()
    with open(os.path.join(out_dir, f"rank{rank}.json"), "w") as f:
        json.dump(results, f)
    # The results are on disk: leave without the interpreter's teardown, where torch 2.11's gloo
    # aborts about one run in two ("terminate called without an active exception", after
    # destroy_process_group returned; lfce's library is not loaded in these workers).
    os._exit(0)


def _run_gloo(out, world_size, selected):
    mp.spawn(_worker, args=(free_port(), str(out), world_size, selected), nprocs=world_size, join=True)
    results = []
    for rank in range(world_size):
        with open(out / f"rank{rank}.json") as f:
            results.append(json.load(f))
    return results


@pytest.fixture(scope="module")
def gloo_results(tmp_path_factory):
    return _run_gloo(tmp_path_factory.mktemp("gloo"), WORLD_SIZE, distributed_cases.cases())


# Three ranks (shards of 12, 12 and 13 rows; 4 tokens a rank in sequence parallel): fp32, every
# layout, mode and reduction, with and without the logit maps, shards uneven and targets in one.
THREE_RANK_CASES = [case for case in distributed_cases.cases()
                    if case[3] == torch.float32 and case[4] in ("uneven", "one_shard")
                    and case[5] in distributed_cases.EVERY_VARIANT]


@pytest.fixture(scope="module")
def gloo3_results(tmp_path_factory):
    return _run_gloo(tmp_path_factory.mktemp("gloo3"), 3, THREE_RANK_CASES)


def _failures(results, name):
    return [f"rank {r}: {ranks[name]['failure']}" for r, ranks in enumerate(results) if ranks[name]["failure"]]


@pytest.mark.parametrize("name", distributed_cases.case_ids())
def test_two_ranks_over_gloo_match_the_fp64_reference_and_one_process(gloo_results, name):
    failures = _failures(gloo_results, name)
    assert not failures, "\n".join(failures)


@pytest.mark.parametrize("name", distributed_cases.case_ids(THREE_RANK_CASES))
def test_three_ranks_over_gloo_match_the_fp64_reference_and_one_process(gloo3_results, name):
    failures = _failures(gloo3_results, name)
    assert not failures, "\n".join(failures)


# --- misuse over gloo: every rank raises the same error, none computes with mismatched peers ---------
#
# Each scenario is a call that every rank makes with its own arguments; each rank records what it
# got (the loss, or the exception's type and text) to its file after every scenario, so a rank that
# dies in a collective still leaves the scenarios before it, and the join is bounded so that a hang
# fails the test instead of the suite.

MISUSE_TIMEOUT_S = 150


def _call(rank, n, **options):
    x, w, _, y, _ = distributed_cases.make_case("uneven", n, H, V, torch.float32, WORLD_SIZE, "cpu")
    start, size = lfce_dist.vocab_shard(V, rank, WORLD_SIZE)
    targets = options.pop("targets", y)
    return lfce_dist.linear_cross_entropy(x, w[start:start + size], targets, ignore_index=-100, **options)


def _scenarios(rank):
    """(name, call) in the order every rank makes them; ``call`` runs this rank's side."""
    def wrong_dtype_on_rank_1():
        y = distributed_cases.make_case("uneven", 8, H, V, torch.float32, WORLD_SIZE, "cpu")[3]
        return _call(rank, 8, targets=y.float() if rank == 1 else y)

    def other_targets_on_rank_1():
        y = distributed_cases.make_case("uneven", 8, H, V, torch.float32, WORLD_SIZE, "cpu")[3].clone()
        if rank == 1:
            y[3], y[4] = y[4].item(), y[3].item()
            assert not torch.equal(y, distributed_cases.make_case("uneven", 8, H, V, torch.float32, WORLD_SIZE,
                                                                  "cpu")[3])
        return _call(rank, 8, targets=y)

    return [
        ("reduction", lambda: _call(rank, N, reduction="mean" if rank == 0 else "sum")),
        ("softcap", lambda: _call(rank, N, softcap=[None, 30.0][rank])),
        ("temperature", lambda: _call(rank, N, temperature=[0.5, 0.5000001][rank])),
        ("label_smoothing", lambda: _call(rank, N, label_smoothing=[0.1, 0.0][rank])),
        ("class_weight-on-rank-0", lambda: _call(rank, N, class_weight=torch.ones(18) if rank == 0 else None)),
        ("shift-on-rank-1", lambda: _call(rank, N, shift=rank == 1)),
        ("vocab_start", lambda: _call(rank, N, vocab_start=[0, 20][rank])),
        # Both ranks see N = 8 and N = 16 first, then call with different N: no rank may reuse what
        # it saw alone.
        ("seen-8", lambda: _call(rank, 8)),
        ("seen-16", lambda: _call(rank, 16)),
        ("tokens-after-both-seen", lambda: _call(rank, [8, 16][rank])),
        ("tokens-one-new", lambda: _call(rank, [8, 24][rank])),
        ("sequence-parallel-tokens", lambda: _call(rank, [8, 16][rank], sequence_parallel=True)),
        ("invalid-on-rank-1", wrong_dtype_on_rank_1),
        ("bad-option-on-rank-0", lambda: _call(rank, 8, chunk_size=0 if rank == 0 else None)),
        ("targets-differ", other_targets_on_rank_1),
        ("out-of-memory-on-rank-1", lambda: _failing_on(rank, 1, lambda: _call(rank, 8))),
        ("argmax-ties-tensor", lambda: _argmax_ties(rank, sequence=False)),
        ("argmax-ties-sequence-swapped", lambda: _argmax_ties(rank, sequence=True)),
        ("rows-gradients-tensor", lambda: _rows_gradients(rank, sequence=False)),
        ("rows-gradients-sequence", lambda: _rows_gradients(rank, sequence=True)),
        ("still-fine", lambda: _call(rank, 8)),
    ]


# Tokens 0-5: rows 3 and 30 (on different shards) equal and the largest logits; tokens 6, 7: hidden 0,
# every logit 0. Token 4 is ignored.
TIE_TARGETS = [3, 30, 0, 5, -100, 3, 0, 1]
TIE_PREDICTED = [3, 3, 3, 3, -1, 3, 0, 0]
TIE_ACCURACY = [1.0, 0.0, 0.0, 0.0, 0.0, 1.0, 1.0, 0.0]


def _argmax_ties(rank, sequence):
    """[predicted, accuracy] of this rank's tokens (reduction "none", softcap and temperature), then the
    same of lfce on the whole weight, for logits with exact ties across the shards: in tensor parallel
    the shards in rank order, in sequence parallel swapped (rank 0 holds the last rows, so the lower
    id of each tie is on rank 1)."""
    g = torch.Generator().manual_seed(3)
    x = torch.rand(8, H, generator=g) + 0.5
    x[6:] = 0.0
    w = torch.randn(V, H, generator=g) * 0.05
    w[3] = w[30] = 1.0
    y = torch.tensor(TIE_TARGETS)
    start, size, vocab_start = distributed_cases.shard_of("swapped" if sequence else "uneven", V, rank, WORLD_SIZE)
    assert (3 in range(start, start + size)) != (30 in range(start, start + size))
    tokens = slice(rank * 4, rank * 4 + 4) if sequence else slice(None)
    options = {"reduction": "none", "softcap": 5.0, "temperature": 0.7, "return_predicted": True,
               "return_accuracy": True}
    out = lfce_dist.linear_cross_entropy(x[tokens], w[start:start + size], y[tokens], vocab_start=vocab_start,
                                         sequence_parallel=sequence, **options)
    whole = lfce.linear_cross_entropy(x, w, y, **options)
    return torch.cat([out.predicted.double(), out.accuracy.double(), whole.predicted[tokens].double(),
                      whole.accuracy[tokens].double()])


def _rows_gradients(rank, sequence):
    """[max |grad_hidden - one process's|, whether the kernels got grad_lse] for a backward through
    lse and entropy alone (no gradient reaches the loss), then [.., ..] for one through the loss alone
    with return_lse (no gradient reaches the rows: none is passed in tensor parallel; sequence
    parallel gathers zeros, every rank making the same collectives)."""
    x, w, _, y, _ = distributed_cases.make_case("uneven", 8, H, V, torch.float32, WORLD_SIZE, "cpu")
    start, size = lfce_dist.vocab_shard(V, rank, WORLD_SIZE)
    tokens = slice(rank * 4, rank * 4 + 4) if sequence else slice(None)
    passed, original = [], lfce_dist.local_backward

    def spy(*args):
        passed.append(float(args[9] is not None))  # grad_lse
        return original(*args)

    lfce_dist.local_backward = spy
    results = []
    try:
        for objective in (lambda out: (out.lse + 0.5 * out.entropy).sum(), lambda out: out.loss):
            xr = x[tokens].clone().requires_grad_()
            out = lfce_dist.linear_cross_entropy(xr, w[start:start + size], y[tokens], sequence_parallel=sequence,
                                                 return_lse=True, return_entropy=True)
            objective(out).backward()
            whole = x.clone().requires_grad_()
            objective(lfce.linear_cross_entropy(whole, w, y, return_lse=True, return_entropy=True)).backward()
            results.append(float((xr.grad - whole.grad[tokens]).abs().max()))
    finally:
        lfce_dist.local_backward = original
    return torch.tensor([results[0], passed[0], results[1], passed[1]], dtype=torch.float64)


def _failing_on(rank, failing_rank, call):
    """``call`` with, on ``failing_rank``, a failure that is no argument error before any collective
    (as an out-of-memory in the autocast copy would be)."""
    if rank != failing_rank:
        return call()

    def out_of_memory(tensors):
        raise RuntimeError("CUDA out of memory (simulated)")

    saved = lfce_dist.functional._autocast
    lfce_dist.functional._autocast = out_of_memory
    try:
        return call()
    finally:
        lfce_dist.functional._autocast = saved


def _misuse_worker(rank, port, out_dir):
    _join_gloo(rank, port, WORLD_SIZE, 60)
    results = {}
    path = os.path.join(out_dir, f"misuse{rank}.json")
    for name, call in _scenarios(rank):
        try:
            loss = call()
            results[name] = {"loss": loss.tolist()}
        except Exception as error:  # noqa: BLE001 - recorded as the built-in kind, and whether lfce raised it
            kind = next(k.__name__ for k in (TypeError, ValueError, RuntimeError, Exception) if isinstance(error, k))
            results[name] = {"error": f"{kind}: {error}", "lfce": isinstance(error, lfce.LfceError),
                             "class": type(error).__name__}
        with open(path + ".tmp", "w") as f:
            json.dump(results, f)
        os.replace(path + ".tmp", path)
    os._exit(0)  # as _worker: no teardown


@pytest.fixture(scope="module")
def misuse_results(tmp_path_factory):
    return run_ranks(_misuse_worker, WORLD_SIZE, tmp_path_factory.mktemp("gloo-misuse"), "misuse", MISUSE_TIMEOUT_S)


def _same_error_everywhere(misuse_results, name, *fragments):
    results, hung, exits = misuse_results
    got = [rank_results.get(name) for rank_results in results]
    assert all(g is not None for g in got), (
        f"{name}: a rank recorded nothing (hung: {hung}, exit codes: {exits}; recorded: {got})")
    errors = [g.get("error") for g in got]
    assert all(errors), f"{name}: a rank computed instead of raising: {got}"
    assert all(g["lfce"] for g in got), f"{name}: not an lfce.LfceError: {got}"
    assert len(set(errors)) == 1, f"{name}: the ranks raised different errors: {errors}"
    for fragment in fragments:
        assert fragment in errors[0], f"{name}: {errors[0]!r} does not say {fragment!r}"


def test_ranks_that_disagree_on_the_reduction_all_get_the_error(misuse_results):
    _same_error_everywhere(misuse_results, "reduction", "ValueError: lfce.distributed: reduction differs across "
                           "the ranks of the group (rank 0: mean, rank 1: sum)")


def test_ranks_that_disagree_on_softcap_or_temperature_all_get_the_error(misuse_results):
    _same_error_everywhere(misuse_results, "softcap", "ValueError: lfce.distributed: softcap differs across "
                           "the ranks of the group (rank 0: None, rank 1: 30.0)")
    _same_error_everywhere(misuse_results, "temperature", "temperature differs across the ranks of the group "
                           "(rank 0: 0.5, rank 1: 0.5000001)")


def test_ranks_that_disagree_on_a_weighting_option_or_the_shift_all_get_the_error(misuse_results):
    _same_error_everywhere(misuse_results, "label_smoothing", "ValueError: lfce.distributed: label_smoothing differs "
                           "across the ranks of the group (rank 0: 0.1, rank 1: 0.0)")
    _same_error_everywhere(misuse_results, "class_weight-on-rank-0", "ValueError: lfce.distributed: whether a "
                           "class_weight shard is given differs across the ranks of the group (rank 0: 1, rank 1: 0)")
    _same_error_everywhere(misuse_results, "shift-on-rank-1", "ValueError: lfce.distributed: the causal shift "
                           "(shift=True: the targets' last dimension T; 0: no shift) differs across the ranks of the "
                           "group (rank 0: 0, rank 1: 12)")


def test_shards_that_overlap_are_an_error_on_every_rank(misuse_results):
    _same_error_everywhere(misuse_results, "vocab_start",
                           "rank 1's shard starts at vocab_start=20 but the shards before it end at 18")


def test_token_counts_that_differ_are_an_error_on_every_rank_after_each_rank_saw_both(misuse_results):
    results = misuse_results[0]
    for name in ("seen-8", "seen-16"):
        assert all("loss" in r.get(name, {}) for r in results), f"{name}: {[r.get(name) for r in results]}"
    _same_error_everywhere(misuse_results, "tokens-after-both-seen", "ValueError: lfce.distributed: the token "
                           "count", "(rank 0: 8, rank 1: 16)")


def test_token_counts_that_differ_are_an_error_on_every_rank_when_one_is_new(misuse_results):
    _same_error_everywhere(misuse_results, "tokens-one-new", "the token count", "(rank 0: 8, rank 1: 24)")


def test_sequence_parallel_token_counts_that_differ_are_an_error_on_every_rank(misuse_results):
    _same_error_everywhere(misuse_results, "sequence-parallel-tokens", "(rank 0: 8, rank 1: 16)")


def test_an_argument_invalid_on_one_rank_is_the_same_error_on_every_rank(misuse_results):
    _same_error_everywhere(misuse_results, "invalid-on-rank-1", "TypeError: lfce.distributed: rank 1's arguments "
                           "are invalid", "targets must be", "float32")
    _same_error_everywhere(misuse_results, "bad-option-on-rank-0", "ValueError: lfce.distributed: rank 0's "
                           "arguments are invalid", "chunk_size")


def test_targets_that_differ_in_tensor_parallel_are_an_error_on_every_rank(misuse_results):
    _same_error_everywhere(misuse_results, "targets-differ", "the targets differ across the ranks of the group "
                           "(rank 1 against rank 0)", "sequence_parallel=True")


def test_a_failure_that_is_no_argument_error_stops_every_rank_naming_the_rank(misuse_results):
    results, hung, exits = misuse_results
    got = [r.get("out-of-memory-on-rank-1") for r in results]
    assert all(got), f"a rank recorded nothing (hung: {hung}, exit codes: {exits}; recorded: {got})"
    # The failing rank raises its own exception, whole; its peer a ProcessGroupError naming it.
    assert got[1]["class"] == "RuntimeError" and "CUDA out of memory (simulated)" in got[1]["error"], got
    assert got[0]["class"] == "ProcessGroupError" and got[0]["lfce"], got
    assert "rank 1 failed before its collectives" in got[0]["error"], got
    assert "CUDA out of memory (simulated)" in got[0]["error"], got


@pytest.mark.parametrize("name", ["argmax-ties-tensor", "argmax-ties-sequence-swapped"])
def test_exact_ties_across_the_shards_go_to_the_lowest_id_as_on_one_process(misuse_results, name):
    results, hung, exits = misuse_results
    for rank, rank_results in enumerate(results):
        got = rank_results.get(name)
        assert got and "loss" in got, f"rank {rank}: {got} (hung: {hung}, exit codes: {exits})"
        tokens = slice(rank * 4, rank * 4 + 4) if "sequence" in name else slice(None)
        predicted, accuracy, whole_predicted, whole_accuracy = torch.tensor(got["loss"]).reshape(4, -1).tolist()
        assert whole_predicted == TIE_PREDICTED[tokens] and whole_accuracy == TIE_ACCURACY[tokens], got
        assert predicted == whole_predicted, f"rank {rank}: predicted {predicted}, one process {whole_predicted}"
        assert accuracy == whole_accuracy, f"rank {rank}: accuracy {accuracy}, one process {whole_accuracy}"


@pytest.mark.parametrize("layout", ["tensor", "sequence"])
def test_gradients_through_the_rows_alone_or_the_loss_alone_match_one_process(misuse_results, layout):
    results = misuse_results[0]
    for rank, rank_results in enumerate(results):
        got = rank_results.get(f"rows-gradients-{layout}")
        assert got and "loss" in got, f"rank {rank}: {got}"
        rows_error, rows_passed, loss_error, loss_passed = got["loss"]
        assert rows_error < 1e-5 and loss_error < 1e-5, f"rank {rank}: grad_hidden off by {rows_error}, {loss_error}"
        assert rows_passed == 1.0, f"rank {rank}: the rows' gradients were not passed to the shard backward"
        assert loss_passed == (1.0 if layout == "sequence" else 0.0), f"rank {rank}: grad_lse passed: {loss_passed}"


def test_the_group_still_works_after_every_misuse(misuse_results):
    results, hung, exits = misuse_results
    assert not hung and exits == [0] * WORLD_SIZE, f"hung ranks {hung}, exit codes {exits}"
    losses = [r.get("still-fine", {}).get("loss") for r in results]
    assert losses[0] is not None and losses[0] == losses[1], losses
    assert losses[0] == results[0]["seen-8"]["loss"]


def test_parallel_bench_names_a_bad_layout(capsys):
    from bench import parallel

    assert parallel.parse_args([]).layouts == ["tensor", "sequence"]
    with pytest.raises(SystemExit):
        parallel.parse_args(["--layouts", "pipeline"])
    assert "got ['recompute', 'eager'], ['pipeline']" in capsys.readouterr().err


def test_targets_checksum_sees_a_changed_and_a_swapped_target_but_not_the_dtype():
    targets = torch.tensor([5, 17, -100, 36, 0, 17], dtype=torch.int64)
    same = lfce_dist.targets_checksum(targets)
    assert lfce_dist.targets_checksum(targets.clone()).item() == same.item()
    assert lfce_dist.targets_checksum(targets.int()).item() == same.item()
    swapped = targets[[1, 0, 2, 3, 4, 5]]
    changed = targets.clone()
    changed[3] = 35
    assert lfce_dist.targets_checksum(swapped).item() != same.item()
    assert lfce_dist.targets_checksum(changed).item() != same.item()


# --- torch.compile over gloo: one graph, the same results -------------------------------------------
#
# On each of two ranks a tiny model (Linear, then the vocabulary-parallel loss on this rank's shard of
# the LM head) is traced by torch._dynamo.explain (one graph, no break, the loss as the operator
# lfce::vocab_parallel_forward in it) and compiled with torch.compile(fullgraph=True,
# backend="aot_eager"); forward and backward must give the uncompiled call's loss, outputs and
# gradients (each element within 1e-6; bitwise in practice).

COMPILE_TIMEOUT_S = 420
COMPILE_TOLERANCE = 1e-6
# name: (sequence_parallel, keyword options; "accumulate": a weight_grad_accumulator)
COMPILE_SCENARIOS = {
    "tensor-recompute": (False, {}),
    "sequence-recompute": (True, {}),
    "tensor-eager": (False, {"mode": "eager", "reduction": "sum"}),
    "sequence-eager": (True, {"mode": "eager"}),
    "tensor-outputs": (False, {"reduction": "none", "softcap": 5.0, "temperature": 0.7, "z_loss_scale": 0.01,
                               "return_lse": True, "return_entropy": True, "return_logprob": True,
                               "return_accuracy": True, "return_predicted": True, "return_z_loss": True}),
    "sequence-outputs": (True, {"softcap": 5.0, "return_lse": True, "return_entropy": True,
                                "return_accuracy": True, "return_predicted": True, "return_z_loss": True}),
    "tensor-accumulate": (False, {"accumulate": True, "reduction": "sum"}),
    "tensor-weighted": (False, {"label_smoothing": 0.1, "class_weight": True, "token_scaling": True, "shift": True,
                                "return_logprob": True, "return_entropy": True}),
    "sequence-weighted": (True, {"reduction": "none", "label_smoothing": 0.1, "class_weight": True, "shift": True,
                                 "z_loss_scale": 0.01, "return_lse": True, "return_z_loss": True}),
    "sequence-eager-smoothing": (True, {"mode": "eager", "label_smoothing": 0.1, "token_scaling": True}),
}


class _CompiledLossModel(torch.nn.Module):
    """Linear [H, H] (with bias), then lfce.distributed on this rank's shard of the LM head (with bias)."""

    def __init__(self, head, head_bias, sequence, options, class_weight=None):
        super().__init__()
        self.proj = torch.nn.Linear(H, H)
        self.head = torch.nn.Parameter(head.clone())
        self.head_bias = torch.nn.Parameter(head_bias.clone())
        self.register_buffer("class_weight", class_weight)
        self.sequence, self.options = sequence, options

    def forward(self, x, y, accumulator=None):
        return lfce_dist.linear_cross_entropy(self.proj(x), self.head, y, self.head_bias,
                                              sequence_parallel=self.sequence, weight_grad_accumulator=accumulator,
                                              class_weight=self.class_weight, **self.options)


def _compile_objective(out, y):
    """A scalar of every differentiable output (fixed weights per token), and the detached outputs."""
    loss, fields = distributed_cases._fields(out)
    scale = torch.linspace(0.5, 1.5, y.numel()).reshape(y.shape)
    total = (loss * scale).sum() if loss.dim() else loss
    rows = [fields[name] for name in distributed_cases.ROWS if fields.get(name) is not None]
    for i, row in enumerate(rows):
        total = total + (row * scale.flip(0) * (i + 1)).sum()
    detached = [fields[name] for name in distributed_cases.DETACHED if fields.get(name) is not None]
    assert not any(t.requires_grad for t in detached), "an output without a gradient requires one"
    return total, [loss] + rows + detached


def _compile_scenario(rank, sequence, options):
    """(graph count, graph break count, whether the graph holds the operator, [(name, max |compiled -
    eager|, bitwise equal)])."""
    import copy

    options = dict(options)
    accumulate = options.pop("accumulate", False)
    x, w, b, y, _ = distributed_cases.make_case("uneven", N, H, V, torch.float32, WORLD_SIZE, "cpu")
    start, size = lfce_dist.vocab_shard(V, rank, WORLD_SIZE)
    shift = options.get("shift", False)
    tokens = distributed_cases._tokens("sequence" if sequence else "tensor", N, rank, WORLD_SIZE, shift)
    x, y = (distributed_cases._sequences(t[tokens], shift).contiguous() for t in (x, y))
    class_weight = distributed_cases.class_weights(V, "cpu")[start:start + size] \
        if options.pop("class_weight", False) else None
    torch.manual_seed(7)
    eager_model = _CompiledLossModel(w[start:start + size], b[start:start + size], sequence, options, class_weight)
    compiled_model = copy.deepcopy(eager_model)
    accumulators = [torch.full((size, H), 0.25) if accumulate else None for _ in range(2)]

    def run(model, accumulator):
        total, values = _compile_objective(model(x, y, accumulator), y)
        total.backward()
        grads = [p.grad for p in model.parameters()]
        return [t.detach() for t in values] + [g if g is not None else torch.zeros(0) for g in grads] + \
            ([accumulator] if accumulator is not None else [])

    expected = run(eager_model, accumulators[0])
    torch._dynamo.reset()
    explained = torch._dynamo.explain(compiled_model)(x, y, accumulators[1])
    in_graph = any("vocab_parallel_forward" in graph.code for graph in explained.graphs)
    torch._dynamo.reset()
    got = run(torch.compile(compiled_model, fullgraph=True, backend="aot_eager"), accumulators[1])
    compared = []  # the loss, the rows, the detached outputs, the parameters' gradients, the accumulator
    for i, (a, e) in enumerate(zip(got, expected)):
        same_shape = a.shape == e.shape and a.dtype == e.dtype
        diff = float((a.double() - e.double()).abs().max()) if same_shape and a.numel() else 0.0
        compared.append((f"value {i}", diff if same_shape else float("inf"), same_shape and torch.equal(a, e)))
    if len(got) != len(expected):
        compared.append(("value count", float("inf"), False))
    return explained.graph_count, explained.graph_break_count, in_graph, compared


def _compile_worker(rank, port, out_dir):
    _join_gloo(rank, port, WORLD_SIZE, 120)
    results = {}
    path = os.path.join(out_dir, f"compile{rank}.json")
    for name, (sequence, options) in COMPILE_SCENARIOS.items():
        try:
            graphs, breaks, in_graph, compared = _compile_scenario(rank, sequence, options)
            results[name] = {"graphs": graphs, "breaks": breaks, "in_graph": in_graph, "compared": compared}
        except Exception as error:  # noqa: BLE001 - recorded, and the next scenario runs
            results[name] = {"error": f"{type(error).__name__}: {error}"[:4000]}
        with open(path + ".tmp", "w") as f:
            json.dump(results, f)
        os.replace(path + ".tmp", path)
    os._exit(0)  # as _worker: no teardown


@pytest.fixture(scope="module")
def compile_results(tmp_path_factory):
    return run_ranks(_compile_worker, WORLD_SIZE, tmp_path_factory.mktemp("gloo-compile"), "compile",
                     COMPILE_TIMEOUT_S)


@pytest.mark.skipif(not lfce_dist.HAVE_CUSTOM_OPS, reason="torch.library.custom_op needs PyTorch 2.4+")
@pytest.mark.parametrize("name", list(COMPILE_SCENARIOS))
def test_torch_compile_traces_the_loss_in_one_graph_with_the_uncompiled_results(compile_results, name):
    results, hung, exits = compile_results
    for rank, rank_results in enumerate(results):
        got = rank_results.get(name)
        assert got is not None, f"rank {rank} recorded nothing (hung: {hung}, exit codes: {exits})"
        assert "error" not in got, f"rank {rank}: {got['error']}"
        assert (got["graphs"], got["breaks"]) == (1, 0), f"rank {rank}: {got['graphs']} graphs, {got['breaks']} breaks"
        assert got["in_graph"], f"rank {rank}: lfce::vocab_parallel_forward is not in the traced graph"
        off = [(what, diff) for what, diff, _ in got["compared"] if not diff <= COMPILE_TOLERANCE]
        assert not off, f"rank {rank}: compiled against uncompiled: {off}"
