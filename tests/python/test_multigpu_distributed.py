"""lfce.distributed on two GPUs over NCCL (run by scripts/multigpu_tests.sh: torchrun, one process a
GPU, every rank running these tests in the same order; each writes its own JUnit XML).

* Every case of distributed_cases (tensor- and sequence-parallel layouts, recompute and eager,
  mean / sum / none, fp32 and bf16; V = 151937 split 75968 / 75969; targets all in rank 0's shard;
  an ignore_index that is a class id; shards in swapped order; every fifth target ignored; softcap,
  temperature, the z-loss, the lse / entropy / logprob outputs with their gradients, predicted /
  accuracy, label smoothing, class weights, token scaling, the causal shift, accumulators) against
  the fp64 reference (the suite's tolerances, checks.GRAD / LOSS) and against lfce on one GPU with
  the whole weight (fp32 reassociation; distributed_cases.SAME_AS_ONE_GPU); the loss is the same
  bits on both ranks.
* Several vocabulary chunks per shard (the backward's fp32 grad_hidden accumulator), with every
  supported option and output.
* Memory held between forward and backward per rank (tensor parallel, recompute): <= 8·N + 1 MiB.
* Ranks that disagree on an option: the same ValueError on both.

A failed check is asserted only after the case's last collective, so the other rank never waits.
With LFCE_MULTIGPU_ONE_GPU=1 the ranks share GPU 0 and talk over gloo (conftest.one_gpu_world): the
same checks of the shard kernels on a machine with one GPU, without NCCL.
"""

import datetime
import os

import conftest
import distributed_cases
import pytest
import torch
import torch.distributed as dist

import lfce.distributed as lfce_dist

pytestmark = pytest.mark.multigpu

N, H, V = 256, 1024, 151937  # N even: 128 tokens a rank in sequence parallel
MIB = 1 << 20


@pytest.fixture(scope="module")
def group():
    if not dist.is_initialized():
        one_gpu = conftest.one_gpu_world()  # every rank on GPU 0, over gloo
        torch.cuda.set_device(0 if one_gpu else int(os.environ.get("LOCAL_RANK", "0")))
        dist.init_process_group("gloo" if one_gpu else "nccl", timeout=datetime.timedelta(minutes=5))
    yield dist.group.WORLD
    dist.barrier()
    dist.destroy_process_group()


def same_on_every_rank(loss):
    """None, or a message naming the ranks' losses when they differ in any bit."""
    loss = loss.reshape(-1).contiguous()  # a 0-dim loss as [1]
    losses = [torch.empty_like(loss) for _ in range(dist.get_world_size())]
    dist.all_gather(losses, loss)
    if all(torch.equal(other, losses[0]) for other in losses):
        return None
    return "the ranks' losses differ: " + ", ".join(repr(t.tolist()) for t in losses)


@pytest.mark.parametrize("case", distributed_cases.cases(), ids=distributed_cases.case_ids())
def test_two_gpus_match_one_gpu_and_the_fp64_reference(group, case, record_error):
    rank, world = dist.get_rank(), dist.get_world_size()
    loss, failure = distributed_cases.check_case(case, rank, world, N, H, V, "cuda", record_error, whole=True)
    across = None if case[2] == "none" else same_on_every_rank(loss)
    assert failure is None and across is None, f"rank {rank}: {failure or across}"


@pytest.mark.parametrize("layout", distributed_cases.LAYOUTS)
def test_several_vocab_chunks_per_shard(group, layout, record_error):
    """chunk_size 4096: 19 chunks a shard, the fp32 grad_hidden accumulator across them."""
    rank, world = dist.get_rank(), dist.get_world_size()
    case = (layout, "recompute", "mean", torch.bfloat16, "uneven", "outputs")
    loss, failure = distributed_cases.check_case(case, rank, world, N, H, V, "cuda", record_error, whole=True,
                                                 chunk_size=4096)
    across = same_on_every_rank(loss)
    assert failure is None and across is None, f"rank {rank}: {failure or across}"


@pytest.mark.parametrize("reduction", ["mean", "none"])
def test_held_memory_per_rank_is_the_log_sum_exp(group, reduction, record_property):
    """Tensor parallel, recompute, llama3-8b's head at N = 4096 over 2 ranks: what the forward leaves
    allocated beyond its loss is the global LSE and the count: <= 8·N bytes + 1 MiB."""
    n, h, v = 4096, 4096, 128256
    rank, world = dist.get_rank(), dist.get_world_size()
    start, size = lfce_dist.vocab_shard(v, rank, world)
    g = torch.Generator(device="cuda").manual_seed(0)
    x = torch.randn(n, h, device="cuda", generator=g).to(torch.bfloat16).requires_grad_()
    w = (torch.randn(v, h, device="cuda", generator=g) * (2.5 / h ** 0.5)).to(torch.bfloat16)[start:start + size]
    w = w.clone().requires_grad_()
    y = torch.randint(0, v, (n,), device="cuda", generator=g)
    y[::17] = -100
    warm = lfce_dist.linear_cross_entropy(x, w, y, reduction=reduction)  # kernels and the layout check
    torch.autograd.grad(warm, (x, w), torch.ones_like(warm))
    del warm
    torch.cuda.synchronize()
    before = torch.cuda.memory_allocated()
    loss = lfce_dist.linear_cross_entropy(x, w, y, reduction=reduction)
    torch.cuda.synchronize()
    held = torch.cuda.memory_allocated() - before - loss.numel() * loss.element_size()
    grads = torch.autograd.grad(loss, (x, w), torch.ones_like(loss))
    torch.cuda.synchronize()
    del grads, loss
    record_property("held_bytes", held)
    bound = 8 * n + MIB
    assert held <= bound, f"rank {rank} held {held} bytes between forward and backward; bound 8*N + 1 MiB = {bound}"


def test_ranks_that_disagree_on_the_reduction_all_get_the_error(group):
    rank, world = dist.get_rank(), dist.get_world_size()
    x, w, b, y, _ = distributed_cases.make_case("uneven", 8, 64, 1000, torch.bfloat16, world, "cuda")
    start, size = lfce_dist.vocab_shard(1000, rank, world)
    reduction = "mean" if rank == 0 else "sum"
    with pytest.raises(ValueError, match=r"reduction differs across the ranks of the group \(rank 0: mean, rank 1: "
                                         r"sum"):
        lfce_dist.linear_cross_entropy(x, w[start:start + size], y, b[start:start + size], reduction=reduction)
