"""A CPU model of lfce's kernels on one vocabulary shard, for testing lfce.distributed without a GPU.

It follows the kernels' contract (templates/kernels/lse_combine.cpp, dlogits_backward.cpp): the shard's LSE
over its own columns whatever the target; token loss LSE - z_target for a target in [0, V_shard),
0 for the problem's ignore_index, NaN for any other target; dz = g (softmax - onehot) with g = 0 for
ignored tokens, divided by the given valid count for "mean", rounded to the dtype before the two
gradient products (as lfce rounds it). The math is float64.
"""

import torch
import torch.nn.functional as F

from lfce import distributed


def _logits(hidden, weight, bias):
    return F.linear(hidden.double(), weight.double(), None if bias is None else bias.double())


def local_forward(hidden, weight, bias, targets, chunk_size, workspace_budget):
    z = _logits(hidden, weight, bias)
    lse = z.logsumexp(-1)
    in_range = (targets >= 0) & (targets < weight.shape[0])
    picked = z.gather(1, torch.where(in_range, targets, 0).long()[:, None])[:, 0]
    other = torch.where(targets == distributed.LOCAL_IGNORE, torch.zeros_like(lse), torch.full_like(lse, float("nan")))
    return lse.float(), torch.where(in_range, lse - picked, other).float()


def local_backward(hidden, weight, bias, targets, lse, valid_count, grad_loss, reduction, chunk_size,
                   workspace_budget, wanted):
    z = _logits(hidden, weight, bias)
    n, vocab = z.shape
    in_range = (targets >= 0) & (targets < vocab)
    onehot = F.one_hot(torch.where(in_range, targets, 0).long(), vocab).double() * in_range[:, None]
    g = grad_loss.double().expand(n)
    if reduction == "mean":
        g = g / valid_count.double()
    g = torch.where(targets == distributed.LOCAL_IGNORE, torch.zeros_like(g), g)
    dz = ((torch.exp(z - lse.double()[:, None]) - onehot) * g[:, None]).to(hidden.dtype).double()
    grads = (dz @ weight.double(), dz.t() @ hidden.double(), dz.sum(0))
    return tuple(g.to(like.dtype) if want and like is not None else None
                 for g, like, want in zip(grads, (hidden, weight, bias), wanted))


def install():
    """Replace the shard kernels with the model and accept CPU tensors (in this process)."""
    from lfce import functional

    distributed.local_forward = local_forward
    distributed.local_backward = local_backward
    functional._DEVICE_TYPE = "cpu"
