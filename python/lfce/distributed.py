"""Vocabulary-parallel lfce over ``torch.distributed``: the LM head's weight sharded by vocabulary rows.

    import lfce.distributed as lfce_dist
    start, size = lfce_dist.vocab_shard(V, rank, world_size)      # this rank's rows of W
    loss = lfce_dist.linear_cross_entropy(hidden, weight[start:start + size], labels)

Each rank of the process group holds rows [v0, v0 + V_r) of the weight (and the bias); the shards
tile [0, V) in any order (uneven sizes allowed; by default their order is the group's rank order).
Targets are global vocabulary ids. Two layouts of the input:

* tensor parallel (default): every rank holds the same hidden [N, H] and targets [N]; the loss
  (identical on every rank) covers the N tokens; grad_hidden is all-reduced.
* sequence parallel (``sequence_parallel=True``, as Megatron's): rank r holds its own N_r tokens
  (the same N_r on every rank), hidden [N_r, H] and targets [N_r]; hidden and targets are
  all-gathered inside the op (again in the backward: the gathered [N, H] is never held), mean and
  sum cover all P·N_r tokens, "none" gives this rank's N_r losses, grad_hidden is reduce-scattered.

The algorithm, on each rank, on the unmodified single-GPU kernels (docs/parallel.md):

1. forward kernels on the shard with local targets (t - v0 where the target is in the shard,
   NOT_IN_SHARD elsewhere, which matches no column): the shard's log-sum-exp [N] of the mapped
   logits u = softcap(z) / temperature (per element: the same map on every rank) and, for its own
   targets, the target's u (lse - token loss);
2. one all-gather of those two [N] fp32 vectors (three with the entropy: the shard's mean logit;
   two more with accuracy / predicted: the shard's best logit and its global id); every rank takes
   the logsumexp over the P shard LSEs (in rank order: bit-identical on all ranks), the target
   logit from its owner and the argmax from the largest best logit (ties: the lowest id);
   loss_i = LSE_i - z_{i,y_i} (+ s·LSE_i² with a z-loss; 0 where ignored, NaN for a target outside
   [0, V));
3. backward kernels on the shard with the global LSE and the global valid count (so "mean" divides
   by the count over all tokens): the shard's grad_weight / grad_bias, final as they are, and a
   partial grad_hidden, summed over the ranks (all-reduce, or reduce-scatter in sequence parallel).

Options: softcap and temperature map each logit (the shard kernels apply them), the z-loss is
added on the global LSE (and return_z_loss reports it from there), lse / entropy / logprob are
combined in the same all-gather (k rows of [N] fp32), and so are accuracy / predicted: two more
rows, each rank's best (u, global id), the largest u winning, ties to the lowest id (combine,
best_of); the gradient accumulators are the shard's. Label smoothing, class weights (each rank's
shard) and token scaling run the weighted problem: every counted token scored against a column of
the shard, two more rows in the all-gather (Σ_v w_v (LSE_r - u_v) and the target's weight), and per
token gradients that make the shard kernels' dz the global one (_weighted_statistics,
_weighted_gradients). The causal shift pairs each position with the next target before step 1
(scored_targets). docs/parallel.md derives each combine.

Held between forward and backward in recompute mode: the global LSE (4·N bytes; 4·k·N with the
entropy and logprob rows, and the weighted problem's p(target) and target weight rows) and the
count, besides the inputs. Eager mode runs step 3 inside the forward (upstream gradient 1) and holds
the gradients, as on one GPU.

torch.compile (PyTorch 2.4+) traces a model ending in this loss without a graph break, fullgraph=True
included: the argument checks run while tracing, and the handshake, the collectives and the shard
kernels run inside the custom ops ``torch.ops.lfce.vocab_parallel_forward`` / ``_backward`` (see
"the operators" below; the process group travels as its ``group_name``). Outside torch.compile, and
on a PyTorch without custom ops, the same code runs in a ``torch.autograd.Function``; the results
are bitwise the same. Arguments that differ between ranks are still the same error on every rank.
An argument invalid on one rank only raises while that rank traces, before any collective: without
fullgraph Dynamo then runs the call uncompiled (the handshake tells every rank); with fullgraph=True
that rank fails to compile and its peers wait in the handshake until the group's timeout.

Every call first all-gathers each rank's shard size, token count, options, an error flag and (in
tensor parallel) a checksum of the targets, a few int64 per rank, and checks them on the host (the
call's one host sync): an argument that is invalid on one rank, or that differs between ranks, is
the same TypeError / ValueError on every rank, naming the rank and the value, and no rank runs a
collective its peers do not. As for any collective, every rank of the group must make the same
calls in the same order.
"""

from __future__ import annotations

import collections
import dataclasses
import operator
import struct
from typing import Any

import torch
import torch.distributed as dist
from torch import Tensor

from . import _bridge, _check, _cpu, _lib, _ops, functional
from .errors import ArgumentTypeError, InvalidArgumentError, ProcessGroupError
from .options import EXTRA_OUTPUTS, OPTION_NAMES, LossOptions, Mode, Reduction, resolve

__all__ = ["VocabParallelLinearCrossEntropyLoss", "linear_cross_entropy", "vocab_shard"]

# The shard problem's own target codes: never a column of the shard, never equal to each other.
LOCAL_IGNORE = -1   # the user's ignore_index (which may itself be a class id of some shard)
NOT_IN_SHARD = -2   # a target of another rank's shard, or outside [0, V): its loss comes from elsewhere

# Every rank's local view, all-gathered on every call: the fields of _PER_RANK describe the rank's
# shard (class_weight_sum: the sum W_r of its class weights, as float64 bits, 0 without class
# weights), every other one must be the same on every rank (checked).
_PER_RANK = ("vocab_shard", "vocab_start", "class_weight_sum")
_FIELDS = _PER_RANK + (
    "tokens", "hidden", "dtype", "target_dtype", "has_bias", "has_class_weight", "ignore_index", "softcap",
    "temperature", "z_loss_scale", "label_smoothing", "token_scaling", "sequence_length", "reduction", "mode",
    "sequence_parallel", "need_hidden", "need_weight", "need_bias", "outputs")
# The per-element maps of the logits (u = softcap · tanh(z / softcap) / temperature), the z-loss
# scale and the label smoothing: every rank must apply the same, so they travel in the handshake as
# their float64 bits (softcap None as 0.0).
_FLOAT_FIELDS = ("softcap", "temperature", "z_loss_scale", "label_smoothing", "class_weight_sum")
# The outputs asked for, as the handshake's "outputs" bits (in this order): the extra per-token
# outputs (each changes what the forward's all-gather carries), then return_z_loss.
OUTPUT_FLAGS = EXTRA_OUTPUTS + ("return_z_loss",)
_SAME_ON_EVERY_RANK = _FIELDS[len(_PER_RANK):]
_NAMES = {"dtype": {code: str(dtype) for dtype, code in _ops.DTYPES.items()},
          "target_dtype": {code: str(dtype) for dtype, code in _ops.INDEX_DTYPES.items()},
          "reduction": {code: name for name, code in _lib.REDUCTIONS.items()},
          "mode": {code: name for name, code in _lib.MODES.items()}}


def vocab_shard(vocab: int, rank: int, world_size: int) -> tuple[int, int]:
    """(start, size) of ``rank``'s rows of a [vocab, H] weight: a contiguous equal split with the
    remainder on the last ranks (151937 over 2: (0, 75968) and (75968, 75969))."""
    vocab = _check.positive("vocab", vocab)
    world_size = _check.positive("world_size", world_size)
    rank = _check.integer("rank", rank, minimum=0, maximum=world_size - 1)
    base, extra = divmod(vocab, world_size)
    first_long = world_size - extra  # ranks from here on get base + 1 rows
    start = rank * base + max(0, rank - first_long)
    return start, base + (rank >= first_long)


# --- layout: who holds which rows and tokens ------------------------------------------------------

class Layout:
    """This rank's place in the group: vocabulary rows [v0, v0 + shard) of [0, vocab), and in sequence
    parallel its tokens [token_start, token_start + local_tokens) of the gathered batch.
    sequence_length: the last dimension T of the targets with a causal shift (this rank's piece of
    each sequence in sequence parallel), else 0. In the forward also every rank's shard size
    (``sizes``) and, with class weights, the sum of its class weights (``weight_sums``), in group
    rank order; empty in the backward, which does not read them."""

    def __init__(self, group, rank, world_size, nccl, v0, shard, vocab, local_tokens, sequence_parallel,
                 sequence_length=0, sizes=(), weight_sums=()):
        self.group, self.rank, self.world_size, self.nccl = group, rank, world_size, nccl
        self.v0, self.shard, self.vocab = v0, shard, vocab
        self.local_tokens, self.sequence_parallel = local_tokens, sequence_parallel
        self.tokens = local_tokens * (world_size if sequence_parallel else 1)
        self.token_start = rank * local_tokens if sequence_parallel else 0
        self.sequence_length = sequence_length
        self.sizes, self.weight_sums = tuple(sizes), tuple(weight_sums)

    def __repr__(self):
        return (f"Layout(rank={self.rank}/{self.world_size}, rows=[{self.v0}, {self.v0 + self.shard}) of "
                f"{self.vocab}, tokens={self.tokens}, sequence_parallel={self.sequence_parallel})")


def float_bits(value):
    """A float as the int64 of its float64 bits (how a float option travels in the handshake's row)."""
    return struct.unpack("<q", struct.pack("<d", float(value)))[0]


def _from_bits(bits):
    return struct.unpack("<d", struct.pack("<q", int(bits)))[0]


def _describe(field, value):
    if field == "outputs":
        return "+".join(name for i, name in enumerate(OUTPUT_FLAGS) if value >> i & 1) or "none"
    if field in _FLOAT_FIELDS:
        number = _from_bits(value)
        return None if field == "softcap" and number == 0.0 else number
    return _NAMES.get(field, {}).get(value, value)


