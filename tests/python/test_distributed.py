"""lfce.distributed without a GPU: the layout checks, the target mapping and the LSE combination as
pure functions, the argument checks, and the whole algorithm over torch.distributed's gloo backend
with two processes, the shard kernels replaced by a CPU model of their contract
(distributed_model.py), against the fp64 reference (distributed_cases.py: both layouts, both modes,
every reduction, fp32 and bf16, uneven shards, targets in one shard, an ignore_index that is a class
id, shards in swapped order). The same cases run on two GPUs in test_multigpu_distributed.py.
"""

import datetime
import json
import math
import os
import socket

import distributed_cases
import pytest
import torch
import torch.distributed as dist
import torch.multiprocessing as mp
import torch.nn.functional as F

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
    lse, target_logit = lfce_dist.combine(parts[0][0], parts[0][1], group="two ranks")
    torch.testing.assert_close(lse, logits.logsumexp(1))
    expected = logits.gather(1, targets.clamp(min=0)[:, None])[:, 0]
    torch.testing.assert_close(target_logit[targets >= 0], expected[targets >= 0])
    loss, count = lfce_dist.token_losses(lse, target_logit, targets, 37, -100)
    torch.testing.assert_close(loss, F.cross_entropy(logits, targets, reduction="none"))
    assert count.tolist() == [5.0]


def test_a_target_outside_the_vocabulary_gives_a_nan_loss_like_one_gpu():
    lse = torch.zeros(4)
    loss, count = lfce_dist.token_losses(lse, torch.zeros(4), torch.tensor([0, 37, -5, -100]), 37, -100)
    assert loss[0] == 0 and math.isnan(loss[1]) and math.isnan(loss[2]) and loss[3] == 0
    assert count.tolist() == [3.0]


def rows(**changes):
    base = {"vocab_shard": 18, "vocab_start": -1, "tokens": 12, "hidden": 16, "dtype": 0, "target_dtype": 0,
            "has_bias": 0, "ignore_index": -100, "reduction": 0, "mode": 0, "sequence_parallel": 0,
            "need_hidden": 1, "need_weight": 1, "need_bias": 0}
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


def test_a_bad_reduction_is_named():
    with pytest.raises(ValueError, match="reduction must be one of .* got 'avg'"):
        lfce_dist.linear_cross_entropy(*args(), reduction="avg")


@pytest.mark.parametrize("option, value", [("label_smoothing", 0.1), ("class_weight", torch.ones(5)),
                                           ("token_scaling", True),
                                           ("weight_grad_accumulator", torch.zeros(5, 16)),
                                           ("bias_grad_accumulator", torch.zeros(5))])
def test_loss_options_not_supported_yet_are_named(option, value):
    with pytest.raises(TypeError, match=f"unexpected keyword argument '{option}'"):
        lfce_dist.linear_cross_entropy(*args(), **{option: value})
    with pytest.raises(TypeError, match=f"unexpected keyword argument '{option}'"):
        lfce_dist.VocabParallelLinearCrossEntropyLoss(**{option: value})


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

def _free_port():
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _worker(rank, port, out_dir):
    import distributed_model

    distributed_model.install()
    dist.init_process_group("gloo", init_method=f"tcp://127.0.0.1:{port}", rank=rank, world_size=WORLD_SIZE,
                            timeout=datetime.timedelta(seconds=120))
    results = {}
    try:
        for case, name in zip(distributed_cases.cases(), distributed_cases.case_ids()):
            loss, failure = distributed_cases.check_case(case, rank, WORLD_SIZE, N, H, V, "cpu")
            if case[2] != "none":  # the loss is the same bits on every rank
                loss = loss.reshape(1)
                losses = [torch.empty_like(loss) for _ in range(WORLD_SIZE)]
                dist.all_gather(losses, loss)
                if not all(torch.equal(other, losses[0]) for other in losses):
                    failure = f"the ranks' losses differ: {losses}"
            results[name] = failure
        results.update(_misuse(rank))
    finally:
        dist.destroy_process_group()
    with open(os.path.join(out_dir, f"rank{rank}.json"), "w") as f:
        json.dump(results, f)
    # The results are on disk: leave without the interpreter's teardown, where torch 2.11's gloo
    # aborts about one run in two ("terminate called without an active exception", after
    # destroy_process_group returned; lfce's library is not loaded in these workers).
    os._exit(0)


def _misuse(rank):
    """Arguments that differ between the ranks: the same ValueError on every rank."""
    messages = {}
    x, w, _, y, _ = distributed_cases.make_case("uneven", N, H, V, torch.float32, WORLD_SIZE, "cpu")
    start, size = lfce_dist.vocab_shard(V, rank, WORLD_SIZE)
    for name, options in (("reduction", {"reduction": "mean" if rank == 0 else "sum"}),
                          ("vocab_start", {"vocab_start": [0, 20][rank]})):
        try:
            lfce_dist.linear_cross_entropy(x, w[start:start + size], y, ignore_index=-100, **options)
            messages["misuse-" + name] = "no error"
        except ValueError as error:
            messages["misuse-" + name] = "ValueError: " + str(error)
    return messages


@pytest.fixture(scope="module")
def gloo_results(tmp_path_factory):
    out = tmp_path_factory.mktemp("gloo")
    mp.spawn(_worker, args=(_free_port(), str(out)), nprocs=WORLD_SIZE, join=True)
    results = []
    for rank in range(WORLD_SIZE):
        with open(out / f"rank{rank}.json") as f:
            results.append(json.load(f))
    return results


@pytest.mark.parametrize("name", distributed_cases.case_ids())
def test_two_ranks_over_gloo_match_the_fp64_reference(gloo_results, name):
    failures = [f"rank {r}: {results[name]}" for r, results in enumerate(gloo_results) if results[name]]
    assert not failures, "\n".join(failures)


def test_ranks_that_disagree_on_the_reduction_all_get_the_error(gloo_results):
    for rank, results in enumerate(gloo_results):
        assert results["misuse-reduction"].startswith("ValueError: lfce.distributed: reduction differs across the "
                                                      "ranks of the group (rank 0: mean, rank 1: sum)"), (
            f"rank {rank}: {results['misuse-reduction']}")


def test_shards_that_overlap_are_an_error_on_every_rank(gloo_results):
    for rank, results in enumerate(gloo_results):
        assert "rank 1's shard starts at vocab_start=20 but the shards before it end at 18" in \
            results["misuse-vocab_start"], f"rank {rank}: {results['misuse-vocab_start']}"


def test_parallel_bench_names_a_bad_layout(capsys):
    from lfce.bench import parallel

    assert parallel.parse_args([]).layouts == ["tensor", "sequence"]
    with pytest.raises(SystemExit):
        parallel.parse_args(["--layouts", "pipeline"])
    assert "got ['recompute', 'eager'], ['pipeline']" in capsys.readouterr().err
