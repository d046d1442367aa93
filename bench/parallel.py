"""lfce.distributed on P GPUs against lfce on one GPU with the whole problem, in one torchrun job.

    torchrun --standalone --nproc_per_node 2 -m bench.parallel --json parallel.json
    torchrun --standalone --nproc_per_node 2 -m bench.parallel --model llama3-70b --tokens 8192

Rank 0 first runs the whole problem alone (the other ranks wait at a barrier); then every rank runs
lfce.distributed on its vocabulary shard (equal split, remainder on the last ranks), for each
layout (tensor / sequence parallel) and mode. Each time is the median of CUDA-event timings of
forward + backward (w.r.t. hidden and the weight) over --iters steps after --warmup; a
distributed step takes the slowest rank's time. speedup = one GPU / P GPUs.

The collectives' share: the same collectives alone (the forward's all-gather of 2·N fp32; then the
all-reduce of grad_hidden [N, H], or in sequence parallel the all-gathers of hidden and the
reduce-scatter of grad_hidden), timed the same way, over the distributed step's time: what the
step would lose if nothing overlapped them (lfce overlaps nothing with them).

Rank 0 prints each figure and, with --json PATH, writes them there with the metadata of the
single-GPU harness (meta.metadata(): date, GPU, driver, torch, commit, generator version) and every
rank's GPU. Run from the repository root of a checkout (bench/ is not installed).
"""

import argparse
import datetime
import os
import statistics
import sys

MODES = ("recompute", "eager")
LAYOUTS = ("tensor", "sequence")


def parse_args(argv=None):
    parser = argparse.ArgumentParser(prog="torchrun --nproc_per_node P -m bench.parallel",
                                     description=__doc__.split("\n\n")[0])
    parser.add_argument("--model", default="llama3-70b", help="a preset of the library (default llama3-70b)")
    parser.add_argument("--tokens", type=int, default=8192, help="N (default 8192)")
    parser.add_argument("--modes", default=",".join(MODES))
    parser.add_argument("--layouts", default=",".join(LAYOUTS))
    parser.add_argument("--iters", type=int, default=10)
    parser.add_argument("--warmup", type=int, default=3)
    parser.add_argument("--json", metavar="PATH", help="write the figures and their metadata as JSON to PATH")
    args = parser.parse_args(argv)
    args.modes, args.layouts = args.modes.split(","), args.layouts.split(",")
    if not set(args.modes) <= set(MODES) or not set(args.layouts) <= set(LAYOUTS):
        parser.error(f"--modes from {MODES}, --layouts from {LAYOUTS}; got {args.modes}, {args.layouts}")
    if args.iters < 1 or args.warmup < 1 or args.tokens < 1:
        parser.error(f"--iters, --warmup and --tokens must be >= 1, got {args.iters}, {args.warmup}, {args.tokens}")
    return args


def _median_ms(step, warmup, iters):
    """Median CUDA-event time of ``step()`` over ``iters`` runs after ``warmup``."""
    import torch

    times = []
    for i in range(warmup + iters):
        start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        start.record()
        step()
        end.record()
        if i >= warmup:
            times.append((start, end))
    torch.cuda.synchronize()
    return statistics.median(s.elapsed_time(e) for s, e in times)


def _slowest(value):
    """The largest of every rank's ``value``."""
    import torch
    import torch.distributed as dist

    t = torch.tensor([value], dtype=torch.float64, device="cuda")
    dist.all_reduce(t, op=dist.ReduceOp.MAX)
    return float(t)


