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
import time

import distributed_cases
import pytest
import torch
import torch.distributed as dist
import torch.multiprocessing as mp
import torch.nn.functional as F

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
    finally:
        dist.destroy_process_group()
    with open(os.path.join(out_dir, f"rank{rank}.json"), "w") as f:
        json.dump(results, f)
    # The results are on disk: leave without the interpreter's teardown, where torch 2.11's gloo
    # aborts about one run in two ("terminate called without an active exception", after
    # destroy_process_group returned; lfce's library is not loaded in these workers).
    os._exit(0)


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
        ("still-fine", lambda: _call(rank, 8)),
    ]


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
    import distributed_model

    distributed_model.install()
    dist.init_process_group("gloo", init_method=f"tcp://127.0.0.1:{port}", rank=rank, world_size=WORLD_SIZE,
                            timeout=datetime.timedelta(seconds=60))
    results = {}
    path = os.path.join(out_dir, f"misuse{rank}.json")
    for name, call in _scenarios(rank):
        try:
            loss = call()
            results[name] = {"loss": loss.item()}
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
    out = tmp_path_factory.mktemp("gloo-misuse")
    context = mp.get_context("spawn")
    port = _free_port()
    processes = [context.Process(target=_misuse_worker, args=(rank, port, str(out))) for rank in range(WORLD_SIZE)]
    for process in processes:
        process.start()
    deadline = time.monotonic() + MISUSE_TIMEOUT_S
    for process in processes:
        process.join(max(0.0, deadline - time.monotonic()))
    hung = [rank for rank, process in enumerate(processes) if process.is_alive()]
    for process in processes:
        if process.is_alive():
            process.kill()
            process.join()
    results = []
    for rank in range(WORLD_SIZE):
        path = out / f"misuse{rank}.json"
        results.append(json.loads(path.read_text()) if path.exists() else {})
    exits = [process.exitcode for process in processes]
    return results, hung, exits


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
