"""The checks of lfce.distributed shared by the CPU test (gloo, lfce's CPU operators on each shard)
and the multi-GPU test (NCCL, lfce's kernels): one case = layout x mode x reduction x dtype x variant
x loss options, run on every rank of the group with the same inputs (same seed), each rank checking
its own results against the fp64 reference and lfce on the whole weight.

Variants: "uneven" (V odd: rank 0 holds V // 2 rows, the last rank one more), "one_shard" (every
target in rank 0's shard), "ignore_class" (ignore_index is a class id of the last shard: the shard
kernels must not ignore the class that maps onto it), "swapped" (vocab_start given, rank 0 holding
the last rows).

Loss options and outputs (OPTION_SETS): none ("plain"), softcap, temperature, both, the z-loss, the
per-token outputs lse / entropy / logprob (each with its own upstream gradient), the outputs without a
gradient predicted / accuracy (alone, and with both logit maps) and z_loss, all of them together, and
the gradient accumulators (recompute only); label smoothing, class weights (each rank passing its
shard of fixed weights in [0.5, 1.5]), both, token scaling, the causal shift (targets [2, T]: two
sequences; in sequence parallel each rank holds its T / P positions of both), every option and
output together ("weighted"), that with the shift, and label smoothing with class weights into
accumulators;
"plain", both maps, all outputs together and "weighted" run over every variant, each other over
"uneven". predicted and accuracy must equal lfce's on the whole weight exactly (and predicted the
fp64 reference's argmax), z_loss within the rows' tolerance.
"""

import itertools
from dataclasses import replace

import torch
import torch.nn.functional as F
from checks import GRAD, LOSS, Tolerance, assert_close, make_inputs, upstream

import lfce.distributed as lfce_dist

LAYOUTS = ("tensor", "sequence")
MODES = ("recompute", "eager")
REDUCTIONS = ("mean", "sum", "none")
DTYPES = (torch.float32, torch.bfloat16)
VARIANTS = ("uneven", "one_shard", "ignore_class", "swapped")
# The per-element maps of the logits, u = softcap * tanh(z / softcap) / temperature (logits of std
# about 2.5: a softcap of 5 bends most of them).
# The per-token outputs that are rows of lfce's lse, each with a random upstream gradient.
ROWS = ("lse", "entropy", "logprob")
# The outputs without a gradient (LossOutput's names).
DETACHED = ("predicted", "accuracy", "z_loss")
# On CUDA (test_multigpu_distributed.py), two logits of a token closer than this (in units of u) may
# compare either way between one GPU's kernels and lfce.distributed's fp32 recompute of each shard's
# best logit (its documented precision rule), as between the fp32 GEMM and the fp64 reference; a
# token whose top two are that close may be predicted either (test_gpu_extra_outputs.py's NEAR_TIE).
# On the CPU every token must match exactly.
NEAR_TIE = 1e-3
OPTION_SETS = {"plain": {}, "softcap": {"softcap": 5.0}, "temperature": {"temperature": 0.7},
               "softcap_temperature": {"softcap": 5.0, "temperature": 0.7},
               "lse": {"return_lse": True}, "entropy": {"return_entropy": True}, "logprob": {"return_logprob": True},
               "z_loss": {"z_loss_scale": 0.01},
               "predicted": {"return_predicted": True}, "accuracy": {"return_accuracy": True},
               "argmax_maps": {"softcap": 5.0, "temperature": 0.7, "return_predicted": True, "return_accuracy": True},
               "z_loss_out": {"z_loss_scale": 0.01, "return_z_loss": True},
               # fp32 accumulators holding earlier gradients (recompute mode only, as on one GPU)
               "accumulate": {"accumulate": True},
               "outputs": {"softcap": 5.0, "temperature": 0.7, "z_loss_scale": 0.01, "return_lse": True,
                           "return_entropy": True, "return_logprob": True, "return_z_loss": True,
                           "return_accuracy": True, "return_predicted": True},
               "label_smoothing": {"label_smoothing": 0.1}, "class_weight": {"class_weight": True},
               "smoothing_class_weight": {"label_smoothing": 0.1, "class_weight": True},
               "token_scaling": {"token_scaling": True}, "shift": {"shift": True}}