def _collectives_step(x, layout, world):
    """The collectives of one distributed forward + backward, alone."""
    import torch
    import torch.distributed as dist

    n, h = x.shape
    partials = torch.empty(2, n, dtype=torch.float32, device="cuda")
    gathered = partials.new_empty(world * 2, n)
    grad = x.new_empty(n, h)
    if layout == "tensor":
        def step():
            dist.all_gather_into_tensor(gathered, partials)
            dist.all_reduce(grad)
        return step
    local = x[: n // world].contiguous()
    full = x.new_empty(n, h)
    out = x.new_empty(n // world, h)

    def step():
        dist.all_gather_into_tensor(full, local)  # forward
        dist.all_gather_into_tensor(gathered, partials)
        dist.all_gather_into_tensor(full, local)  # backward: hidden again
        dist.reduce_scatter_tensor(out, grad)
    return step


def main(argv=None):
    args = parse_args(argv)
    import torch
    import torch.distributed as dist

    from lfce import distributed as lfce_dist
    from lfce import linear_cross_entropy, presets

    from .impls import IGNORE_INDEX, make_inputs
    from .meta import metadata, save_json

    local_rank = int(os.environ.get("LOCAL_RANK", "0"))
    torch.cuda.set_device(local_rank)
    dist.init_process_group("nccl", timeout=datetime.timedelta(minutes=10))
    rank, world = dist.get_rank(), dist.get_world_size()
    hidden, vocab = presets.table()[args.model]
    n = args.tokens
    x, w, y = make_inputs(n, hidden, vocab, torch.bfloat16)  # the same on every rank (fixed seed)

    def step_of(fn, inputs):
        def step():
            loss = fn(*inputs)
            torch.autograd.grad(loss, inputs[:2])
        return step

    result = {"model": args.model, "tokens": n, "hidden": hidden, "vocab": vocab, "world_size": world,
              "dtype": "bf16", "reduction": "mean", "ignore_index": IGNORE_INDEX, "iters": args.iters,
              "warmup": args.warmup, "one_gpu": {}, "distributed": []}
    for mode in args.modes:
        if rank == 0:
            one = step_of(lambda a, b, c, mode=mode: linear_cross_entropy(a, b, c, mode=mode), (x, w, y))
            result["one_gpu"][mode] = {"total_ms": _median_ms(one, args.warmup, args.iters)}
            print(f"[parallel] one GPU, {mode}: {result['one_gpu'][mode]['total_ms']:.2f} ms", flush=True)
        dist.barrier()
    start, size = lfce_dist.vocab_shard(vocab, rank, world)
    shard = w.detach()[start:start + size].clone().requires_grad_()
    del w
    torch.cuda.empty_cache()
    for layout in args.layouts:
        sequence = layout == "sequence"
        tokens = slice(rank * (n // world), (rank + 1) * (n // world)) if sequence else slice(None)
        xr = x.detach()[tokens].clone().requires_grad_()
        collective_ms = _slowest(_median_ms(_collectives_step(x.detach(), layout, world), args.warmup, args.iters))
        for mode in args.modes:
            fn = (lambda a, b, c, mode=mode, sequence=sequence:
                  lfce_dist.linear_cross_entropy(a, b, c, mode=mode, sequence_parallel=sequence))
            total = _slowest(_median_ms(step_of(fn, (xr, shard, y[tokens])), args.warmup, args.iters))
            entry = {"layout": layout, "mode": mode, "total_ms": total, "collectives_alone_ms": collective_ms,
                     "collective_share": collective_ms / total}
            if mode in result["one_gpu"]:
                entry["speedup_vs_one_gpu"] = result["one_gpu"][mode]["total_ms"] / total
                entry["efficiency"] = entry["speedup_vs_one_gpu"] / world
            result["distributed"].append(entry)
            if rank == 0:
                print(f"[parallel] {world} GPUs, {layout} parallel, {mode}: {total:.2f} ms, collectives alone "
                      f"{collective_ms:.2f} ms ({100 * entry['collective_share']:.1f}%), speedup "
                      f"{entry.get('speedup_vs_one_gpu', float('nan')):.2f}x", flush=True)
    gpus = [None] * world
    dist.all_gather_object(gpus, torch.cuda.get_device_name())
    if rank == 0 and args.json:
        argv = sys.argv[1:] if argv is None else argv
        meta = metadata(f"torchrun --nproc_per_node {world} -m bench.parallel {' '.join(argv)}")
        meta.update(result, gpus=gpus, nccl_env={k: v for k, v in os.environ.items() if k.startswith("NCCL_")})
        print("wrote", save_json(meta, args.json))
    dist.barrier()
    dist.destroy_process_group()
    return 0


if __name__ == "__main__":
    sys.exit(main())
