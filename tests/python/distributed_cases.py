"""The checks of lfce.distributed shared by the CPU test (gloo, a CPU model of the kernels) and the
multi-GPU test (NCCL, lfce's kernels): one case = layout x mode x reduction x dtype x variant, run on
every rank of the group with the same inputs (same seed), each rank checking its own results.

Variants: "uneven" (V odd: rank 0 holds V // 2 rows, the last rank one more), "one_shard" (every
target in rank 0's shard), "ignore_class" (ignore_index is a class id of the last shard: the shard
kernels must not ignore the class that maps onto it), "swapped" (vocab_start given, rank 0 holding
the last rows).
"""

import itertools
from dataclasses import replace

import torch
from checks import GRAD, LOSS, Tolerance, assert_close, make_inputs, reference, upstream

import lfce.distributed as lfce_dist

LAYOUTS = ("tensor", "sequence")
MODES = ("recompute", "eager")
REDUCTIONS = ("mean", "sum", "none")
DTYPES = (torch.float32, torch.bfloat16)
VARIANTS = ("uneven", "one_shard", "ignore_class", "swapped")

# P ranks against one GPU on the whole weight: fp32 reassociation (the LSE's logsumexp over the
# shards, the grad_hidden partials summed) for fp32 and for the loss; for bf16 gradients the
# partials are rounded to bf16 on each rank before they are summed, and a dz at a rounding tie
# can round the other way under a reassociated LSE.
SAME_AS_ONE_GPU = {
    torch.float32: Tolerance(rel_l2=2e-5, rtol=1e-4, atol=1e-5, row=None, row_floor=0.0),
    torch.bfloat16: Tolerance(rel_l2=5e-3, rtol=2.0 ** -6, atol=2.0 ** -6, row=None, row_floor=0.0),
}
SAME_LOSS = Tolerance(rel_l2=1e-5, rtol=1e-5, atol=1e-5, row=None, row_floor=0.0)
# grad_hidden against the fp64 reference: on top of one GPU's roundings (dz, then the result, to
# the dtype), each rank's partial is rounded to the dtype before the sum, so an element can be
# off by up to two more half-steps: twice the elementwise bound of checks.GRAD.
GRAD_HIDDEN = {dtype: replace(tol, rtol=2 * tol.rtol, atol=2 * tol.atol) if dtype != torch.float32 else tol
               for dtype, tol in GRAD.items()}


def case_ids():
    return ["-".join(map(str, (layout, mode, reduction, str(dtype).replace("torch.", ""), variant)))
            for layout, mode, reduction, dtype, variant in cases()]


def cases():
    return list(itertools.product(LAYOUTS, MODES, REDUCTIONS, DTYPES, VARIANTS))


def make_case(variant, n, h, v, dtype, world_size, device):
    """(x, w, b, y, ignore_index) for a variant; identical on every rank (fixed seeds)."""
    ignore_index = -100
    x, w, b, y = make_inputs(n, h, v, dtype, bias=variant != "one_shard", seed=11, device=device)
    if variant == "one_shard":
        first = lfce_dist.vocab_shard(v, 0, world_size)[1]
        y = torch.where(y == ignore_index, y, y % first)
    elif variant == "ignore_class":
        ignore_index = v - 3  # in the last shard
        y = torch.where(y == -100, torch.full_like(y, ignore_index), y)
        y[0] = v - 2  # a neighbour of ignore_index that must count
    return x, w, b, y, ignore_index


def shard_of(variant, v, rank, world_size):
    """(start, size, vocab_start to pass) of rank's rows."""
    if variant == "swapped":
        start, size = lfce_dist.vocab_shard(v, world_size - 1 - rank, world_size)
        return start, size, start
    start, size = lfce_dist.vocab_shard(v, rank, world_size)
    return start, size, None


def run_distributed(x, w, b, y, grad, rank, world_size, layout, mode, reduction, variant, ignore_index, **options):
    """(loss, grad_hidden, grad_weight shard, grad_bias shard) of lfce.distributed on this rank."""
    start, size, vocab_start = shard_of(variant, w.shape[0], rank, world_size)
    sequence = layout == "sequence"
    tokens = slice(None)
    if sequence:
        per_rank = x.shape[0] // world_size
        tokens = slice(rank * per_rank, (rank + 1) * per_rank)
    xr = x[tokens].detach().clone().requires_grad_()
    wr = w[start:start + size].detach().clone().requires_grad_()
    br = None if b is None else b[start:start + size].detach().clone().requires_grad_()
    loss = lfce_dist.linear_cross_entropy(xr, wr, y[tokens], br, vocab_start=vocab_start, sequence_parallel=sequence,
                                          ignore_index=ignore_index, reduction=reduction, mode=mode, **options)
    loss.backward(grad[tokens] if reduction == "none" else grad)
    return loss.detach(), xr.grad, wr.grad, None if br is None else br.grad


def expected_part(full, rank, world_size, layout, variant, reduction):
    """This rank's part of the full-problem (loss, grad_hidden, grad_weight, grad_bias)."""
    loss, gx, gw, gb = full
    v = gw.shape[0]
    start, size, _ = shard_of(variant, v, rank, world_size)
    if layout == "sequence":
        per_rank = gx.shape[0] // world_size
        tokens = slice(rank * per_rank, (rank + 1) * per_rank)
        gx = gx[tokens]
        if reduction == "none":
            loss = loss[tokens]
    rows = slice(start, start + size)
    return loss, gx, gw[rows], None if gb is None else gb[rows]


def check_case(case, rank, world_size, n, h, v, device, record=None, one_gpu=None, **options):
    """Run one case on this rank; check it against the fp64 reference (the usual tolerances) and, where
    ``one_gpu`` (a function (x, w, b, y, reduction, grad, mode, ignore_index) -> results) is given,
    against lfce on one GPU with the whole weight. Returns (loss, None or the failed check's message):
    a failure is not raised here so that every rank goes on to the same collectives."""
    layout, mode, reduction, dtype, variant = case
    x, w, b, y, ignore_index = make_case(variant, n, h, v, dtype, world_size, device)
    grad = upstream(reduction, y.shape, dtype, device=device)
    ours = run_distributed(x, w, b, y, grad, rank, world_size, layout, mode, reduction, variant, ignore_index,
                           **options)
    ref = expected_part(reference(x, w, b, y, reduction, grad, ignore_index=ignore_index), rank, world_size,
                        layout, variant, reduction)
    single = None
    if one_gpu is not None:
        single = expected_part(one_gpu(x, w, b, y, reduction, grad, mode, ignore_index), rank, world_size, layout,
                               variant, reduction)
    names = (f"loss ({reduction})", "grad_hidden", "grad_weight", "grad_bias")
    try:
        assert ours[0].dtype == torch.float32, f"loss dtype {ours[0].dtype}"
        for name, actual, expected, tol in zip(names, ours, ref, (LOSS[dtype], GRAD_HIDDEN[dtype], GRAD[dtype], GRAD[dtype])):
            if expected is not None:
                assert_close(name, actual, expected, tol, record)
        if single is not None:
            tols = (SAME_LOSS,) + (SAME_AS_ONE_GPU[dtype],) * 3
            for name, actual, expected, tol in zip(names, ours, single, tols):
                if expected is not None:
                    assert_close(f"{name} vs one GPU", actual, expected, tol, record)
    except AssertionError as error:
        return ours[0], str(error)
    return ours[0], None