# Every option and output at once (the single-GPU suite's "everything" combination).
OPTION_SETS["weighted"] = {**OPTION_SETS["outputs"], "label_smoothing": 0.1, "class_weight": True,
                           "token_scaling": True}
OPTION_SETS["shift_weighted"] = {**OPTION_SETS["weighted"], "shift": True}
OPTION_SETS["accumulate_weighted"] = {"accumulate": True, "label_smoothing": 0.1, "class_weight": True}
EVERY_VARIANT = ("plain", "softcap_temperature", "outputs", "weighted")
# The causal shift's sequences: targets [SEQUENCES, N / SEQUENCES].
SEQUENCES = 2

# P ranks against one GPU on the whole weight: fp32 reassociation (the LSE's logsumexp over the
# shards, the grad_hidden partials summed) for fp32 and for the loss; for bf16 gradients the
# partials are rounded to bf16 on each rank before they are summed, and a dz at a rounding tie
# can round the other way under a reassociated LSE.
SAME_AS_ONE_GPU = {
    torch.float32: Tolerance(rel_l2=2e-5, rtol=1e-4, atol=1e-5, row=None, row_floor=0.0),
    torch.bfloat16: Tolerance(rel_l2=5e-3, rtol=2.0 ** -6, atol=2.0 ** -6, row=None, row_floor=0.0),
}
SAME_LOSS = Tolerance(rel_l2=1e-5, rtol=1e-5, atol=1e-5, row=None, row_floor=0.0)
# LSE, entropy and logprob against the fp64 reference: fp32 statistics, whatever the input dtype
# (bf16 inputs are exact in fp64; the logits' fp32 accumulation dominates).
ROW = Tolerance(rel_l2=1e-5, rtol=1e-5, atol=1e-5, row=None, row_floor=0.0)
# grad_hidden against the fp64 reference: on top of one GPU's roundings (dz, then the result, to
# the dtype), each rank's partial is rounded to the dtype before the sum, so an element can be
# off by up to two more half-steps: twice the elementwise bound of checks.GRAD.
GRAD_HIDDEN = {dtype: replace(tol, rtol=2 * tol.rtol, atol=2 * tol.atol) if dtype != torch.float32 else tol
               for dtype, tol in GRAD.items()}


def case_ids(selected=None):
    return ["-".join(map(str, (layout, mode, reduction, str(dtype).replace("torch.", ""), variant, options)))
            for layout, mode, reduction, dtype, variant, options in (cases() if selected is None else selected)]


def cases():
    return [case + (options,) for options in OPTION_SETS
            for case in itertools.product(LAYOUTS, MODES if "accumulate" not in options else ("recompute",),
                                          REDUCTIONS, DTYPES, VARIANTS if options in EVERY_VARIANT else ("uneven",))]


def class_weights(v, device):
    """Fixed class weights [V] in [0.5, 1.5] (fp32), the same on every rank."""
    return torch.rand(v, generator=torch.Generator().manual_seed(7)).add_(0.5).to(device)


def shifted(y, ignore_index, sequences):
    """The targets each position is scored against under a causal shift: targets [sequences, T]
    (flattened), each position the next one's, a sequence's last position ignore_index."""
    rows = y.reshape(sequences, -1)
    return torch.cat([rows[:, 1:], torch.full_like(rows[:, :1], ignore_index)], dim=1).reshape(-1)


# The accumulators' earlier sums: of the order of the gradients they receive (a "mean" gradient row
# at V = 151937 holds elements of about 1e-7), so that the fp32 sum keeps the gradient's bits and
# accumulator - before is checked at the gradients' own tolerance.
ACCUMULATED = 2.0 ** -20


def _accumulators(w, b, accumulate):
    """(weight, bias) fp32 accumulators for [V, H] / [V] holding earlier sums (fixed values), or Nones."""
    if not accumulate:
        return None, None
    g = torch.Generator(device=w.device).manual_seed(5)
    acc_w = torch.randn(w.shape, device=w.device, generator=g) * ACCUMULATED
    return acc_w, None if b is None else torch.randn(b.shape, device=w.device, generator=g) * ACCUMULATED


