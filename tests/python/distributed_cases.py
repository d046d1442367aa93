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
the gradient accumulators (recompute only);
"plain", both maps and all together run over every variant, each alone over "uneven". predicted
and accuracy must equal lfce's on the whole weight exactly (and predicted the fp64 reference's
argmax), z_loss within the rows' tolerance.
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
                           "return_accuracy": True, "return_predicted": True}}
EVERY_VARIANT = ("plain", "softcap_temperature", "outputs")

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
            for case in itertools.product(LAYOUTS, MODES if options != "accumulate" else ("recompute",), REDUCTIONS,
                                          DTYPES, VARIANTS if options in EVERY_VARIANT else ("uneven",))]


def _accumulators(w, b, accumulate):
    """(weight, bias) fp32 accumulators for [V, H] / [V] holding earlier sums (fixed values), or Nones."""
    if not accumulate:
        return None, None
    g = torch.Generator(device=w.device).manual_seed(5)
    acc_w = torch.randn(w.shape, device=w.device, generator=g) * 0.25
    return acc_w, None if b is None else torch.randn(b.shape, device=w.device, generator=g) * 0.25


def _added(leaf, accumulator, before):
    """What the backward gave for a leaf: its .grad, or what it added into its accumulator (its .grad
    then None)."""
    if accumulator is None:
        return None if leaf is None else leaf.grad
    assert leaf.grad is None, "a gradient both added into its accumulator and returned"
    return accumulator - before


def reference(x, w, b, y, reduction, grad, ignore_index=-100, softcap=None, temperature=1.0, z_loss_scale=0.0,
              rows=(), row_grads=(), detached=()):
    """fp64 (loss, grad_hidden, grad_weight, grad_bias, [rows], {detached}) through autograd of
    F.cross_entropy(u, y), u the logits mapped as lfce maps them (softcap * tanh(z / softcap) /
    temperature), and of the per-token ``rows`` (names of ROWS: LSE, entropy, logprob: 0 where
    ignored), each with its upstream gradient in ``row_grads``; plus the z-loss s·LSE² of the counted
    tokens, reduced as the loss (mean: over the same count). ``detached`` (names of DETACHED): the
    argmax of u (-1 where ignored), the accuracy (per token for "none", else over the counted tokens)
    and the z-loss term alone."""
    x64, w64 = (t.detach().double().requires_grad_() for t in (x, w))
    b64 = None if b is None else b.detach().double().requires_grad_()
    logits = F.linear(x64, w64, b64)
    if softcap is not None:
        logits = softcap * torch.tanh(logits / softcap)
    u = logits / temperature
    loss = F.cross_entropy(u, y.long(), ignore_index=ignore_index, reduction=reduction)
    lse = u.logsumexp(-1)
    valid = y != ignore_index
    z_loss = torch.where(valid, z_loss_scale * lse * lse, torch.zeros_like(lse))
    loss = loss + {"none": z_loss, "sum": z_loss.sum(), "mean": z_loss.sum() / valid.sum()}[reduction]
    log_p = u - lse[:, None]
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
    torch.autograd.backward([loss] + values, [grad] + list(row_grads))
    return loss.detach(), [value.detach() for value in values], extra


def run_whole(x, w, b, y, reduction, grad, mode, ignore_index, rows=(), row_grads=(), accumulate=False, detached=(),
              **options):
    """lfce.linear_cross_entropy with the whole weight on one device (the inputs' own: one GPU, or the
    CPU): (loss, grad_hidden, grad_weight, grad_bias, [rows], {detached})."""
    import lfce

    leaves = [None if t is None else t.detach().clone().requires_grad_() for t in (x, w, b)]
    before = _accumulators(w, b, accumulate)
    accumulators = tuple(None if t is None else t.clone() for t in before)
    out = lfce.linear_cross_entropy(leaves[0], leaves[1], y, leaves[2], ignore_index=ignore_index,
                                    reduction=reduction, mode=mode, weight_grad_accumulator=accumulators[0],
                                    bias_grad_accumulator=accumulators[1], **options,
                                    **{f"return_{r}": True for r in rows + tuple(detached)})
    loss, values, extra = _backward(out, rows, grad, row_grads, detached)
    return (loss, leaves[0].grad, _added(leaves[1], accumulators[0], before[0]),
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


def _tokens(layout, n, rank, world_size):
    """This rank's tokens of the batch: all in tensor parallel, its N / P in sequence parallel."""
    if layout != "sequence":
        return slice(None)
    per_rank = n // world_size
    return slice(rank * per_rank, (rank + 1) * per_rank)


def run_distributed(x, w, b, y, grad, rank, world_size, layout, mode, reduction, variant, ignore_index, rows=(),
                    row_grads=(), accumulate=False, detached=(), **options):
    """(loss, grad_hidden, grad_weight shard, grad_bias shard, [rows], {detached}) of lfce.distributed on
    this rank."""
    start, size, vocab_start = shard_of(variant, w.shape[0], rank, world_size)
    sequence = layout == "sequence"
    tokens = _tokens(layout, x.shape[0], rank, world_size)
    xr = x[tokens].detach().clone().requires_grad_()
    wr = w[start:start + size].detach().clone().requires_grad_()
    br = None if b is None else b[start:start + size].detach().clone().requires_grad_()
    before = tuple(None if t is None else t[start:start + size].clone() for t in _accumulators(w, b, accumulate))
    accumulators = tuple(None if t is None else t.clone() for t in before)
    out = lfce_dist.linear_cross_entropy(xr, wr, y[tokens], br, vocab_start=vocab_start, sequence_parallel=sequence,
                                         ignore_index=ignore_index, reduction=reduction, mode=mode,
                                         weight_grad_accumulator=accumulators[0],
                                         bias_grad_accumulator=accumulators[1], **options,
                                         **{f"return_{r}": True for r in rows + tuple(detached)})
    loss, values, extra = _backward(out, rows, grad[tokens] if reduction == "none" else grad,
                                    [g[tokens] for g in row_grads], detached)
    return (loss, xr.grad, _added(wr, accumulators[0], before[0]), _added(br, accumulators[1], before[1]), values,
            extra)


def expected_part(full, rank, world_size, layout, variant, reduction):
    """This rank's part of the full-problem (loss, grad_hidden, grad_weight, grad_bias, [rows], {detached})."""
    loss, gx, gw, gb, values, extra = full
    start, size, _ = shard_of(variant, gw.shape[0], rank, world_size)
    tokens = _tokens(layout, gx.shape[0], rank, world_size)
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
    grad = upstream(reduction, y.shape, dtype, device=device)
    row_grads = [upstream("none", y.shape, torch.float32, seed=2 + i, device=device) for i in range(len(rows))]
    ours = run_distributed(x, w, b, y, grad, rank, world_size, layout, mode, reduction, variant, ignore_index, rows,
                           row_grads, detached=detached, **options)
    maps = {name: options[name] for name in ("softcap", "temperature", "z_loss_scale") if name in options}
    ref = expected_part(reference(x, w, b, y, reduction, grad, ignore_index, rows=rows, row_grads=row_grads,
                                  detached=detached, **maps), rank, world_size, layout, variant, reduction)
    single = None
    if whole:
        single = expected_part(run_whole(x, w, b, y, reduction, grad, mode, ignore_index, rows, row_grads,
                                         detached=detached, **options), rank, world_size, layout, variant, reduction)
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