def check_layout(rows, rank):
    """(v0, vocab) of ``rank`` from every rank's row of _FIELDS (a list of dicts, in group rank order).

    Raises ValueError naming the field, the ranks and their values where the ranks disagree, or the
    rank whose shard leaves a gap or overlaps another. Every rank sees the same rows, so every rank
    raises the same error.
    """
    for field in _SAME_ON_EVERY_RANK:
        values = [row[field] for row in rows]
        if len(set(values)) > 1:
            detail = ", ".join(f"rank {r}: {_describe(field, v)}" for r, v in enumerate(values))
            what = {"tokens": "the token count (hidden.shape[:-1] elements; sequence parallel needs the same "
                              "count on every rank, tensor parallel the same batch)",
                    "need_hidden": "whether hidden requires a gradient", "need_weight":
                    "whether the weight shard requires a gradient", "need_bias": "whether the bias requires a gradient",
                    "has_bias": "whether a bias shard is given", "outputs": "the extra outputs asked for",
                    "has_class_weight": "whether a class_weight shard is given",
                    "sequence_length": "the causal shift (shift=True: the targets' last dimension T; 0: no shift)"
                    }.get(field, field)
            raise InvalidArgumentError(f"lfce.distributed: {what} differs across the ranks of the group ({detail}); "
                                       "every rank must pass the same")
    starts = [row["vocab_start"] for row in rows]
    sizes = [row["vocab_shard"] for row in rows]
    given = [s >= 0 for s in starts]
    if any(given) and not all(given):
        detail = ", ".join(f"rank {r}: {s if s >= 0 else None}" for r, s in enumerate(starts))
        raise InvalidArgumentError("lfce.distributed: vocab_start is given on some ranks and None on others "
                                   f"({detail}); give it on every rank or on none")
    if not all(given):  # the group's rank order
        starts = [sum(sizes[:r]) for r in range(len(sizes))]
    end = 0
    for r in sorted(range(len(rows)), key=lambda r: starts[r]):
        if starts[r] != end:
            problem = "a gap before it" if starts[r] > end else "an overlap with the shard before it"
            raise InvalidArgumentError(f"lfce.distributed: rank {r}'s shard starts at vocab_start={starts[r]} but the "
                                       f"shards before it end at {end} ({problem}); the shards (sizes "
                                       f"{', '.join(f'rank {q}: {s}' for q, s in enumerate(sizes))}) must tile [0, V)")
        end += sizes[r]
    return starts[rank], end


def _resolve_group(group):
    if not (dist.is_available() and dist.is_initialized()):
        raise ProcessGroupError("lfce.distributed needs an initialized default process group "
                                "(torch.distributed.init_process_group, e.g. under torchrun)")
    if group is None:
        group = dist.group.WORLD
    if not isinstance(group, dist.ProcessGroup):
        # new_group() gives the ranks outside the group a placeholder that is not a ProcessGroup
        raise ArgumentTypeError("group must be None or a torch.distributed.ProcessGroup this process (global rank "
                                f"{dist.get_rank()}) is a member of, got {type(group).__name__} {group!r}")
    return group


_MESSAGE_BYTES = 2048  # a failing rank's message, as UTF-8, in the handshake's second all-gather


def _handshake_device(nccl, tensors):
    """Where this rank's handshake runs: for NCCL the device of its first CUDA tensor (the one its
    collectives use whether or not its own arguments are valid), else the current CUDA device; for
    gloo the CPU."""
    if not nccl:
        return torch.device("cpu")
    for tensor in tensors:
        if isinstance(tensor, torch.Tensor) and tensor.device.type == "cuda":
            return tensor.device
    return torch.device("cuda", torch.cuda.current_device())


_VALUE, _TYPE, _OTHER = 1, 2, 3  # what a rank's failure was: an invalid value or type, or anything else


def _messages(group, nccl, device, failure):
    """Every rank's failure as (kind, text), or None for a rank without one: one all-gather of a
    fixed-size uint8 row (its kind, then the message's UTF-8 bytes, cut to fit)."""
    row = torch.zeros(_MESSAGE_BYTES + 1, dtype=torch.uint8)
    if failure is not None:
        row[0] = _TYPE if isinstance(failure, TypeError) else _VALUE if isinstance(failure, ValueError) else _OTHER
        text = f"{str(failure) or type(failure).__name__}".encode()[:_MESSAGE_BYTES]
        if text:
            row[1:1 + len(text)] = torch.frombuffer(bytearray(text), dtype=torch.uint8)
    rows = _all_gather(row.to(device), group, nccl).reshape(-1, _MESSAGE_BYTES + 1).cpu()
    out = []
    for values in rows:
        kind = int(values[0])
        text = bytes(values[1:].tolist()).rstrip(b"\0").decode("utf-8", "replace")
        out.append(None if kind == 0 else (kind, text))
    return out


def _agree(group, row, tensors, targets, failure, class_weight=None):
    """This rank's Layout, once every rank's arguments are known to fit together: a call-level
    handshake that every rank makes, whatever its own arguments, so no rank ever runs a collective
    that its peers do not.

    One all-gather of a fixed-size int64 row per rank (an error flag, the fields of _FIELDS, and in
    tensor parallel a checksum of the targets), read on the host (the call's one host sync), on the
    device of the rank's own tensors (``tensors``). A rank that failed before its collectives
    (``failure``: an invalid argument, or any other exception such as an out-of-memory) sends the
    flag; then every rank learns the messages (a second fixed-size all-gather) and raises: the same
    TypeError / ValueError on every rank for invalid arguments (from the original on the failing
    rank), or, for any other failure, the failing rank its own exception and its peers a
    ProcessGroupError naming it. Otherwise check_layout compares the rows: a difference is the same
    ValueError on every rank.
    """
    rank, world_size = dist.get_rank(group), dist.get_world_size(group)
    nccl = "nccl" in str(dist.get_backend(group))
    device = _handshake_device(nccl, tensors)
    values = [0 if failure is None else 1] + [0 if failure is not None else int(row[field]) for field in _FIELDS]
    local = torch.tensor(values + [0], dtype=torch.int64, device=device)
    if failure is None and not row["sequence_parallel"]:
        local[-1] = targets_checksum(targets.to(device))
    if failure is None and class_weight is not None:  # W_r's float64 bits, without a host sync
        local[1 + _FIELDS.index("class_weight_sum")] = class_weight.to(device, torch.float64).sum().view(torch.int64)
    gathered = _all_gather(local, group, nccl).reshape(world_size, len(values) + 1).tolist()  # the one host sync
    failed = [r for r, values in enumerate(gathered) if values[0]]
    if failed:
        reports = _messages(group, nccl, device, failure)
        kind, text = reports[failed[0]]
        others = "" if len(failed) == 1 else f" (and on rank{'s' if len(failed) > 2 else ''} " \
            f"{', '.join(map(str, failed[1:]))})"
        if failure is not None and not isinstance(failure, (TypeError, ValueError)):
            raise failure  # this rank's own failure (an out-of-memory, say), whole; its peers name it
        if kind == _OTHER:
            error = ProcessGroupError(f"lfce.distributed: rank {failed[0]} failed before its collectives{others}, so "
                                      f"every rank of the group stops: {text}")
        else:
            cls = ArgumentTypeError if kind == _TYPE else InvalidArgumentError
            error = cls(f"lfce.distributed: rank {failed[0]}'s arguments are invalid{others}, so every rank of the "
                        f"group stops: {text}")
        if failure is not None:
            raise error from failure
        raise error
    rows = [dict(zip(_FIELDS, values[1:-1])) for values in gathered]
    v0, vocab = check_layout(rows, rank)
    checksums = [values[-1] for values in gathered]
    if not row["sequence_parallel"] and len(set(checksums)) > 1:
        differ = [r for r in range(world_size) if checksums[r] != checksums[0]]
        raise InvalidArgumentError("lfce.distributed: the targets differ across the ranks of the group (rank "
                                   f"{', '.join(map(str, differ))} against rank 0); tensor parallel needs the same "
                                   "hidden states and targets on every rank: pass the whole batch's targets on every "
                                   "rank, or sequence_parallel=True where each rank holds its own tokens")
    weight_sums = [_from_bits(r["class_weight_sum"]) for r in rows] if row["has_class_weight"] else []
    return Layout(group, rank, world_size, nccl, v0, row["vocab_shard"], vocab, row["tokens"],
                  bool(row["sequence_parallel"]), row["sequence_length"], [r["vocab_shard"] for r in rows],
                  weight_sums)


def targets_checksum(targets):
    """A position-weighted checksum of the targets (a 0-d int64 tensor on their device, no host sync):
    equal for equal targets; a change of one target, or a swap of two unequal targets less than
    65521 positions apart, always changes it (each term is below 2**49, the sum wraps modulo 2**64)."""
    low = targets.reshape(-1).to(torch.int64) & 0xFFFFFFFF
    weight = torch.arange(low.numel(), dtype=torch.int64, device=low.device) % 65521 + 1
    return ((low + 0x5BD1E995) * weight).sum()


# --- collectives ----------------------------------------------------------------------------------

def _all_gather(tensor, group, nccl):
    """[P * tensor.shape[0], ...]: the ranks' tensors concatenated in group rank order."""
    world_size = dist.get_world_size(group)
    if world_size == 1:
        return tensor
    tensor = tensor.contiguous()
    if nccl:
        out = tensor.new_empty((world_size * tensor.shape[0],) + tuple(tensor.shape[1:]))
        dist.all_gather_into_tensor(out, tensor, group=group)
        return out
    # gloo (CPU tests): no all_gather_into_tensor, and no bf16: 16-bit floats travel as their bytes.
    bits = tensor.view(torch.uint8) if tensor.dtype in (torch.bfloat16, torch.float16) else tensor
    parts = [torch.empty_like(bits) for _ in range(world_size)]
    dist.all_gather(parts, bits, group=group)
    return torch.cat(parts).view(tensor.dtype)


def _sum_hidden_grad(grad, layout):
    """The ranks' partial grad_hidden [N, H] summed: all of it (tensor parallel) or this rank's tokens."""
    if layout.world_size == 1:
        return grad
    if layout.nccl:
        if not layout.sequence_parallel:
            dist.all_reduce(grad, group=layout.group)
            return grad
        out = grad.new_empty((layout.local_tokens,) + tuple(grad.shape[1:]))
        dist.reduce_scatter_tensor(out, grad, group=layout.group)
        return out
    # gloo (CPU tests): no reduce_scatter and no 16-bit sums; fp32, then rounded once, as NCCL
    # rounds the sum of two 16-bit partials.
    total = grad.float()
    dist.all_reduce(total, group=layout.group)
    if layout.sequence_parallel:
        total = total.narrow(0, layout.token_start, layout.local_tokens)
    return total.to(grad.dtype)


def _gather_tokens(tensor, layout):
    return _all_gather(tensor, layout.group, layout.nccl) if layout.sequence_parallel else tensor


def scored_targets(targets, layout, ignore_index):
    """The gathered batch's targets as each position is scored against them: the targets themselves,
    or with a causal shift (layout.sequence_length = T > 0) each position's next target in its
    sequence and ignore_index for a sequence's last position, as on one GPU. Tensor parallel: targets
    [..., T], sequences of T consecutive tokens. Sequence parallel: every rank's targets [..., T] with
    the same leading dimensions, rank r holding positions [r·T, (r + 1)·T) of each sequence of P·T
    (the sequence dimension split over the ranks in rank order): the target after a rank's last
    position is the first of rank r + 1's, and the last rank's last position has none."""
    gathered = _gather_tokens(targets, layout)
    length = layout.sequence_length
    if not length:
        return gathered
    ranks = layout.world_size if layout.sequence_parallel else 1
    sequences = gathered.reshape(ranks, -1, length).transpose(0, 1).reshape(-1, ranks * length)
    shifted = torch.cat([sequences[:, 1:], torch.full_like(sequences[:, :1], ignore_index)], dim=1)
    return shifted.reshape(-1, ranks, length).transpose(0, 1).reshape(-1)


# --- the math around the kernels (pure PyTorch) ----------------------------------------------------