def _added(leaf, accumulator, before):
    """What the backward gave for a leaf: its .grad, or what it added into its accumulator (its .grad
    then None)."""
    if accumulator is None:
        return None if leaf is None else leaf.grad
    assert leaf.grad is None, "a gradient both added into its accumulator and returned"
    return accumulator - before


def reference(x, w, b, y, reduction, grad, ignore_index=-100, softcap=None, temperature=1.0, z_loss_scale=0.0,
              rows=(), row_grads=(), detached=(), label_smoothing=0.0, class_weight=None, token_scaling=False):
    """fp64 (loss, grad_hidden, grad_weight, grad_bias, [rows], {detached}) through autograd of
    F.cross_entropy(u, y, weight=class_weight, label_smoothing=label_smoothing) per token, u the logits
    mapped as lfce maps them (softcap * tanh(z / softcap) / temperature), and of the per-token
    ``rows`` (names of ROWS: LSE, entropy, logprob: 0 where ignored), each with its upstream gradient
    in ``row_grads``; plus the z-loss s·LSE² of the counted tokens; with token scaling both terms
    times p(target) (no gradient through it); reduced as the loss (mean: the cross-entropy over the
    counted tokens' class weights, the z-loss over their count). ``detached`` (names of DETACHED):
    the argmax of u (-1 where ignored), the accuracy (per token for "none", else over the counted
    tokens) and the z-loss term alone."""
    x64, w64 = (t.detach().double().requires_grad_() for t in (x, w))
    b64 = None if b is None else b.detach().double().requires_grad_()
    logits = F.linear(x64, w64, b64)
    if softcap is not None:
        logits = softcap * torch.tanh(logits / softcap)
    u = logits / temperature
    weight = None if class_weight is None else class_weight.double()
    cross_entropy = F.cross_entropy(u, y.long(), weight=weight, ignore_index=ignore_index,
                                    label_smoothing=label_smoothing, reduction="none")
    lse = u.logsumexp(-1)
    valid = y != ignore_index
    z_loss = torch.where(valid, z_loss_scale * lse * lse, torch.zeros_like(lse))
    log_p = u - lse[:, None]
    target = torch.where(valid, y, 0).long()
    if token_scaling:
        scale = torch.where(valid, log_p.gather(1, target[:, None])[:, 0].exp(), torch.zeros_like(lse)).detach()
        cross_entropy, z_loss = cross_entropy * scale, z_loss * scale
    weights = valid.double() if weight is None else torch.where(valid, weight[target], torch.zeros_like(lse))
    loss = {"none": lambda: cross_entropy + z_loss, "sum": lambda: cross_entropy.sum() + z_loss.sum(),
            "mean": lambda: cross_entropy.sum() / weights.sum() + z_loss.sum() / valid.sum()}[reduction]()
    values = {"lse": lse, "entropy": -(log_p.exp() * log_p).sum(-1),
              "logprob": torch.where(valid, log_p.gather(1, torch.where(valid, y, 0).long()[:, None])[:, 0],
                                     torch.zeros_like(lse))}
    outputs = [values[name] for name in rows]
    predicted = torch.where(valid, u.detach().argmax(-1), -1)
    correct = ((predicted == y) & valid).double()
    reduced = {"none": lambda t: t, "sum": torch.sum, "mean": lambda t: t.sum() / valid.sum()}[reduction]
    extra = {"predicted": predicted, "accuracy": correct if reduction == "none" else correct.sum() / valid.sum(),
             "z_loss": reduced(z_loss).detach()}
    extra = {name: extra[name] for name in detached}
    if "predicted" in detached or "accuracy" in detached:  # how near each token's top two logits are
        top2 = u.detach().topk(2, dim=-1).values
        extra["margin"] = top2[:, 0] - top2[:, 1]
        extra["near_ties"] = (valid & (extra["margin"] <= NEAR_TIE)).sum()  # 0-dim: the whole batch's
        extra["count"] = valid.sum()
    torch.autograd.backward([loss] + outputs, [grad.double()] + [g.double() for g in row_grads])
    return (loss.detach(), x64.grad, w64.grad, None if b is None else b64.grad, [o.detach() for o in outputs],
            extra)


