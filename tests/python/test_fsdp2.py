"""lfce.transformers under FSDP2 (torch.distributed.fsdp.fully_shard) without a GPU: two processes
over gloo on a CPU device mesh, each training a patched tiny model (Llama, Llama with its lm_head
sharded on its own, Llama patched after sharding, Llama under FSDP2's fp32 mixed precision, Mixtral
with its router loss, Gemma2 with its softcap and tied embeddings) sharded per decoder layer and at
the root, against the unsharded patched model and the stock model (fsdp2_cases.py); and lfce.linear_cross_entropy given the sharded weight itself (a DTensor):
lfce's error naming the fix. Each rank writes its results to a file after every case, the join is
bounded, so a rank that dies or hangs fails the test with what it recorded. Skipped (visibly) where
transformers or FSDP2 is missing (a failure in ctest's python.cpu.torch).
"""

import datetime
import json
import os

import pytest
import torch
from conftest import missing_dependency

try:
    import transformers  # noqa: F401
    from torch.distributed.fsdp import fully_shard  # noqa: F401
except ImportError as missing:
    pytest.skip(missing_dependency(f"FSDP2 with transformers needs torch 2.6+ and transformers ({missing})"),
                allow_module_level=True)

import fsdp2_cases
import torch.distributed as dist
from gloo_launch import run_ranks

WORLD_SIZE = 2
TIMEOUT_S = 100
CASES = [*fsdp2_cases.MODELS, "direct-dtensor-weight"]


def _worker(rank, port, out_dir):
    torch.set_num_threads(1)
    dist.init_process_group("gloo", init_method=f"tcp://127.0.0.1:{port}", rank=rank, world_size=WORLD_SIZE,
                            timeout=datetime.timedelta(seconds=TIMEOUT_S))
    path = os.path.join(out_dir, f"rank{rank}.json")
    results = {}

    def record(name, failure, worst):
        results[name] = {"failure": failure, "worst": worst}
        with open(path + ".tmp", "w") as f:
            json.dump(results, f)
        os.replace(path + ".tmp", path)

    fsdp2_cases.run_all(rank, WORLD_SIZE, record)
    # As test_distributed.py's workers: the results are on disk, leave without gloo's teardown.
    os._exit(0)


@pytest.fixture(scope="module")
def fsdp2_results(tmp_path_factory):
    return run_ranks(_worker, WORLD_SIZE, tmp_path_factory.mktemp("fsdp2"), "rank", TIMEOUT_S)


@pytest.mark.parametrize("name", CASES)
def test_fully_sharded_patched_model_matches_the_unsharded_and_stock_models(fsdp2_results, name):
    results, hung, exits = fsdp2_results
    got = [rank_results.get(name) for rank_results in results]
    assert all(g is not None for g in got), f"{name}: a rank recorded nothing (hung: {hung}, exit codes: {exits}; " \
                                            f"recorded: {results})"
    failures = [f"rank {rank}: {g['failure']}" for rank, g in enumerate(got) if g["failure"]]
    assert not failures, "\n".join(failures)
