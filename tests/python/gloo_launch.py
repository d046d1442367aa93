"""Starting the processes of a CPU (gloo) test and collecting what each recorded: a bounded join, so a
rank that dies or hangs fails the test with what it wrote, never the run (test_distributed.py,
test_fsdp2.py)."""

import json
import socket
import time

import torch.multiprocessing as mp


def free_port():
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def run_ranks(worker, world_size, out_dir, name, timeout_s, *args):
    """Runs worker(rank, port, out_dir, *args) in `world_size` spawned processes, at most `timeout_s`
    for all, then kills any left. Returns (each rank's recorded JSON from out_dir/<name><rank>.json,
    {} where it wrote none; the ranks that hung; the exit codes)."""
    context = mp.get_context("spawn")
    port = free_port()
    processes = [context.Process(target=worker, args=(rank, port, str(out_dir), *args)) for rank in range(world_size)]
    for process in processes:
        process.start()
    deadline = time.monotonic() + timeout_s
    for process in processes:
        process.join(max(0.0, deadline - time.monotonic()))
    hung = [rank for rank, process in enumerate(processes) if process.is_alive()]
    for process in processes:
        if process.is_alive():
            process.kill()
            process.join()
    results = []
    for rank in range(world_size):
        path = out_dir / f"{name}{rank}.json"
        results.append(json.loads(path.read_text()) if path.exists() else {})
    return results, hung, [process.exitcode for process in processes]