def _fields(out):
    """(loss, {LossOutput field: value}) of an lfce call's result: the loss alone, (loss, z_loss), or
    an lfce.LossOutput."""
    if isinstance(out, torch.Tensor):
        return out, {}
    if hasattr(out, "_asdict"):
        return out.loss, {name: value for name, value in out._asdict().items() if name != "loss"}
    loss, z_loss = out
    return loss, {"z_loss": z_loss}


def _backward(out, rows, grad, row_grads, detached=()):
    """(loss, [rows], {detached}) of an lfce call's result, after a backward with these upstream
    gradients; the detached outputs must have no gradient."""
    loss, fields = _fields(out)
    values = [fields[name] for name in rows]
    extra = {name: fields[name] for name in detached}
    for name, value in extra.items():
        assert value is not None and not value.requires_grad, f"{name}: {value!r}"
    assert all(fields.get(name) is None for name in DETACHED if name not in detached), f"unasked outputs: {fields}"
    # Per-token upstream gradients come flat; the outputs are shaped like the targets ([sequences, T]
    # with a shift) and are given back flat.
    torch.autograd.backward([loss] + values, [grad.reshape(loss.shape)] +
                            [g.reshape(value.shape) for g, value in zip(row_grads, values)])
    return (loss.detach().reshape(-1) if loss.dim() else loss.detach(), [value.detach().reshape(-1) for value in values],
            {name: value.reshape(-1) if value.dim() else value for name, value in extra.items()})


def _sequences(t, shift):
    """t ([N] or [N, H]) as the call takes it: [SEQUENCES, T(, H)] with a shift, else as it is."""
    return t.reshape((SEQUENCES, -1) + tuple(t.shape[1:])) if shift else t


def run_whole(x, w, b, y, reduction, grad, mode, ignore_index, rows=(), row_grads=(), accumulate=False, detached=(),
              **options):
    """lfce.linear_cross_entropy with the whole weight on one device (the inputs' own: one GPU, or the
    CPU): (loss, grad_hidden, grad_weight, grad_bias, [rows], {detached})."""
    import lfce

    shift = options.get("shift", False)
    leaves = [None if t is None else t.detach().clone().requires_grad_() for t in (_sequences(x, shift), w, b)]
    before = _accumulators(w, b, accumulate)
    accumulators = tuple(None if t is None else t.clone() for t in before)
    out = lfce.linear_cross_entropy(leaves[0], leaves[1], _sequences(y, shift), leaves[2], ignore_index=ignore_index,
                                    reduction=reduction, mode=mode, weight_grad_accumulator=accumulators[0],
                                    bias_grad_accumulator=accumulators[1], **options,
                                    **{f"return_{r}": True for r in rows + tuple(detached)})
    loss, values, extra = _backward(out, rows, grad, row_grads, detached)
    return (loss, leaves[0].grad.reshape(x.shape), _added(leaves[1], accumulators[0], before[0]),
            _added(leaves[2], accumulators[1], before[1]), values, extra)


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


def _tokens(layout, n, rank, world_size, shift=False):
    """This rank's tokens of the batch (flat indices): all in tensor parallel, its N / P in sequence
    parallel; with a shift its T / P positions of each of the SEQUENCES sequences of T = N / SEQUENCES."""
    if layout != "sequence":
        return slice(None)
    if shift:
        length = n // SEQUENCES
        per_rank = length // world_size
        return torch.tensor([s * length + t for s in range(SEQUENCES)
                             for t in range(rank * per_rank, (rank + 1) * per_rank)])
    per_rank = n // world_size
    return slice(rank * per_rank, (rank + 1) * per_rank)


