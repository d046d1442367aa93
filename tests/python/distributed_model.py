"""lfce.distributed on CPU tensors, for testing it without a GPU over gloo.

lfce.distributed runs each rank's shard through lfce's own operators: the CUDA kernels for CUDA
tensors, lfce's CPU implementation (python/lfce/_cpu.py: the same contract, chunked over the
vocabulary, fp32 accumulation) for CPU tensors. Its entry point takes CUDA tensors only (NCCL is
the product's backend); ``install`` lets it take CPU tensors in this process, so the gloo tests run
the whole algorithm (handshake, shard operators, collectives, autograd) on the CPU.
"""


def install():
    """Let lfce.distributed take CPU tensors (in this process)."""
    from lfce import functional

    functional._DEVICE_TYPE = "cpu"