def local_targets(targets, v0, shard, ignore_index):
    """The shard problem's targets: t - v0 for t in [v0, v0 + shard), LOCAL_IGNORE for ignore_index,
    NOT_IN_SHARD for every other value (another shard's class, or a bad target); same dtype."""
    in_shard = (targets >= v0) & (targets < v0 + shard) & (targets != ignore_index)
    codes = torch.where(targets == ignore_index, torch.full_like(targets, LOCAL_IGNORE),
                        torch.full_like(targets, NOT_IN_SHARD))
    return torch.where(in_shard, targets - v0, codes)


def probe_targets(local):
    """The weighted problem's forward targets (_weighted_statistics): ``local`` with every NOT_IN_SHARD
    replaced by column 0 (a probe), so that every counted token is scored against a column of the
    shard and the shard's smoothing sum is finite for it (label smoothing 1 there: the probe's own
    term has weight 1 - 1 = 0; its logprob row is not read)."""
    return torch.where(local == NOT_IN_SHARD, torch.zeros_like(local), local)


Combined = collections.namedtuple("Combined", "lse target_logit mean_logit predicted target_weight smoothing")


def combine(shard_lse, target_logit, group=None, nccl=False, shard_mean_logit=None, shard_best=None,
            target_weight=None, smoothing=None):
    """The global per-token statistics (a Combined, None in each field not asked for) from each rank's:
    shard LSE_r; its target logits (0 where the target is not in its shard); for the entropy its
    shard's mean logit S_r = Σ_{v in r} exp(u_v - LSE_r) u_v; for accuracy / predicted its best
    candidate ``shard_best`` = (u [N] fp32, global id [N] int64: shard_argmax); with class weights
    the target's weight ``target_weight`` (0 where the target is not in its shard); with label
    smoothing ``smoothing`` = (R_r [N], the ranks' W_r in rank order), R_r = Σ_{v in r} w_v
    (LSE_r - u_v) and W_r = Σ_{v in r} w_v (w = 1 without class weights: W_r = V_r).

    One all-gather of [k, N] fp32 (k = 2, +1 for each of the entropy, the target weight and the
    smoothing, +2 with the argmax: the u row and the id row, an int32 carried as the bits of an fp32
    element, which the all-gather copies untouched), then in rank order on every rank (the same bits
    everywhere): LSE = logsumexp_r LSE_r, z_y = Σ_r z_r, S = Σ_r exp(LSE_r - LSE) S_r (the mean logit
    under the whole softmax), the argmax (best_of), w_y = Σ_r w_r, and Σ_v w_v (LSE - u_v) =
    Σ_r R_r + W_r (LSE - LSE_r), a sum of terms >= 0 for weights >= 0."""
    rows = [shard_lse, target_logit]
    for row in (shard_mean_logit, target_weight, None if smoothing is None else smoothing[0]):
        if row is not None:
            rows.append(row)
    if shard_best is not None:
        value, ids = shard_best
        rows += [value.to(torch.float32), ids.to(torch.int32).view(torch.float32)]
    parts = torch.stack(rows)
    if group is not None:
        parts = _all_gather(parts, group, nccl)
    parts = parts.reshape(-1, len(rows), shard_lse.shape[0])
    lse = torch.logsumexp(parts[:, 0], dim=0)
    row = iter(range(2, len(rows)))
    mean_logit = predicted = weight = smoothed = None
    if shard_mean_logit is not None:
        mean_logit = (torch.exp(parts[:, 0] - lse) * parts[:, next(row)]).sum(dim=0)
    if target_weight is not None:
        weight = parts[:, next(row)].sum(dim=0)
    if smoothing is not None:
        sums = torch.tensor(smoothing[1], dtype=parts.dtype).to(parts.device)[:, None]
        smoothed = (parts[:, next(row)] + sums * (lse - parts[:, 0])).sum(dim=0)
    if shard_best is not None:
        predicted = best_of(parts[:, -2], parts[:, -1].contiguous().view(torch.int32).to(torch.int64))
    return Combined(lse, parts[:, 1].sum(dim=0), mean_logit, predicted, weight, smoothed)


def best_of(values, ids):
    """[N] int64: for each token (column of the [P, N] candidates, one per rank), the id whose value
    is the largest, the lowest id among equal values (torch.argmax's first occurrence over the whole
    row: the shards' order in the group does not matter; -0.0 equals 0.0), a NaN counting as the
    largest (as torch.argmax)."""
    top = values.max(dim=0).values  # NaN where a candidate is NaN
    hit = (values == top) | (values.isnan() & top.isnan())
    return torch.where(hit, ids, torch.full_like(ids, torch.iinfo(torch.int64).max)).min(dim=0).values


# The candidates' logits are recomputed in token chunks of at most this many hidden elements (fp32:
# two [chunk, H] tensors, 64 MiB each).
_RECOMPUTE_ELEMENTS = 1 << 24