def run_distributed(x, w, b, y, grad, rank, world_size, layout, mode, reduction, variant, ignore_index, rows=(),
                    row_grads=(), accumulate=False, detached=(), class_weight=None, **options):
    """(loss, grad_hidden, grad_weight shard, grad_bias shard, [rows], {detached}) of lfce.distributed on
    this rank (``class_weight``: the whole vocabulary's; the call gets its shard)."""
    start, size, vocab_start = shard_of(variant, w.shape[0], rank, world_size)
    sequence = layout == "sequence"
    shift = options.get("shift", False)
    tokens = _tokens(layout, x.shape[0], rank, world_size, shift)
    xr = _sequences(x[tokens], shift).detach().clone().requires_grad_()
    wr = w[start:start + size].detach().clone().requires_grad_()
    br = None if b is None else b[start:start + size].detach().clone().requires_grad_()
    if class_weight is not None:
        options["class_weight"] = class_weight[start:start + size]
    before = tuple(None if t is None else t[start:start + size].clone() for t in _accumulators(w, b, accumulate))
    accumulators = tuple(None if t is None else t.clone() for t in before)
    out = lfce_dist.linear_cross_entropy(xr, wr, _sequences(y[tokens], shift), br, vocab_start=vocab_start,
                                         sequence_parallel=sequence,
                                         ignore_index=ignore_index, reduction=reduction, mode=mode,
                                         weight_grad_accumulator=accumulators[0],
                                         bias_grad_accumulator=accumulators[1], **options,
                                         **{f"return_{r}": True for r in rows + tuple(detached)})
    loss, values, extra = _backward(out, rows, grad[tokens] if reduction == "none" else grad,
                                    [g[tokens] for g in row_grads], detached)
    return (loss, xr.grad.reshape(-1, x.shape[1]), _added(wr, accumulators[0], before[0]),
            _added(br, accumulators[1], before[1]), values, extra)


def expected_part(full, rank, world_size, layout, variant, reduction, shift=False):
    """This rank's part of the full-problem (loss, grad_hidden, grad_weight, grad_bias, [rows], {detached})."""
    loss, gx, gw, gb, values, extra = full
    start, size, _ = shard_of(variant, gw.shape[0], rank, world_size)
    tokens = _tokens(layout, gx.shape[0], rank, world_size, shift)
    if reduction == "none":
        loss = loss[tokens]
    rows = slice(start, start + size)
    extra = {name: value[tokens] if value.dim() else value for name, value in extra.items()}
    return loss, gx[tokens], gw[rows], None if gb is None else gb[rows], [value[tokens] for value in values], extra


def check_case(case, rank, world_size, n, h, v, device, record=None, whole=False, **options):
    """Run one case on this rank; check it against the fp64 reference (the usual tolerances) and, with
    ``whole``, against lfce.linear_cross_entropy on this device with the whole weight (run_whole).
    ``options``: more keyword options of both calls, on top of the case's option set. Returns (loss,
    None or the failed check's message): a failure is not raised here so that every rank goes on to
    the same collectives."""
    layout, mode, reduction, dtype, variant, option_set = case
    options = {**OPTION_SETS[option_set], **options}
    rows = tuple(name for name in ROWS if options.pop(f"return_{name}", False))
    detached = tuple(name for name in DETACHED if options.pop(f"return_{name}", False))
    x, w, b, y, ignore_index = make_case(variant, n, h, v, dtype, world_size, device)
    if "accuracy" in detached and variant != "one_shard":
        y = _half_right(x, w, b, y, ignore_index)
    shift = options.get("shift", False)
    class_weight = class_weights(v, device) if options.pop("class_weight", False) else None
    grad = upstream(reduction, y.shape, dtype, device=device)
    row_grads = [upstream("none", y.shape, torch.float32, seed=2 + i, device=device) for i in range(len(rows))]
    ours = run_distributed(x, w, b, y, grad, rank, world_size, layout, mode, reduction, variant, ignore_index, rows,
                           row_grads, detached=detached, class_weight=class_weight, **options)
    maps = {name: options[name] for name in ("softcap", "temperature", "z_loss_scale", "label_smoothing",
                                             "token_scaling") if name in options}
    scored = shifted(y, ignore_index, SEQUENCES) if shift else y
    ref = expected_part(reference(x, w, b, scored, reduction, grad, ignore_index, rows=rows, row_grads=row_grads,
                                  detached=detached, class_weight=class_weight, **maps),
                        rank, world_size, layout, variant, reduction, shift)
    single = None
    if whole:
        single = expected_part(run_whole(x, w, b, y, reduction, grad, mode, ignore_index, rows, row_grads,
                                         detached=detached, class_weight=class_weight, **options),
                               rank, world_size, layout, variant, reduction, shift)
    names = (f"loss ({reduction})", "grad_hidden", "grad_weight", "grad_bias") + tuple(rows)
    tols = (LOSS[dtype], GRAD_HIDDEN[dtype], GRAD[dtype], GRAD[dtype]) + (ROW,) * len(rows)
    try:
        assert ours[0].dtype == torch.float32, f"loss dtype {ours[0].dtype}"
        for name, actual, expected, tol in zip(names, ours[:4] + tuple(ours[4]), ref[:4] + tuple(ref[4]), tols):
            if expected is not None:
                assert_close(name, actual, expected, tol, record)
        if single is not None:
            tols = (SAME_LOSS,) + (SAME_AS_ONE_GPU[dtype],) * 3 + (SAME_LOSS,) * len(rows)
            for name, actual, expected, tol in zip(names, ours[:4] + tuple(ours[4]), single[:4] + tuple(single[4]),
                                                   tols):
                if expected is not None:
                    assert_close(f"{name} vs one device", actual, expected, tol, record)
        check_detached(ours[5], ref[5], None if single is None else single[5], record, exact=device == "cpu")
    except AssertionError as error:
        return ours[0], str(error)
    return ours[0], None


def _half_right(x, w, b, y, ignore_index):
    """The targets with every other counted one replaced by its token's argmax (fp64 logits; the maps
    keep their order), so that the accuracy is neither 0 nor 1 and tells a wrong argmax."""
    best = F.linear(x.double(), w.double(), None if b is None else b.double()).argmax(-1).to(y.dtype)
    pick = (torch.arange(y.shape[0], device=y.device) % 2 == 0) & (y != ignore_index) & (best != ignore_index)
    return torch.where(pick, best, y)


def check_detached(ours, ref, single, record=None, exact=True):
    """The outputs without a gradient ({name: value} of this rank): predicted (int64) equal to one
    device's on the whole weight and to the fp64 reference's argmax, element for element; accuracy
    (fp32, shaped as the loss) equal to one device's, the same bits, and to the reference's; z_loss
    (fp32, shaped as the loss) within the rows' tolerance of both. Not ``exact`` (CUDA): a token whose
    top two logits are within NEAR_TIE may differ (the accuracy's mean by one such token each)."""
    for name, actual in ours.items():
        expected = ref[name]
        shape = tuple(expected.shape)
        assert tuple(actual.shape) == shape, f"{name}: shape {tuple(actual.shape)}, expected {shape}"
        if name in ("predicted", "accuracy") and actual.dim():  # per token
            assert actual.dtype == (torch.int64 if name == "predicted" else torch.float32), f"{name}: {actual.dtype}"
            near = torch.zeros_like(actual, dtype=torch.bool) if exact else ref["margin"] <= NEAR_TIE
            for what, other in (("the fp64 reference", expected), ("one device", None if single is None else
                                                                      single[name])):
                if other is None:
                    continue
                differ = actual.double() != other.double()
                if bool((differ & ~near).any()):
                    raise AssertionError(f"{name} differs from {what}'s at tokens {differ.nonzero().flatten().tolist()}"
                                         f": {actual.tolist()} against {other.tolist()}")
            continue
        assert actual.dtype == torch.float32, f"{name} dtype {actual.dtype}"
        if name == "accuracy":
            slack = 0.0 if exact else float(ref["near_ties"]) / max(1, int(ref["count"]))
            assert abs(float(actual) - float(expected)) <= slack + 1e-6, \
                f"accuracy {float(actual)} against the reference's {float(expected)}"
            if single is not None:
                assert (torch.equal(actual, single[name]) if exact else
                        abs(float(actual) - float(single[name])) <= slack + 1e-6), \
                    f"accuracy {float(actual)} against one device's {float(single[name])}"
            continue
        assert_close(name, actual.reshape(-1), expected.reshape(-1), ROW, record)
        if single is not None:
            assert_close(f"{name} vs one device", actual.reshape(-1), single[name].reshape(-1), SAME_LOSS, record)