def shard_argmax(hidden, weight, bias, local_predicted, v0, options):
    """(u [N] fp32, global id [N] int64): this shard's best column for each token, as its forward
    kernels chose it (``local_predicted``: the shard problem's argmax, an index into the shard's rows,
    the lowest among equal maxima; -1 for the shard problem's ignored tokens), its id v0 + column and
    its logit u recomputed in fp32 (mapped_logits), on every rank by the same code, so that the ranks
    compare like with like. A token without a column (ignored) gets (-inf, v0): it never wins and
    its prediction is masked later."""
    n, h = hidden.shape
    found = local_predicted >= 0
    column = local_predicted.clamp(min=0).to(torch.int64)
    z = torch.empty(n, dtype=torch.float32, device=hidden.device)
    step = max(1, _RECOMPUTE_ELEMENTS // h)
    for t0 in range(0, n, step):
        t1 = min(n, t0 + step)
        rows = column[t0:t1]
        z[t0:t1] = torch.einsum("nh,nh->n", hidden[t0:t1].to(torch.float32), weight[rows].to(torch.float32))
        if bias is not None:
            z[t0:t1] += bias[rows].to(torch.float32)
    u = mapped_logits(z, options.softcap, options.temperature, hidden.device.type == "cpu")
    return torch.where(found, u, torch.full_like(u, float("-inf"))), column + v0


def mapped_logits(z, softcap, temperature, cpu):
    """u = softcap·tanh(z / softcap) / T of fp32 logits z, computed as the shard's forward computes
    it: on CPU tensors as lfce's CPU operators (_cpu.py: z / T, or tanh(z / c) · (c / T)); on CUDA
    as the kernels' formula (templates/template_util.h: z · (1 / T); with a softcap
    t = sign(x)·(1 - 2 / (e^{2|x|} + 1)), x = z · (1 / c), times c / T), with fp32 constants."""
    if cpu:
        if softcap is None:
            return z / temperature
        return torch.tanh(z / softcap) * (softcap / temperature)

    def f32(value):
        return torch.tensor(value, dtype=torch.float32, device=z.device)

    inverse_t = f32(1.0) / f32(temperature)
    if softcap is None:
        return z if temperature == 1.0 else z * inverse_t
    x = z * (f32(1.0) / f32(softcap))
    s = 2.0 / (torch.exp(x.abs() * 2.0) + 1.0)
    t = torch.copysign(1.0 - s, x)
    return t * (f32(softcap) if temperature == 1.0 else f32(softcap) * inverse_t)


LossTerms = collections.namedtuple("LossTerms", "cross_entropy z_loss scale count")


def loss_terms(lse, target_logit, targets, vocab, ignore_index, z_loss_scale=0.0, label_smoothing=0.0,
               target_weight=None, smoothing=None, weight_total=0.0, token_scaling=False):
    """Each token's terms of the loss (a LossTerms), as one GPU's (docs/options.md):

    cross_entropy = (1 - eps)·w_y·(LSE - z_y) + eps·Σ_v w_v (LSE - u_v) / V (``smoothing``: that sum,
    combine's; w = 1 without class weights, ``target_weight`` w_y otherwise), z_loss = s·LSE², both 0
    where ignored and the cross-entropy NaN for a target outside [0, vocab); with token scaling both
    times scale = p(target) = exp(z_y - LSE) (0 where ignored; None without). count: [the counted
    tokens], with class weights [count, Σ w_y over them, W = ``weight_total`` (0 without smoothing)]."""
    valid = targets != ignore_index
    bad = valid & ((targets < 0) | (targets >= vocab))
    zero = torch.zeros_like(lse)
    cross_entropy = lse - target_logit
    if target_weight is not None:
        cross_entropy = target_weight * cross_entropy
    if label_smoothing:
        cross_entropy = (1 - label_smoothing) * cross_entropy + label_smoothing * smoothing / vocab
    cross_entropy = torch.where(valid, cross_entropy, zero)
    cross_entropy = torch.where(bad, torch.full_like(lse, float("nan")), cross_entropy)
    z_loss = torch.where(valid, z_loss_scale * lse * lse, zero) if z_loss_scale else zero
    scale = None
    if token_scaling:  # p(target), no gradient through it (as on one GPU)
        scale = torch.where(valid, torch.exp(target_logit - lse), zero)
        cross_entropy, z_loss = cross_entropy * scale, z_loss * scale
    count = valid.sum(dtype=torch.float32).reshape(1)
    if target_weight is not None:
        count = torch.stack([count[0], torch.where(valid, target_weight, zero).sum(),
                             torch.tensor(float(weight_total), dtype=torch.float32).to(lse.device)])
    return LossTerms(cross_entropy, z_loss, scale, count)


def reduced(terms, reduction):
    """The loss of LossTerms: per token, summed, or the mean as on one GPU (the cross-entropy over
    the count, Σ w_y with class weights; the z-loss over the count)."""
    if reduction == "none":
        return terms.cross_entropy + terms.z_loss
    if reduction == "sum":
        return (terms.cross_entropy + terms.z_loss).sum()
    weights = terms.count[1] if terms.count.numel() == 3 else terms.count[0]
    return terms.cross_entropy.sum() / weights + terms.z_loss.sum() / terms.count[0]


# The extra outputs that are rows of lfce's lse (options.EXTRA_OUTPUTS' first three): differentiable,
# combined in the forward's all-gather (combine). Accuracy and predicted (the argmax across the
# shards: shard_argmax, best_of) ride in the same all-gather; the z-loss comes from the global LSE.
ROW_OUTPUTS = EXTRA_OUTPUTS[:3]
ARGMAX_OUTPUTS = ("return_accuracy", "return_predicted")


def detached_outputs(options, lse, predicted, targets, count, ignore_index, reduction, scale=None):
    """(predicted, accuracy, z_loss), each None unless asked for, over all N tokens, as one GPU's
    (functional._extra_outputs, functional._z_loss): predicted the global argmax id, -1 for an
    ignored token (int64); accuracy 1.0 where it equals the target, 0.0 elsewhere and for ignored
    tokens, per token for "none", else its sum over the global count (mean and sum alike); z_loss
    s·LSE² of the counted tokens (0 for ignored ones; times p(target), ``scale``, with token
    scaling), reduced as the loss (mean: over the count). No gradient."""
    valid = targets != ignore_index
    accuracy = z_loss = None
    if predicted is not None:
        predicted = torch.where(valid, predicted, torch.full_like(predicted, -1))
    if options.return_accuracy:
        correct = ((predicted == targets) & valid).to(torch.float32)
        accuracy = correct if reduction == "none" else correct.sum() / count[0]
    if options.return_z_loss:
        term = torch.where(valid, options.z_loss_scale * lse * lse, torch.zeros_like(lse))
        if scale is not None:
            term = term * scale
        z_loss = term if reduction == "none" else term.sum() / count[0] if reduction == "mean" else term.sum()
    return predicted if options.return_predicted else None, accuracy, z_loss


def shard_row_gradients(options, grad_rows, local, targets, vocab):
    """The gradients of lse's rows ([k·N] flat, or None) as this rank's shard backward takes them.

    The logprob's gradient g is -g·p_v on every column and -g more at the target (dz += g·(onehot - p)).
    The kernels apply it only where the target is a column of their problem (lfce's dz_math: counted
    and in range), so for a counted token whose target is on another rank's shard it moves into the
    lse row's gradient (+g_L·p_v there: g_L - g gives the -g·p_v) and leaves the logprob row (0).
    A target outside [0, vocab) keeps no gradient, as on one GPU."""
    if grad_rows is None or not options.return_logprob:
        return grad_rows
    n = local.shape[0]
    rows = grad_rows.reshape(-1, n).clone()
    elsewhere = (local == NOT_IN_SHARD) & (targets >= 0) & (targets < vocab)
    rows[0] = torch.where(elsewhere, rows[0] - rows[-1], rows[0])
    rows[-1] = torch.where(local == NOT_IN_SHARD, torch.zeros_like(rows[-1]), rows[-1])
    return rows.reshape(-1)


def output_rows(options, lse, target_logit, mean_logit, targets, vocab, ignore_index):
    """The global rows of lfce's lse for ``options`` as a [k, N] tensor: LSE, then the entropy
    H = LSE - S (with return_entropy), then the logprob z_y - LSE (with return_logprob: 0 where
    ignored, NaN for a target outside [0, vocab), as on one GPU)."""
    rows = [lse]
    if options.return_entropy:
        rows.append(lse - mean_logit)
    if options.return_logprob:
        valid = targets != ignore_index
        bad = valid & ((targets < 0) | (targets >= vocab))
        logprob = torch.where(valid, target_logit - lse, torch.zeros_like(lse))
        rows.append(torch.where(bad, torch.full_like(lse, float("nan")), logprob))
    return torch.stack(rows)


def _row_count(options):
    """k: the rows of lse the caller asked for (LSE always, the entropy, the logprob)."""
    return 1 + options.return_entropy + options.return_logprob


def _weighted(options, class_weight):
    """Whether the call weights its tokens' terms (label smoothing, class weights, token scaling):
    the shard kernels then run the weighted problem (_weighted_statistics, _weighted_gradients)."""
    return bool(options.label_smoothing) or options.token_scaling or class_weight is not None


# --- the kernels on this rank's shard (replaced by a CPU model in the CPU tests) -------------------

def shard_options(options, reduction, forward=False):
    """The shard problem's LossOptions: the caller's, with the shard's own ignore code, ``reduction``
    and the recompute schedule (eager mode calls the backward itself). The backward's keep the rows
    of lse the caller asked for (entropy, logprob: their layout and gradients); the forward's ask
    for the shard entropy alone (its S_r), the logprob coming from the combined LSE, the shard's
    argmax for accuracy / predicted (OUTPUT_PREDICTED), and no z-loss. The backward's z-loss term
    2·s·LSE·p_v / count reads the global LSE and count it is given. The detached outputs are the
    Python layer's, never the shard problem's (return_z_loss; the backward needs no argmax). Never a
    shift: the targets it is given are already each position's (scored_targets)."""
    shard = dataclasses.replace(options, ignore_index=LOCAL_IGNORE, reduction=reduction, mode="recompute",
                                return_z_loss=False, shift=False)
    if forward:  # the z-loss is added on the global LSE: the shard's token loss stays LSE_r - u_y
        shard = dataclasses.replace(shard, return_lse=False, return_logprob=False, z_loss_scale=0.0)
    else:
        shard = dataclasses.replace(shard, return_accuracy=False, return_predicted=False)
    return shard


def local_forward(hidden, weight, bias, targets, options, class_weight=None):
    """(shard LSE [N] and the other rows of lse, token loss [N], argmax [N]) from lfce's forward on
    the shard (``options``: shard_options): the LSE of the mapped logits u = softcap(z) / T over the
    shard's columns, the token loss (LSE - u_target where the target is in the shard, 0 for
    LOCAL_IGNORE, NaN for NOT_IN_SHARD, without smoothing), and with OUTPUT_PREDICTED each token's
    argmax of u as an index into the shard's rows (the lowest among equal maxima; -1 for
    LOCAL_IGNORE), else an empty tensor. CUDA tensors run lfce's kernels, CPU tensors lfce's CPU
    implementation (_cpu.py)."""
    if hidden.device.type == "cpu":
        out = _cpu.forward(*_ops.forward_inputs(hidden, weight, bias, targets, options, class_weight=class_weight))
        return out[1], out[0], out[6]
    out = _bridge.forward(hidden, weight, bias, targets, options, class_weight=class_weight)
    return out.lse, out.loss, out.predicted


def local_backward(hidden, weight, bias, targets, options, lse, valid_count, grad_loss, wanted, grad_lse=None,
                   accumulators=(None, None), class_weight=None):
    """The shard's (grad_hidden partial, grad_weight, grad_bias), None where not wanted, from lfce's
    backward on the shard with the global rows of lse (LSE, entropy, logprob), their gradients
    ``grad_lse`` (or None) and the global count; a gradient with an accumulator (fp32, the shard's
    shape) is added into it and given as None."""
    if hidden.device.type == "cpu":
        inputs = _ops.forward_inputs(hidden, weight, bias, targets, options, wanted=wanted, class_weight=class_weight,
                                     weight_grad_accumulator=accumulators[0], bias_grad_accumulator=accumulators[1])
        grads = _cpu.backward(*_ops._backward_inputs(inputs, lse=lse, valid_count=valid_count, grad_loss=grad_loss,
                                                     grad_lse=grad_lse))
        return tuple(g if want and g.numel() else None for g, want in zip(grads, wanted))
    return _bridge.backward(hidden, weight, bias, targets, options, lse=lse, valid_count=valid_count,
                            grad_loss=grad_loss, wanted=wanted, grad_lse=grad_lse, class_weight=class_weight,
                            weight_grad_accumulator=accumulators[0], bias_grad_accumulator=accumulators[1])


# --- the weighted problem: label smoothing, class weights, token scaling ----------------------------
#
# The shard kernels know their own columns only: their smoothing divides by V_r and sums W_r, their
# target weight is read at a column of the shard, their token scale would be the shard's p. The
# weighted problem therefore takes the terms apart (docs/parallel.md, "The weighted problem"): the
# forward runs every counted token against a column of the shard (probe_targets) with label
# smoothing 1 (its token loss is then R_r / V_r) and the logprob row (u_t - LSE_r at the token's
# column); the backward gives the shard kernels, per token, an upstream gradient g' and gradients q
# and r of the lse and logprob rows such that their dz = (P' p_v - T' [v = t] - U' w_v) du/dz is
# the global problem's on the shard's columns.

def _weighted_statistics(layout, options, hidden, weight, bias, local, class_weight):
    """(shard LSE, target logit, shard mean logit or None, shard argmax or None, target weight or
    None, (R_r, W_r of every rank) or None) of the weighted problem on this shard, for combine."""
    n, eps = local.shape[0], options.label_smoothing
    smoothing_weights = class_weight if eps else None
    shard = dataclasses.replace(shard_options(options, "none", True), label_smoothing=1.0 if eps else 0.0,
                                token_scaling=False, return_logprob=True)
    rows, loss, predicted = local_forward(hidden, weight, bias, probe_targets(local), shard, smoothing_weights)
    shard_lse, zero = rows[:n], torch.zeros(n, dtype=torch.float32, device=rows.device)
    own = torch.where(local >= 0, rows[-n:] + shard_lse, zero)  # u_y = logprob + LSE_r at the target
    mean = shard_lse - rows[n:2 * n] if options.return_entropy else None
    best = shard_argmax(hidden, weight, bias, predicted, layout.v0, options) \
        if any(getattr(options, name) for name in ARGMAX_OUTPUTS) else None
    target_weight = None
    if class_weight is not None:
        target_weight = torch.where(local >= 0, class_weight[local.clamp(min=0).long()].to(torch.float32), zero)
    smoothing = None
    if eps:  # label smoothing 1: the token loss is R_r / V_r (0 where ignored)
        smoothing = (loss * layout.shard, layout.weight_sums if class_weight is not None else layout.sizes)
    return shard_lse, own, mean, best, target_weight, smoothing


def _weighted_gradients(layout, options, wanted, hidden, weight, bias, targets, class_weight, held, count, grad_loss,
                        grad_rows, accumulators):
    """The shard's (grad_hidden partial, grad_weight, grad_bias) of the weighted problem. held: the
    forward's rows [LSE, entropy?, logprob?, scale?, w_y?] (flat), count: [count] or [count, Σ w_y,
    W]; grad_rows: the caller's gradients of the first k rows, or None.

    Global dz on a column v of the shard (one GPU's, _cpu._gradients): (P p_v - T [v = y] - U w_v) du/dz,
    P = A ((1 - eps) w_y + eps W / V) + B 2 s LSE + λ - ρ, T = A (1 - eps) w_y - ρ (y in the shard),
    U = A eps / V, with A, B the upstream gradient of the cross-entropy and z-loss terms (times
    p(target) with token scaling, over Σ w_y and the count for "mean"), λ, ρ the gradients of the
    LSE and logprob rows. The shard kernels, run per token (reduction "none") with gradient g',
    label smoothing eps, the shard's class weights, no z-loss and the rows' gradients q (LSE), r
    (logprob), against the token's local target t, form (P' p_v - T' [v = t] - U' w_v) du/dz with
    P' = g' ((1 - eps) w_t + eps W_r / V_r) + q - r, T' = g' (1 - eps) w_t - r, U' = g' eps / V_r
    where t is a column of the shard; for a target elsewhere (NOT_IN_SHARD, outside their columns)
    they apply no T' and no r, and read w_t at column 0. g' = A V_r / V gives U' = U; in the shard
    r = g' (1 - eps) w_t - T gives T' = T, elsewhere r = 0; q = P - g' eps W_r / V_r - (T in the
    shard, g' (1 - eps) w_t elsewhere) gives P' = P. (No probe column here: a one-hot cancelled
    by r would leave its rounding residue, up to an ulp of g' per token, on column 0, against a
    true gradient there of order g' / V.)"""
    n, eps, vocab = targets.shape[0], options.label_smoothing, layout.vocab
    k = _row_count(options)
    rows = held.reshape(-1, n)
    lse, extra = rows[0], iter(rows[k:])
    scale = next(extra) if options.token_scaling else None
    target_weight = next(extra) if class_weight is not None else None
    valid = targets != options.ignore_index
    local = local_targets(targets, layout.v0, layout.shard, options.ignore_index)
    zero = torch.zeros_like(lse)
    a = torch.where(valid, grad_loss.to(torch.float32).reshape(-1).expand(n), zero)
    if scale is not None:
        a = a * scale
    b = a
    if options.reduction == "mean":
        a, b = a / count[1 if target_weight is not None else 0], b / count[0]
    w_y = 1.0 if target_weight is None else target_weight
    upstream = None if grad_rows is None else grad_rows.to(torch.float32).reshape(k, n)
    lse_grad = zero if upstream is None else upstream[0]
    logprob_grad = torch.where(valid, upstream[-1], zero) if upstream is not None and options.return_logprob \
        else zero
    uniform = eps * (count[2] / vocab if target_weight is not None else 1.0)
    big_p = a * ((1 - eps) * w_y + uniform) + b * (2 * options.z_loss_scale) * lse + lse_grad - logprob_grad
    one_hot = torch.where(local >= 0, a * (1 - eps) * w_y - logprob_grad, zero)
    g = a * (layout.shard / vocab) if eps else a
    smoothing_weights = class_weight if eps else None
    in_shard = local >= 0
    if smoothing_weights is not None:
        own_sum = smoothing_weights.to(torch.float32).sum()
        shard_uniform = eps * own_sum / layout.shard
        # The weight the kernels read for the token: its target's, or column 0's for a target
        # outside the shard (NOT_IN_SHARD, out of their range).
        w_t = smoothing_weights[torch.where(in_shard, local, torch.zeros_like(local)).long()].to(torch.float32)
        shard_count = torch.stack([count[0], count[1], own_sum])
    else:
        shard_uniform, w_t, shard_count = eps, 1.0, count[:1]
    shard_one_hot = g * (1 - eps) * w_t  # the kernels' T' before r, in P' for every counted token
    r = torch.where(in_shard, shard_one_hot - one_hot, zero)
    q = big_p - g * shard_uniform - torch.where(in_shard, one_hot, shard_one_hot)
    entropy = [rows[1]] if options.return_entropy else []
    entropy_grad = [upstream[1] if upstream is not None else zero] if options.return_entropy else []
    shard_rows = torch.cat([lse[None]] + [e[None] for e in entropy] + [zero[None]]).reshape(-1)
    shard_grads = torch.cat([q[None]] + [e[None] for e in entropy_grad] + [r[None]]).reshape(-1)
    shard = dataclasses.replace(shard_options(options, "none"), label_smoothing=eps, token_scaling=False,
                                z_loss_scale=0.0, return_logprob=True)
    return local_backward(hidden, weight, bias, local, shard, shard_rows, shard_count, g, wanted, shard_grads,
                          accumulators, smoothing_weights)


# --- autograd -------------------------------------------------------------------------------------

def _shard_gradients(layout, options, wanted, hidden, weight, bias, targets, lse, count, grad_loss, grad_rows=None,
                     accumulators=(None, None), class_weight=None):
    """Run the shard's backward on the gathered tokens (``targets``: scored_targets'); grad_hidden
    summed over the ranks. ``lse``: the forward's rows [k·N] (LSE, entropy, logprob as asked for;
    the weighted problem's scale and target weight after them); ``grad_rows``: the gradients of the
    first k, or None."""
    if _weighted(options, class_weight):
        grads = _weighted_gradients(layout, options, wanted, hidden, weight, bias, targets, class_weight, lse, count,
                                    grad_loss, grad_rows, accumulators)
    else:
        local = local_targets(targets, layout.v0, layout.shard, options.ignore_index)
        grad_rows = shard_row_gradients(options, grad_rows, local, targets, layout.vocab)
        grads = local_backward(hidden, weight, bias, local, shard_options(options, options.reduction), lse, count,
                               grad_loss, wanted, grad_rows, accumulators)
    if grads[0] is not None:
        grads = (_sum_hidden_grad(grads[0], layout),) + tuple(grads[1:])
    return grads


def _forward_math(layout, options, eager, wanted, hidden, weight, bias, targets, class_weight=None):
    """The forward on this rank (its collectives included), after the handshake: (loss, rows_out,
    predicted, accuracy, z_loss, lse, count, held). rows_out: this rank's tokens of the global rows
    [k, N_r]; predicted / accuracy / z_loss: this rank's part, an empty fp32 tensor where not asked
    for; lse [k·N] (the weighted problem's scale and target weight rows after the k), count [1] or
    [3]: what a recompute backward reads; held: eager mode's gradients for an upstream gradient of 1
    (None where not wanted), else None."""
    ignore_index, reduction = options.ignore_index, options.reduction
    all_hidden = _gather_tokens(hidden, layout)
    all_targets = scored_targets(targets, layout, ignore_index)
    local = local_targets(all_targets, layout.v0, layout.shard, ignore_index)
    n = local.shape[0]
    if _weighted(options, class_weight):
        shard_lse, own, shard_mean, best, target_weight, smoothing = _weighted_statistics(
            layout, options, all_hidden, weight, bias, local, class_weight)
    else:
        shard_rows, shard_loss, shard_predicted = local_forward(all_hidden, weight, bias, local,
                                                                shard_options(options, "none", True))
        shard_lse = shard_rows[:n]
        own = torch.where(local >= 0, shard_lse - shard_loss, torch.zeros_like(shard_lse))
        # The shard's mean logit S_r = LSE_r - H_r (its entropy row).
        shard_mean = shard_lse - shard_rows[n:2 * n] if options.return_entropy else None
        # The shard's best candidate for the argmax: (u, global id) of its own argmax column.
        best = shard_argmax(all_hidden, weight, bias, shard_predicted, layout.v0, options) \
            if any(getattr(options, name) for name in ARGMAX_OUTPUTS) else None
        target_weight = smoothing = None
        del shard_loss, shard_rows, shard_predicted
    del local
    combined = combine(shard_lse, own, layout.group, layout.nccl, shard_mean, best, target_weight, smoothing)
    eps = options.label_smoothing
    terms = loss_terms(combined.lse, combined.target_logit, all_targets, layout.vocab, ignore_index,
                       options.z_loss_scale, eps, combined.target_weight, combined.smoothing,
                       sum(layout.weight_sums) if eps and class_weight is not None else 0.0, options.token_scaling)
    count = terms.count
    detached = detached_outputs(options, combined.lse, combined.predicted, all_targets, count, ignore_index, reduction,
                                terms.scale)
    rows = output_rows(options, combined.lse, combined.target_logit, combined.mean_logit, all_targets, layout.vocab,
                       ignore_index)
    # What the backward reads: the global rows, then the weighted problem's per-token factors.
    extra = [row[None] for row in (terms.scale, combined.target_weight) if row is not None]
    lse = (torch.cat([rows] + extra) if extra else rows).reshape(-1)
    token_loss = reduced(terms, "none")
    if reduction == "none":
        loss = token_loss.narrow(0, layout.token_start, layout.local_tokens).clone() if layout.sequence_parallel \
            else token_loss
    else:
        loss = reduced(terms, reduction)
    rows_out = rows.narrow(1, layout.token_start, layout.local_tokens).clone() if layout.sequence_parallel \
        else rows
    # predicted, accuracy, z_loss: this rank's tokens of the per-token ones (predicted always,
    # the other two for "none"); an empty tensor for one not asked for. No gradient.
    per_token = (True, reduction == "none", reduction == "none")
    detached = tuple(lse.new_empty(0) if value is None
                     else value.narrow(0, layout.token_start, layout.local_tokens).clone()
                     if layout.sequence_parallel and tokens else value
                     for value, tokens in zip(detached, per_token))
    held = None
    if eager:  # the gradients for an upstream gradient of 1, held until the backward scales them
        ones = torch.ones(1, dtype=torch.float32, device=hidden.device)
        held = _shard_gradients(layout, options, wanted, all_hidden, weight, bias, all_targets, lse, count, ones,
                                accumulators=(None, None), class_weight=class_weight)
    return (loss, rows_out) + detached + (lse, count, held)


def _scale_held(held, wanted, grad_loss, ctx=None):
    """Eager mode's backward: each held gradient times grad_loss in fp32, rounded once to its dtype
    (as on one GPU); in place through lfce_scale_gradient, once per forward, given the
    autograd.Function's ``ctx``; out of place (_bridge.scaled_reference, traceable) without."""
    if grad_loss is None:
        return (None, None, None)
    held = tuple(g if need else None for g, need in zip(held, wanted))
    if ctx is not None:
        return _bridge.scale_held_gradients(ctx, held, grad_loss)
    return tuple(None if g is None else _bridge.scaled_reference(g, grad_loss) for g in held)


def _recompute_backward(layout, options, wanted, hidden, weight, bias, targets, lse, count, grad_loss, grad_rows,
                        accumulators, class_weight=None):
    """Recompute mode's backward on this rank (its collectives included): (grad_hidden, grad_weight,
    grad_bias), None where not wanted or added into its accumulator. grad_loss / grad_rows: the
    upstream gradients of the loss and of this rank's rows (either None where none reached it)."""
    sequence = layout.sequence_parallel
    none = options.reduction == "none"
    if grad_loss is None:  # only the rows got a gradient
        grad_loss = torch.zeros(layout.local_tokens if none else 1, dtype=torch.float32, device=lse.device)
    grad_loss = grad_loss.to(torch.float32).reshape(-1)  # [1], or this rank's [N_r] for "none"
    if none:
        grad_loss = _gather_tokens(grad_loss, layout)
    if not _row_outputs(options) or (grad_rows is None and not sequence):
        grad_rows = None
    else:
        # Sequence parallel gathers them on every rank (zeros where none reached this rank's
        # rows: the ranks make the same collectives). [k, N_r] -> [k, N], token-major, so each
        # rank's tokens land in place.
        if grad_rows is None:
            grad_rows = torch.zeros(_row_count(options), layout.local_tokens, dtype=torch.float32, device=lse.device)
        grad_rows = _gather_tokens(grad_rows.to(torch.float32).t().contiguous(), layout).t().reshape(-1)
        grad_rows = grad_rows.contiguous()
    return _shard_gradients(layout, options, wanted, _gather_tokens(hidden, layout), weight, bias,
                            scored_targets(targets, layout, options.ignore_index), lse, count, grad_loss, grad_rows,
                            accumulators, class_weight)


class _VocabParallelLinearCrossEntropy(torch.autograd.Function):
    """The loss outside torch.compile (and on a PyTorch without torch.library.custom_op), after the
    handshake: the same forward and backward as the operators below, without them."""

    @staticmethod
    def forward(ctx, hidden, weight, bias, targets, layout, options, eager, wanted, accumulators, class_weight):
        loss, rows_out, *detached, lse, count, held = _forward_math(layout, options, eager, wanted, hidden, weight,
                                                                    bias, targets, class_weight)
        ctx.layout, ctx.options, ctx.eager, ctx.accumulators = layout, options, eager, accumulators
        # None (not zeros) for an output no gradient reached: the rows' gradients are then not passed
        # to the kernels (whose plan without them is the faster one), as on one GPU.
        ctx.set_materialize_grads(False)
        ctx.mark_non_differentiable(*detached)
        if eager:
            ctx.save_for_backward(*held)
        else:
            ctx.save_for_backward(hidden, weight, bias, targets, lse, count, class_weight)
        return (loss, rows_out) + tuple(detached)

    @staticmethod
    @torch.autograd.function.once_differentiable
    def backward(ctx, grad_loss, grad_rows, *detached):  # detached: the no-gradient outputs' (None)
        wanted = ctx.needs_input_grad[:3]
        if ctx.eager:
            # As on one GPU (lfce::forward's autograd rule): each held gradient times grad_loss in fp32,
            # rounded once to its dtype, in place (lfce_scale_gradient), once per forward.
            grads = _scale_held(ctx.saved_tensors, wanted, grad_loss, ctx)
        else:
            hidden, weight, bias, targets, lse, count, class_weight = ctx.saved_tensors
            grads = _recompute_backward(ctx.layout, ctx.options, wanted, hidden, weight, bias, targets, lse, count,
                                        grad_loss, grad_rows, ctx.accumulators, class_weight)
        return tuple(g if need else None for g, need in zip(grads, wanted)) + (None,) * 7


# --- the operators: the loss under torch.compile ----------------------------------------------------
#
# lfce::vocab_parallel_forward and lfce::vocab_parallel_backward (torch.library custom ops, PyTorch 2.4
# and later) hold the whole forward and the recompute backward, handshake and collectives included:
# torch.compile (Dynamo, AOTAutograd) sees two opaque operators whose output shapes come from the fake
# implementations, so a model ending in this loss compiles without a graph break. Inside, the same
# functions run as in the autograd.Function (_agree, _forward_math, _recompute_backward): results are
# identical. The process group travels as its name (ProcessGroup.group_name; "" for the default
# group), resolved inside the operators (_process_group), as torch's functional collectives pass it.
# Outside torch.compile the autograd.Function runs (no torch._dynamo import on the first call, as
# lfce::forward), also on a PyTorch without custom ops.
#
#   lfce::vocab_parallel_forward(hidden [N_r, H], weight [V_r, H], bias [V_r]?, targets [N_r],
#       class_weight [V_r]?, weight_grad_accumulator?, bias_grad_accumulator?, group_name, vocab_start
#       (-1: None), sequence_parallel, ignore_index, reduction, loss_mode, chunk_size?,
#       workspace_budget?, softcap?, temperature, z_loss_scale, label_smoothing, token_scaling,
#       sequence_length (T with a causal shift, else 0), outputs (bits of OUTPUT_FLAGS), need_hidden,
#       need_weight, need_bias)
#     -> (loss, rows [k, N_r], predicted, accuracy, z_loss, lse [k'·N], count [1] or [3], layout [2]
#         int64 (CPU: v0, vocab), grad_hidden, grad_weight, grad_bias)
#   loss_mode: the mode asked for (not "mode": torch.compile's functionalization of the backward's
#   mutated accumulators takes a keyword of that name). N: the gathered token count (P·N_r in
#   sequence parallel); k' = k + 1 with token scaling, + 1 with class weights (_forward_math's lse).
#   loss, rows, predicted, accuracy, z_loss
#   as the autograd.Function's outputs (fp32 [0] for one not asked for); lse, count and layout are
#   what the backward reads; the gradients are eager mode's (upstream gradient 1), [0] where not
#   computed. The accumulators are not touched (they are inputs for the backward).
#
#   lfce::vocab_parallel_backward(hidden, weight, bias?, targets, class_weight?, lse, count, layout, grad_loss?,
#       grad_rows?, weight_grad_accumulator(a!)?, bias_grad_accumulator(b!)?, group_name, ... the
#       forward's options from sequence_parallel on) -> (grad_hidden, grad_weight, grad_bias), [0]
#       where not needed or added into its accumulator. Recompute mode only; eager mode's backward
#       scales the held gradients in the autograd rule (_bridge.scaled_reference).

HAVE_CUSTOM_OPS = _ops.HAVE_CUSTOM_OPS

_OPTION_ARGS = ("sequence_parallel", "ignore_index", "reduction", "loss_mode", "chunk_size", "workspace_budget",
                "softcap", "temperature", "z_loss_scale", "label_smoothing", "token_scaling", "sequence_length",
                "outputs", "need_hidden", "need_weight", "need_bias")
_OPTIONS_SCHEMA = ("bool sequence_parallel, int ignore_index, str reduction, str loss_mode, int? chunk_size, "
                   "int? workspace_budget, float? softcap, float temperature, float z_loss_scale, "
                   "float label_smoothing, bool token_scaling, int sequence_length, int outputs, "
                   "bool need_hidden, bool need_weight, bool need_bias")
_FORWARD_SCHEMA = ("(Tensor hidden, Tensor weight, Tensor? bias, Tensor targets, Tensor? class_weight, "
                   "Tensor? weight_grad_accumulator, Tensor? bias_grad_accumulator, str group_name, int vocab_start, "
                   + _OPTIONS_SCHEMA +
                   ") -> (Tensor, Tensor, Tensor, Tensor, Tensor, Tensor, Tensor, Tensor, Tensor, Tensor, Tensor)")
_BACKWARD_SCHEMA = ("(Tensor hidden, Tensor weight, Tensor? bias, Tensor targets, Tensor? class_weight, "
                    "Tensor lse, Tensor count, "
                    "Tensor layout, Tensor? grad_loss, Tensor? grad_rows, Tensor(a!)? weight_grad_accumulator, "
                    "Tensor(b!)? bias_grad_accumulator, str group_name, " + _OPTIONS_SCHEMA +
                    ") -> (Tensor, Tensor, Tensor)")


def _group_name(group):
    """The name the operators take for ``group`` ("" for the default group): a plain string, which
    torch.compile reads off a ProcessGroup while tracing."""
    return "" if group is None else group.group_name


def _process_group(name):
    """The ProcessGroup named ``name`` ("": the default group)."""
    if not name:
        return _resolve_group(None)
    try:
        return torch._C._distributed_c10d._resolve_process_group(name)
    except (AttributeError, RuntimeError, ValueError):
        for group, group_name in dist.distributed_c10d._world.pg_names.items():
            if group_name == name:
                return group
        raise ProcessGroupError(f"lfce.distributed: no process group named {name!r} in this process") from None


def _forward_args(hidden, weight, bias, targets, class_weight, accumulators, group, vocab_start, sequence_parallel,
                  sequence_length, options, wanted):
    """lfce::vocab_parallel_forward's arguments for a checked call, in _FORWARD_NAMES' order."""
    given = {"hidden": hidden, "weight": weight, "bias": bias, "targets": targets, "class_weight": class_weight,
             "weight_grad_accumulator": accumulators[0], "bias_grad_accumulator": accumulators[1],
             "group_name": _group_name(group), "vocab_start": -1 if vocab_start is None else operator.index(vocab_start),
             "sequence_parallel": sequence_parallel, "loss_mode": options.mode, "sequence_length": sequence_length,
             "outputs": _output_bits(options), "need_hidden": wanted[0], "need_weight": wanted[1],
             "need_bias": wanted[2]}
    for name in ("ignore_index", "reduction", "chunk_size", "workspace_budget", "softcap", "temperature",
                 "z_loss_scale", "label_smoothing", "token_scaling"):
        given[name] = getattr(options, name)
    return tuple(given[name] for name in _FORWARD_NAMES)


def _options_from(kwargs):
    """The LossOptions an operator call carries (its keyword arguments by name)."""
    flags = {name: bool(kwargs["outputs"] >> i & 1) for i, name in enumerate(OUTPUT_FLAGS)}
    same = ("ignore_index", "reduction", "chunk_size", "workspace_budget", "softcap", "temperature", "z_loss_scale",
            "label_smoothing", "token_scaling")
    return LossOptions(mode=kwargs["loss_mode"], shift=kwargs["sequence_length"] > 0,
                       **{name: kwargs[name] for name in same}, **flags)


def _named(names, args):
    return dict(zip(names, args))


_FORWARD_NAMES = ("hidden", "weight", "bias", "targets", "class_weight", "weight_grad_accumulator",
                  "bias_grad_accumulator", "group_name", "vocab_start") + _OPTION_ARGS
_BACKWARD_NAMES = ("hidden", "weight", "bias", "targets", "class_weight", "lse", "count", "layout", "grad_loss",
                   "grad_rows", "weight_grad_accumulator", "bias_grad_accumulator", "group_name") + _OPTION_ARGS


def _held_rows(options, has_class_weight):
    """k': the rows of the forward's lse (the k asked for, then the scale with token scaling and the
    target weight with class weights)."""
    return _row_count(options) + options.token_scaling + has_class_weight


def _vocab_parallel_forward_impl(*args):
    a = _named(_FORWARD_NAMES, args)
    hidden, weight, bias, targets, class_weight = a["hidden"], a["weight"], a["bias"], a["targets"], a["class_weight"]
    options = _options_from(a)
    eager = _eager(options)
    wanted = (a["need_hidden"], a["need_weight"], a["need_bias"])
    vocab_start = None if a["vocab_start"] < 0 else a["vocab_start"]
    row = _handshake_row(options, eager, wanted, weight.shape[0], vocab_start, hidden.shape[0], hidden.shape[1],
                         hidden.dtype, targets.dtype, bias is not None, a["sequence_parallel"], class_weight is not None,
                         a["sequence_length"])
    layout = _agree(_process_group(a["group_name"]), row, (hidden, weight, targets), targets, None, class_weight)
    loss, rows_out, *detached, lse, count, held = _forward_math(layout, options, eager, wanted, hidden, weight, bias,
                                                                targets, class_weight)
    if not layout.sequence_parallel:
        rows_out = rows_out.clone()  # an operator's outputs alias nothing: rows_out may be lse's storage here
    where = torch.tensor([layout.v0, layout.vocab], dtype=torch.int64)
    grads = _ops._or_empty(held if held is not None else (None, None, None), hidden)
    return (loss, rows_out, *detached, lse, count, where) + tuple(grads)


def _vocab_parallel_forward_fake(*args):
    a = _named(_FORWARD_NAMES, args)
    hidden, weight, bias = a["hidden"], a["weight"], a["bias"]
    options = _options_from(a)
    eager = _eager(options)
    n = hidden.shape[0]
    tokens = n * (dist.get_world_size(_process_group(a["group_name"])) if a["sequence_parallel"] else 1)
    k = _row_count(options)
    held_rows = _held_rows(options, a["class_weight"] is not None)
    none = options.reduction == "none"
    f32 = torch.float32

    def reduced(asked):  # accuracy, z_loss: per token for "none", else 0-dim; [0] when not asked for
        return hidden.new_empty(((n,) if none else ()) if asked else (0,), dtype=f32)

    predicted = hidden.new_empty(n, dtype=torch.int64) if options.return_predicted else hidden.new_empty(0, dtype=f32)
    grads = tuple(_ops._empty_unless(eager and need, like) if like is not None else hidden.new_empty(0)
                  for need, like in zip((a["need_hidden"], a["need_weight"], a["need_bias"]), (hidden, weight, bias)))
    return (hidden.new_empty((n,) if none else (), dtype=f32), hidden.new_empty((k, n), dtype=f32), predicted,
            reduced(options.return_accuracy), reduced(options.return_z_loss),
            hidden.new_empty(held_rows * tokens, dtype=f32),
            hidden.new_empty(1 if a["class_weight"] is None else 3, dtype=f32),
            torch.empty(2, dtype=torch.int64, device="cpu")) + grads


def _vocab_parallel_backward_impl(*args):
    a = _named(_BACKWARD_NAMES, args)
    hidden, weight = a["hidden"], a["weight"]
    options = _options_from(a)
    group = _process_group(a["group_name"])
    v0, vocab = a["layout"].tolist()  # a CPU tensor: no device sync
    layout = Layout(group, dist.get_rank(group), dist.get_world_size(group), "nccl" in str(dist.get_backend(group)),
                    v0, weight.shape[0], vocab, hidden.shape[0], a["sequence_parallel"], a["sequence_length"])
    wanted = (a["need_hidden"], a["need_weight"], a["need_bias"])
    grads = _recompute_backward(layout, options, wanted, hidden, weight, a["bias"], a["targets"], a["lse"],
                                a["count"], a["grad_loss"], a["grad_rows"],
                                (a["weight_grad_accumulator"], a["bias_grad_accumulator"]), a["class_weight"])
    return _ops._or_empty(grads, hidden)


def _vocab_parallel_backward_fake(*args):
    a = _named(_BACKWARD_NAMES, args)
    hidden, weight, bias = a["hidden"], a["weight"], a["bias"]
    need_weight = a["need_weight"] and a["weight_grad_accumulator"] is None
    need_bias = a["need_bias"] and a["bias_grad_accumulator"] is None
    grad_bias = _ops._empty_unless(need_bias, bias) if bias is not None else hidden.new_empty(0)
    return _ops._empty_unless(a["need_hidden"], hidden), _ops._empty_unless(need_weight, weight), grad_bias


def _vocab_parallel_setup_context(ctx, inputs, output):
    a = _named(_FORWARD_NAMES, inputs)
    ctx.options = {name: a[name] for name in ("group_name",) + _OPTION_ARGS}
    ctx.eager = _eager(_options_from(a))
    ctx.computed = (a["need_hidden"], a["need_weight"], a["need_bias"])  # eager mode's held gradients
    ctx.set_materialize_grads(False)
    ctx.mark_non_differentiable(*output[2:])
    lse, count, where, *held = output[5:]
    if ctx.eager:
        ctx.save_for_backward(*held)
    else:
        ctx.save_for_backward(a["hidden"], a["weight"], a["bias"], a["targets"], a["class_weight"], lse, count, where,
                              a["weight_grad_accumulator"], a["bias_grad_accumulator"])


def _vocab_parallel_backward_rule(ctx, grad_loss, grad_rows, *unused):
    wanted = tuple(ctx.needs_input_grad[:3])
    if ctx.eager:
        grads = _scale_held(tuple(g if computed else None for g, computed in zip(ctx.saved_tensors, ctx.computed)),
                            wanted, grad_loss)
    else:
        hidden, weight, bias, targets, class_weight, lse, count, where, weight_acc, bias_acc = ctx.saved_tensors
        options = dict(ctx.options, need_hidden=wanted[0], need_weight=wanted[1], need_bias=wanted[2] and bias is not None)
        grads = _vocab_parallel_backward_op(hidden, weight, bias, targets, class_weight, lse, count, where, grad_loss,
                                            grad_rows, weight_acc, bias_acc,
                                            *(options[name] for name in ("group_name",) + _OPTION_ARGS))
        returned = (wanted[0], wanted[1] and weight_acc is None, wanted[2] and bias_acc is None)
        grads = tuple(g if want else None for g, want in zip(grads, returned))
    return tuple(g if need else None for g, need in zip(grads, wanted)) + (None,) * (len(_FORWARD_NAMES) - 3)


def _register():
    """Define lfce::vocab_parallel_forward / _backward unless this process already has them."""
    if not hasattr(torch.ops.lfce, "vocab_parallel_backward"):
        op = torch.library.custom_op("lfce::vocab_parallel_backward", _vocab_parallel_backward_impl,
                                     mutates_args=("weight_grad_accumulator", "bias_grad_accumulator"),
                                     schema=_BACKWARD_SCHEMA)
        op.register_fake(_vocab_parallel_backward_fake)
    if not hasattr(torch.ops.lfce, "vocab_parallel_forward"):
        op = torch.library.custom_op("lfce::vocab_parallel_forward", _vocab_parallel_forward_impl, mutates_args=(),
                                     schema=_FORWARD_SCHEMA)
        op.register_fake(_vocab_parallel_forward_fake)
        op.register_autograd(_vocab_parallel_backward_rule, setup_context=_vocab_parallel_setup_context)
    return torch.ops.lfce.vocab_parallel_forward.default, torch.ops.lfce.vocab_parallel_backward.default


if HAVE_CUSTOM_OPS:
    _vocab_parallel_forward_op, _vocab_parallel_backward_op = _register()


# --- the public entry points ------------------------------------------------------------------------

def linear_cross_entropy(hidden: Tensor, weight: Tensor, targets: Tensor, bias: Tensor | None = None, *,
                         group: dist.ProcessGroup | None = None, vocab_start: int | None = None,
                         sequence_parallel: bool = False, ignore_index: int = -100, reduction: Reduction = "mean",
                         mode: Mode = "recompute", chunk_size: int | None = None, workspace_budget: int | None = None,
                         softcap: float | None = None, temperature: float | None = None,
                         z_loss_scale: float | None = None, label_smoothing: float | None = None,
                         class_weight: Tensor | None = None, token_scaling: bool = False, shift: bool = False,
                         weight_grad_accumulator: Tensor | None = None, bias_grad_accumulator: Tensor | None = None,
                         return_z_loss: bool = False, return_lse: bool = False, return_entropy: bool = False,
                         return_logprob: bool = False, return_accuracy: bool = False, return_predicted: bool = False,
                         options: LossOptions | None = None) -> Tensor | tuple[Tensor, Tensor] | functional.LossOutput:
    """Cross-entropy of ``hidden @ W.T + b`` against ``targets`` with W, b sharded by vocabulary rows.

    Args:
        hidden: [..., H] CUDA tensor: the full batch (tensor parallel) or this rank's tokens
            (``sequence_parallel``; the same count on every rank).
        weight: this rank's shard [V_r, H] of W (V_r >= 1; sizes may differ between ranks).
        targets: hidden.shape[:-1], int64 or int32: global class ids in [0, V), or ignore_index.
        bias: this rank's shard [V_r] of b, or None (on every rank).
        group: the process group the vocabulary is sharded over (None: the default group).
        vocab_start: where this rank's rows start in [0, V); None on every rank: the shards follow
            one another in group rank order. Given on every rank, the shards may be in any order
            but must tile [0, V).
        sequence_parallel: the input layout (see the module docstring).
        ignore_index, reduction, mode, chunk_size, workspace_budget, softcap, temperature, z_loss_scale,
        label_smoothing, token_scaling: as lfce.linear_cross_entropy, over the whole vocabulary V (the
            smoothing's uniform share eps / V, token scaling's p(target) under the whole softmax);
            mean and sum cover every token of the batch, on every rank; each must be the same on
            every rank (checked). With label_smoothing, class_weight or token_scaling the shard
            kernels take the gradients of lse's rows (docs/parallel.md), which have no fp16 path:
            bf16 or fp32 inputs.
        class_weight: this rank's shard [V_r] of the class weights (as bias), on every rank or on none;
            as lfce.linear_cross_entropy's (weights the cross-entropy, "mean" divides by the sum of
            the counted tokens' weights over the whole batch; no gradient).
        shift: as lfce.linear_cross_entropy: position t scored against target t + 1 of its sequence,
            the last position of a sequence against none. Tensor parallel: targets [..., T] (hidden
            [..., T, H]), sequences of T tokens. Sequence parallel: each rank's targets [..., T_r], the
            same shape on every rank, rank r holding positions [r·T_r, (r + 1)·T_r) of each sequence of
            P·T_r (the sequence dimension split over the ranks in rank order, as context parallelism
            without load balancing splits it); a rank's last position is scored against rank r + 1's
            first. Every per-token output belongs to its position.
        weight_grad_accumulator, bias_grad_accumulator: fp32 tensors shaped like this rank's weight
            and bias shards (recompute mode), into which the backward adds the shard's gradients
            instead of returning them, as lfce.linear_cross_entropy does with the whole weight; not
            in the module's forward.
        return_z_loss: as lfce.linear_cross_entropy: the z-loss term s·LSE² alone (0 for ignored
            tokens), from the global LSE, reduced as the loss (mean over every counted token of the
            batch; "none": this rank's tokens), fp32, no gradient; ``(loss, z_loss)``, or the
            LossOutput's z_loss with the outputs below. No communication of its own.
        return_lse, return_entropy, return_logprob: as lfce.linear_cross_entropy (an lfce.LossOutput
            is returned, each differentiable; per token of this rank: all N in tensor parallel), from
            the statistics combined across the ranks (docs/parallel.md); mode "eager" then runs
            "recompute", as on one GPU.
        return_predicted, return_accuracy: as lfce.linear_cross_entropy (no gradient; eager mode
            stays eager): predicted the argmax id over the whole vocabulary, int64, -1 for an ignored
            token, per token of this rank; accuracy 1.0 / 0.0 per token of this rank for "none", else
            the fraction of the batch's counted tokens whose argmax is the target (NaN when none is
            counted), the same bits on every rank. Each rank's shard kernels give its own argmax
            column; its logit u is recomputed per token in fp32 from the hidden row and the weight row
            (+ bias, then softcap and temperature as the shard's kernels apply them); the ranks'
            (u, id) travel in the forward's all-gather and the largest u wins, ties (equal fp32 u)
            going to the lowest global id, as torch.argmax's first occurrence, whatever the shards'
            order. Precision: within a shard the kernels' own logits decide; across shards the
            recomputed ones, whose accumulation order can differ from the kernels' in the last
            bits, so where two shards' best logits lie within a few fp32 ulps the winner can differ
            from one GPU's on the whole weight (the same on every rank, always).
        options: all of ignore_index ... return_predicted (but class_weight, a tensor) as one
            lfce.LossOptions instead (the keyword options then left at their defaults).

    Returns:
        The fp32 loss, equal on every rank for mean / sum; for "none" the losses of this rank's
        tokens (all of them in tensor parallel), shaped like ``targets``; with return_z_loss alone
        ``(loss, z_loss)``; with return_lse, return_entropy, return_logprob, return_accuracy or
        return_predicted an lfce.LossOutput(loss, z_loss, lse, entropy, logprob, accuracy,
        predicted), None in each field not asked for (per-token fields shaped like ``targets``).
        The gradients of hidden (summed over the ranks), of the weight shard and of the bias shard,
        in their dtypes.

    Raises:
        TypeError / ValueError naming the bad argument (an argument that differs between ranks:
        on every rank, naming the ranks and their values); RuntimeError without a process group.
    """
    # Arguments are checked on each rank first, then compared across the ranks in one handshake
    # that every rank makes even when its own arguments are bad (_agree): an invalid argument on one
    # rank is the same error on every rank, never one rank raising while its peers wait.
    failure, row, targets_1d, sequence_length = None, None, None, 0
    try:
        options = resolve(
            options, ignore_index=ignore_index, reduction=reduction, mode=mode, chunk_size=chunk_size,
            workspace_budget=workspace_budget, softcap=softcap, temperature=temperature, z_loss_scale=z_loss_scale,
            label_smoothing=label_smoothing, token_scaling=token_scaling, shift=shift, return_z_loss=return_z_loss,
            return_lse=return_lse, return_entropy=return_entropy, return_logprob=return_logprob,
            return_accuracy=return_accuracy, return_predicted=return_predicted)
        _check.flag("sequence_parallel", sequence_parallel)
        _check.integer("vocab_start", vocab_start, minimum=0, allow_none=True)
        hidden, weight, bias = functional._autocast((hidden, weight, bias))
        accumulators = (weight_grad_accumulator, bias_grad_accumulator)
        functional._check_accumulator_mode(options.mode, accumulators)
        n, h, shard = functional._validate_tensors(hidden, weight, targets, bias, class_weight,
                                                   accumulators=accumulators)
        _check_dtype_options(options, class_weight, hidden.dtype)
        class_weight = functional._fp32_class_weight(class_weight)
        if options.shift:
            if targets.dim() == 0:
                raise InvalidArgumentError("shift=True needs a sequence dimension: hidden [..., T, H] and targets "
                                           f"[..., T], got hidden of shape {tuple(hidden.shape)}")
            sequence_length = targets.shape[-1]
        batch_shape = targets.shape
        hidden, targets_1d = hidden.reshape(n, h), targets.reshape(n)
        # As on one GPU: eager needs a scalar loss and no gradient through lse, entropy or logprob.
        eager = _eager(options)
        wanted = tuple(torch.is_grad_enabled() and t is not None and t.requires_grad for t in (hidden, weight, bias))
        if not (HAVE_CUSTOM_OPS and _bridge.compiling()):  # else the operator builds it, at run time
            row = _handshake_row(options, eager, wanted, shard, vocab_start, n, h, hidden.dtype, targets.dtype,
                                 bias is not None, sequence_parallel, class_weight is not None, sequence_length)
    except Exception as error:  # noqa: BLE001 - every failure is told to the peers before it is raised
        failure = error
    if failure is not None and (_bridge.compiling() or not (dist.is_available() and dist.is_initialized())):
        # No group to tell; or torch.compile is tracing: raised here, on this rank, before any
        # collective (without fullgraph Dynamo then runs the call uncompiled, whose handshake tells
        # every rank; the operators' handshake compares the ranks' valid arguments).
        raise failure
    group = _resolve_group(group)
    if HAVE_CUSTOM_OPS and _bridge.compiling():
        assert options is not None and targets_1d is not None, "set when nothing failed"
        # The handshake and the collectives run inside lfce::vocab_parallel_forward (no graph break).
        outputs = _vocab_parallel_forward_op(*_forward_args(hidden, weight, bias, targets_1d, class_weight,
                                                            accumulators, group, vocab_start, sequence_parallel,
                                                            sequence_length, options, wanted))
        loss, rows = outputs[:2]
        predicted, accuracy, z_loss = (value.detach() for value in outputs[2:5])
    else:
        layout = _agree(group, row, (hidden, weight, targets), targets_1d, failure, class_weight)
        assert options is not None and targets_1d is not None, "set before the handshake, which raised otherwise"
        loss, rows, predicted, accuracy, z_loss = _VocabParallelLinearCrossEntropy.apply(
            hidden, weight, bias, targets_1d, layout, options, eager, wanted, accumulators, class_weight)
    none = options.reduction == "none"
    loss = loss.reshape(batch_shape) if none else loss
    z_loss = (z_loss.reshape(batch_shape) if none else z_loss) if options.return_z_loss else None
    if not any(getattr(options, name) for name in EXTRA_OUTPUTS):
        return (loss, z_loss) if z_loss is not None else loss
    named = dict(zip(("lse",) + tuple(name for name in ROW_OUTPUTS[1:] if getattr(options, name)), rows))
    lse = named["lse"].reshape(batch_shape) if options.return_lse else None
    entropy, logprob = (named[name].reshape(batch_shape) if name in named else None
                        for name in ("return_entropy", "return_logprob"))
    accuracy = (accuracy.reshape(batch_shape) if none else accuracy) if options.return_accuracy else None
    predicted = predicted.reshape(batch_shape) if options.return_predicted else None
    return functional.LossOutput(loss, z_loss, lse, entropy, logprob, accuracy, predicted)


def _row_outputs(options):
    """Whether ``options`` asks for an output that is a row of lse (lse, entropy, logprob)."""
    return any(getattr(options, name) for name in ROW_OUTPUTS)


def _handshake_row(options, eager, wanted, shard, vocab_start, tokens, hidden_size, dtype, target_dtype, has_bias,
                   sequence_parallel, has_class_weight=False, sequence_length=0):
    """This rank's row of _FIELDS for the handshake (_agree; class_weight_sum is filled in there)."""
    return {"vocab_shard": shard, "vocab_start": -1 if vocab_start is None else operator.index(vocab_start),
            "class_weight_sum": 0, "tokens": tokens, "hidden": hidden_size, "dtype": _ops.DTYPES[dtype],
            "target_dtype": _ops.INDEX_DTYPES[target_dtype], "has_bias": int(has_bias),
            "has_class_weight": int(has_class_weight), "ignore_index": options.ignore_index,
            "softcap": float_bits(options.softcap or 0.0), "temperature": float_bits(options.temperature),
            "z_loss_scale": float_bits(options.z_loss_scale), "label_smoothing": float_bits(options.label_smoothing),
            "token_scaling": int(options.token_scaling), "sequence_length": sequence_length,
            "reduction": _lib.REDUCTIONS[options.reduction],
            "mode": _lib.MODES["eager" if eager else "recompute"], "sequence_parallel": int(sequence_parallel),
            "need_hidden": int(wanted[0]), "need_weight": int(wanted[1]), "need_bias": int(wanted[2]),
            "outputs": _output_bits(options)}


def _output_bits(options):
    """The outputs ``options`` asks for as the handshake's (and the operators') bits of OUTPUT_FLAGS."""
    return sum(1 << i for i, name in enumerate(OUTPUT_FLAGS) if getattr(options, name))


def _eager(options):
    """Whether the call runs eager mode: as on one GPU, eager needs a scalar loss and no gradient
    through lse, entropy or logprob."""
    return options.mode == "eager" and options.reduction != "none" and not _row_outputs(options)


def _check_dtype_options(options, class_weight, dtype):
    """The options the shard kernels cannot run with fp16 inputs: the z-loss (as on one GPU), and the
    weighted problem's (label smoothing, class weights, token scaling), whose terms reach the shard
    kernels as gradients of lse's rows (no fp16 path)."""
    if dtype != torch.float16:
        return
    if options.z_loss_scale != 0.0:
        raise InvalidArgumentError(f"z_loss_scale={options.z_loss_scale!r} is not supported with torch.float16 "
                                   "inputs (as lfce.linear_cross_entropy: fp16's gradient scaling bounds |p - "
                                   "onehot| by 1); use torch.bfloat16 or torch.float32")
    for name, value in (("label_smoothing", options.label_smoothing), ("token_scaling", options.token_scaling)):
        if value:
            raise InvalidArgumentError(f"lfce.distributed: {name}={value!r} is not supported with torch.float16 "
                                       "inputs on a vocabulary-sharded weight (its terms reach the shard kernels as "
                                       "gradients of the lse rows, which have no fp16 path); use torch.bfloat16 or "
                                       "torch.float32")


class VocabParallelLinearCrossEntropyLoss(torch.nn.Module):
    """Module form of :func:`lfce.distributed.linear_cross_entropy`: the options fixed at construction::

        loss_fn = VocabParallelLinearCrossEntropyLoss(group=tp_group, sequence_parallel=True)
        loss = loss_fn(hidden_shard, lm_head.weight, labels_shard)   # lm_head holds this rank's rows
    """

    class_weight: Tensor | None
    options: LossOptions

    def __init__(self, *, group: dist.ProcessGroup | None = None, vocab_start: int | None = None,
                 sequence_parallel: bool = False, ignore_index: int = -100, reduction: Reduction = "mean",
                 mode: Mode = "recompute", chunk_size: int | None = None, workspace_budget: int | None = None,
                 softcap: float | None = None, temperature: float | None = None, z_loss_scale: float | None = None,
                 label_smoothing: float | None = None, class_weight: Tensor | None = None,
                 token_scaling: bool = False, shift: bool = False, return_z_loss: bool = False,
                 return_lse: bool = False, return_entropy: bool = False, return_logprob: bool = False,
                 return_accuracy: bool = False, return_predicted: bool = False,
                 options: LossOptions | None = None) -> None:
        super().__init__()
        self.options = resolve(
            options, ignore_index=ignore_index, reduction=reduction, mode=mode, chunk_size=chunk_size,
            workspace_budget=workspace_budget, softcap=softcap, temperature=temperature, z_loss_scale=z_loss_scale,
            label_smoothing=label_smoothing, token_scaling=token_scaling, shift=shift, return_z_loss=return_z_loss,
            return_lse=return_lse, return_entropy=return_entropy, return_logprob=return_logprob,
            return_accuracy=return_accuracy, return_predicted=return_predicted)
        _check.flag("sequence_parallel", sequence_parallel)
        _check.integer("vocab_start", vocab_start, minimum=0, allow_none=True)
        functional.check_class_weight(class_weight)
        # This rank's shard of the class weights: a buffer, as torch.nn.CrossEntropyLoss's weight.
        self.register_buffer("class_weight", class_weight)
        self.layout: dict[str, Any] = {"group": group, "vocab_start": vocab_start,
                                       "sequence_parallel": sequence_parallel}

    def forward(self, hidden: Tensor, weight: Tensor, targets: Tensor, bias: Tensor | None = None
                ) -> Tensor | tuple[Tensor, Tensor] | functional.LossOutput:
        """The loss of this rank's weight (and bias, class weight) shard; see linear_cross_entropy."""
        return linear_cross_entropy(hidden, weight, targets, bias, class_weight=self.class_weight,
                                    options=self.options, **self.layout)

    def extra_repr(self) -> str:
        defaults = LossOptions()
        shown = {**{k: v for k, v in self.layout.items() if k != "group"},
                 **{name: getattr(self.options, name) for name in OPTION_NAMES
                    if getattr(self.options, name) != getattr(defaults, name) or name in ("ignore_index", "reduction")}}
        if self.class_weight is not None:
            shown["class_weight"] = f"[{self.class_weight.shape[0]}]"
        return ", ".join(f"{k}={v if k == 'class_weight' else repr(v)}" for k, v in shown.items() if v is not None)

