"""Comparison helpers and fp64 references for lfce's numeric tests (CPU or CUDA tensors).

Each check measures first and asserts after, so a failing test still reports what it
measured. Three measures of ``actual`` against ``expected`` (the fp64 reference):

* relative L2: ||a - e|| / ||e|| over the whole tensor (where ``e`` is all zeros,
  ``a`` must be exactly zero);
* elementwise (as llm.c's validate_result): |a - e| <= atol + rtol * |e| for every
  element, with atol a fraction of max |e| (an element whose terms cancel keeps the
  rounding error of its terms, not of its value) and never below the dtype's smallest
  subnormal step; the message names the first bad index, its expected and actual
  value, and how many elements are bad;
* per row (dim 0; a 1-D tensor's rows are blocks of BIAS_ROW elements): ||a_r - e_r|| / max(||e_r||,
  floor). The floor is ``row_floor`` times the rms row norm, and at least what the
  dtype's subnormal step allows, so rows whose norm is tiny are measured against the
  floor: a dropped row, a zeroed chunk or a missing edge tile fails unless its rows are
  below row_tol * floor, which a rel-L2 over the whole tensor would miss.

Tensors are compared in pieces of whole rows upcast to float64, so a 2^31-element
gradient needs no float64 copy of itself.
"""

import math
from dataclasses import dataclass

import torch
import torch.nn.functional as F

PIECE_ELEMENTS = 1 << 25  # float64 working set of a comparison: a few 256 MiB buffers

UNIT_ROUNDOFF = {torch.bfloat16: 2.0 ** -8, torch.float16: 2.0 ** -11, torch.float32: 2.0 ** -24}


@dataclass(frozen=True)
class Tolerance:
    rel_l2: float     # ||a - e|| / ||e||
    rtol: float       # elementwise |a - e| <= atol + rtol * |e| ...
    atol: float       # ... with atol = this fraction of max |e|
    row: float        # per-row relative L2 (None: no per-row check)
    row_floor: float  # rows below this fraction of the rms row norm are measured against it


# Gradients. bf16 / fp16: dz is rounded once to the dtype and each gradient once more, so a
# value dominated by one term is off by up to 2 unit roundoffs (rtol); per row the roundings
# of a row's elements average out, except for the dz of a dominant token (coherent over its
# row). rel_l2 is the tunable one: about 1.5x the error measured on the H200 (see
# scripts/gpu_tests.sh; each test records it). fp32 uses exact fp32 FMAs.
# bf16 rel_l2 on random logits (make_inputs): the targets' p is ~0, so with mean/sum every
# target's dz is the same value -g (g = upstream / count) and its rounding to bf16 (up to
# 2^-8 relative, set by g's mantissa) does not average out over tokens. Modelled on CPU the
# error is 1.7e-3 .. 3.2e-3 as g varies (4.2e-3 at worst), so 3e-3 would fail for some upstream
# values whatever the kernel. Measured on the H200 (2026-11-30): up to 4.4e-3 (grad_bias, N = 7,
# eager, mean), so 6e-3; the peaked case (PEAKED_REL_L2) is the one that tells a kernel
# rounding the logits to bf16 apart.
GRAD = {
    torch.bfloat16: Tolerance(rel_l2=6e-3, rtol=2.0 ** -7, atol=2.0 ** -7, row=2e-2, row_floor=1e-2),
    torch.float16: Tolerance(rel_l2=5e-3, rtol=2.0 ** -10, atol=2.0 ** -10, row=5e-3, row_floor=1e-2),
    torch.float32: Tolerance(rel_l2=1e-4, rtol=1e-4, atol=3e-5, row=1e-4, row_floor=1e-2),
}
# The peaked-logits case (peaked_inputs): lfce's roundings (dz, then each gradient, to bf16)
# give about 2.2e-3 there (CPU model; 2.96e-3 measured on the H200, 2026-11-30, V = 256000);
# rounding the logits to bf16 before the softmax about 1.2e-2. 1.5x the measured error:
PEAKED_REL_L2 = 4.5e-3
# A result may be off by 1.5x the error of the exact answer rounded to its dtype when that is
# above rel_l2 (assert_close).
ROUNDING_FACTOR = 1.5
# Loss: computed and returned in fp32 from inputs in the dtype (the dtype's unit roundoff on top,
# which bounded the loss's rounding to the dtype before lfce returned it in fp32).
LOSS = {
    dtype: Tolerance(rel_l2=base + UNIT_ROUNDOFF[dtype], rtol=2 * UNIT_ROUNDOFF[dtype] + 1e-5, atol=1e-5,
                     row=None, row_floor=0.0)
    for dtype, base in ((torch.bfloat16, 2e-3), (torch.float16, 2e-3), (torch.float32, 1e-5))
}

EXACT = Tolerance(rel_l2=0.0, rtol=0.0, atol=0.0, row=None, row_floor=0.0)  # bit for bit (up to -0.0)


def smallest_step(dtype):
    """The spacing of the dtype's subnormals: no rounding to it can be finer."""
    if not dtype.is_floating_point:
        return 0.0
    info = torch.finfo(dtype)
    return info.tiny * info.eps


# --- measuring ------------------------------------------------------------------------------

BIAS_ROW = 32  # a 1-D tensor's "rows": blocks of this many elements


def _rows(tensor):
    """The tensor as [rows, row length]; a 1-D one in blocks of BIAS_ROW (the tail padded with zeros).

    A single grad_bias element can be a sum whose terms cancel, so it is no row of its own;
    a block of them still shows a dropped element, chunk or edge tile.
    """
    t = tensor.detach()
    if t.dim() == 1:
        return F.pad(t, (0, -t.numel() % BIAS_ROW)).reshape(-1, BIAS_ROW)
    return t.reshape(t.shape[0] if t.dim() else 1, -1)


def _pieces(actual, expected):
    """(first row, actual rows, expected rows) in float64, a few million elements at a time."""
    a, e = _rows(actual), _rows(expected)
    step = max(1, PIECE_ELEMENTS // max(1, a.shape[1]))
    for r0 in range(0, a.shape[0], step):
        yield r0, a[r0:r0 + step].double(), e[r0:r0 + step].double()


def _unravel(flat, shape):
    index = []
    for size in reversed(tuple(shape)):
        index.append(flat % size)
        flat //= size
    return tuple(reversed(index)) or (0,)


def _expected_scale(actual, expected):
    """(||e||^2, max |e|, row count, row length)."""
    sq, top = 0.0, 0.0
    for _, _, e in _pieces(actual, expected):
        sq += float((e * e).sum())
        top = max(top, float(e.abs().max()) if e.numel() else 0.0)
    rows = _rows(expected)
    return sq, top, rows.shape[0], rows.shape[1]


def measure(actual, expected, tol):
    """Every measure of ``actual`` against ``expected``; see the module docstring.

    Returns a dict: rel_l2, elementwise (worst |a-e| / bound; > 1 fails), bad_elements,
    first_bad (index, expected, actual) or None, row (worst row error / row tol; > 1 fails,
    None without a per-row check), bad_rows, first_bad_row (row, expected norm, actual norm,
    error) or None. NaN or inf in actual counts as an infinite error.
    """
    e_sq, e_max, n_rows, row_len = _expected_scale(actual, expected)
    atol = max(tol.atol * e_max, smallest_step(actual.dtype))
    rms_row = math.sqrt(e_sq / n_rows) if n_rows else 0.0
    floor = 0.0
    if tol.row is not None:
        floor = max(tol.row_floor * rms_row, smallest_step(actual.dtype) * math.sqrt(row_len) / tol.row)
    diff_sq, round_sq, worst, bad, first_bad = 0.0, 0.0, 0.0, 0, None
    worst_row, bad_rows, first_bad_row = 0.0, 0, None
    for r0, a, e in _pieces(actual, expected):
        d = a - e
        diff_sq += float((d * d).sum()) if torch.isfinite(d).all() else math.inf
        # What rounding the exact answer to the output dtype alone costs (the best possible).
        r = e.to(actual.dtype).double() - e
        round_sq += float((r * r).sum())
        # Elementwise: NaN compares false, so it counts as bad (bound > 0: atol >= one step).
        bound = atol + tol.rtol * e.abs()
        ok = d.abs() <= bound
        ratio = torch.where(ok, d.abs() / bound, torch.full_like(d, math.inf))
        worst = max(worst, float(ratio.max()) if ratio.numel() else 0.0)
        n_bad = int((~ok).sum())
        if n_bad and first_bad is None:
            at = int(torch.nonzero(~ok.reshape(-1))[0])
            first_bad = (_unravel(at + r0 * row_len, actual.shape), float(e.reshape(-1)[at]),
                         float(a.reshape(-1)[at]))
        bad += n_bad
        if tol.row is not None:
            e_norm = e.norm(dim=1)
            err = torch.nan_to_num(d.norm(dim=1) / torch.clamp(e_norm, min=floor), nan=math.inf)
            worst_row = max(worst_row, float(err.max()) / tol.row if err.numel() else 0.0)
            row_bad = ~(err <= tol.row)
            n_row_bad = int(row_bad.sum())
            if n_row_bad and first_bad_row is None:
                r = int(torch.nonzero(row_bad)[0])
                first_bad_row = (r0 + r, float(e_norm[r]), float(a[r].norm()), float(err[r]))
            bad_rows += n_row_bad
    if e_sq > 0:
        rel = math.sqrt(diff_sq / e_sq)
    else:
        rel = 0.0 if diff_sq == 0 else math.inf
    rounding = math.sqrt(round_sq / e_sq) if e_sq > 0 else 0.0
    return {"rel_l2": rel, "rounding": rounding, "elementwise": worst, "bad_elements": bad, "first_bad": first_bad,
            "row": worst_row if tol.row is not None else None, "bad_rows": bad_rows,
            "first_bad_row": first_bad_row, "atol": atol, "row_floor": floor}


# --- asserting ------------------------------------------------------------------------------

def assert_close(name, actual, expected, tol, record=None):
    """Measure (and record, if ``record`` is given), then assert every measure is in tolerance.

    record: a callable (name, metrics), e.g. the ``record_error`` fixture of conftest.py.
    """
    assert actual is not None, f"{name}: lfce returned no gradient"
    assert tuple(actual.shape) == tuple(expected.shape), f"{name}: shape {tuple(actual.shape)}, expected {tuple(expected.shape)}"
    metrics = measure(actual, expected, tol)
    if record is not None:
        record(name, metrics)
    problems = []
    # Where the output dtype cannot hold the answer to tol.rel_l2 (fp16 subnormals: grad_hidden
    # ~1e-6 at N = 8192 with mean), the bound is 1.5x what rounding the exact answer costs.
    limit = max(tol.rel_l2, ROUNDING_FACTOR * metrics["rounding"])
    if not metrics["rel_l2"] <= limit:
        problems.append("rel L2 {:.3g} > tolerance {:.3g} (the exact answer rounded to {}: {:.3g})".format(
            metrics["rel_l2"], limit, str(actual.dtype).replace("torch.", ""), metrics["rounding"]))
    if metrics["bad_elements"]:
        index, e, a = metrics["first_bad"]
        problems.append("%d element(s) off by more than atol %.3g + rtol %.3g * |expected|; first at %s: "
                        "expected %r, got %r" % (metrics["bad_elements"], metrics["atol"], tol.rtol, index, e, a))
    if metrics["bad_rows"]:
        row, e_norm, a_norm, err = metrics["first_bad_row"]
        problems.append("%d row(s) with relative L2 above %.3g (floor %.3g); first: row %d, error %.3g, "
                        "expected norm %.6g, got norm %.6g" % (metrics["bad_rows"], tol.row, metrics["row_floor"],
                                                               row, err, e_norm, a_norm))
    assert not problems, "{} ({}): {}".format(name, str(actual.dtype).replace("torch.", ""), "; ".join(problems))
    return metrics


def assert_gradients_match(ours, ref, dtype, reduction, record=None):
    """Loss and gradients (loss, grad_hidden, grad_weight, grad_bias or None) against the reference."""
    loss, grad_x, grad_w, grad_b = ours
    ref_loss, ref_x, ref_w, ref_b = ref
    assert loss.dtype == torch.float32, f"loss dtype {loss.dtype}, expected torch.float32 (inputs in {dtype})"
    assert_close(f"loss ({reduction})", loss, ref_loss, LOSS[dtype], record)
    assert_close("grad_hidden", grad_x, ref_x, GRAD[dtype], record)
    assert_close("grad_weight", grad_w, ref_w, GRAD[dtype], record)
    if ref_b is not None:
        assert_close("grad_bias", grad_b, ref_b, GRAD[dtype], record)


def assert_bitwise_equal(name, actual, expected):
    """Same dtype, shape and bits (NaN payloads aside: NaN equals NaN here)."""
    assert actual.dtype == expected.dtype and actual.shape == expected.shape, f"{name}: {actual.dtype} {tuple(actual.shape)} vs {expected.dtype} {tuple(expected.shape)}"
    a, e = actual.detach().reshape(-1), expected.detach().reshape(-1)
    differ = ~((a == e) | (torch.isnan(a) & torch.isnan(e)))
    n = int(differ.sum())
    if n:
        at = int(torch.nonzero(differ)[0])
        raise AssertionError("%s: %d of %d elements differ; first at %s: %r vs %r" % (
            name, n, a.numel(), _unravel(at, actual.shape), float(a[at]), float(e[at])))


def assert_within_one_ulp(name, actual, expected, atol):
    """|a - e| <= one step of the dtype at max(|a|, |e|) + atol * max |e|.

    For two results of one dtype that differ only in how fp32 partial sums were grouped
    before the one rounding to the dtype: the fp32 values differ by far less than a step,
    but can round to neighbours; atol covers elements whose terms cancel.
    """
    assert actual.dtype == expected.dtype and actual.shape == expected.shape, name
    bits = 1 - round(math.log2(torch.finfo(actual.dtype).eps))  # significand bits
    step = smallest_step(actual.dtype)
    a, e = actual.detach().double().reshape(-1), expected.detach().double().reshape(-1)
    top = torch.maximum(a.abs(), e.abs())
    ulp = torch.clamp(torch.ldexp(torch.ones_like(top), torch.frexp(top).exponent - bits), min=step)
    bound = ulp + atol * float(e.abs().max())
    bad = ~((a - e).abs() <= bound)
    n = int(bad.sum())
    if n:
        at = int(torch.nonzero(bad)[0])
        raise AssertionError("%s: %d element(s) more than one %s step (+ atol %.3g * max) apart; first at %s: "
                             "%r vs %r" % (name, n, str(actual.dtype).replace("torch.", ""), atol,
                                           _unravel(at, actual.shape), float(a[at]), float(e[at])))


# --- inputs ---------------------------------------------------------------------------------

def make_inputs(n, h, v, dtype, bias=False, ignore="some", seed=0, ignore_index=-100, device="cuda"):
    """hidden ~ N(0, 1), weight ~ N(0, 2.5/sqrt(H)) so logits have std about 2.5.

    ignore: "none", "some" (every fifth token, counting from the fifth, so N = 1 keeps
    its token) or "all".
    """
    g = torch.Generator(device=device).manual_seed(seed)
    x = torch.randn(n, h, device=device, generator=g).to(dtype)
    w = (torch.randn(v, h, device=device, generator=g) * (2.5 / h ** 0.5)).to(dtype)
    b = (torch.randn(v, device=device, generator=g) * 0.5).to(dtype) if bias else None
    y = torch.randint(0, v, (n,), device=device, generator=g)
    if ignore == "some":
        y[torch.arange(n, device=device) % 5 == 4] = ignore_index
    elif ignore == "all":
        y.fill_(ignore_index)
    else:
        assert ignore == "none", ignore
    return x, w, b, y


def shifted_problem(hidden, targets):
    """The problem a causal shift scores, written out for a reference: positions 0 .. T-2 of each
    sequence of hidden [B, T, H] against targets 1 .. T-1 of targets [B, T], flattened to
    ([B (T-1), H], [B (T-1)]); each sequence's last position has no target and is not in it."""
    return hidden[:, :-1].reshape(-1, hidden.shape[-1]), targets[:, 1:].reshape(-1)


def upstream(reduction, shape, dtype, seed=1, device="cuda"):
    """A random upstream gradient with values of the dtype: 0-dim for mean/sum, else shape (autograd
    casts it to the fp32 loss's dtype)."""
    g = torch.Generator(device=device).manual_seed(seed)
    size = () if reduction != "none" else shape
    return (torch.randn(size, device=device, generator=g) + 0.5).to(dtype)


def peaked_inputs(n, h, v, dtype, seed=0, device="cuda"):
    """Each token's target logit ln(V) + 2 above the rest (which have std 1): p(target) ~ 0.8.

    Hidden coordinate H - N + i belongs to token i alone: x[i] is 1 there (0 for the other
    tokens) and the target row w[y_i] holds ln(V) + 2 there, so only token i's target logit
    is raised. The other H - N coordinates are random. Targets are distinct, none ignored.
    There the target logit (about 14 at V = 256000) is rounded to bf16 with an error up to
    2^-5, which moves dz of the target by up to 3%: a kernel that rounds the logits to bf16
    before the softmax has a gradient rel. L2 error about 1.2e-2; lfce about 2.2e-3.
    """
    assert h >= n + 64, "peaked_inputs needs H >= N + 64 (one coordinate per token), got H=%d N=%d" % (h, n)
    g = torch.Generator(device=device).manual_seed(seed)
    free = h - n
    x = torch.zeros(n, h, device=device)
    w = torch.zeros(v, h, device=device)
    x[:, :free] = torch.randn(n, free, device=device, generator=g)
    w[:, :free] = torch.randn(v, free, device=device, generator=g) / free ** 0.5
    y = torch.randperm(v, device=device, generator=g)[:n]
    tokens = torch.arange(n, device=device)
    x[tokens, free + tokens] = 1.0
    w[y, free + tokens] = math.log(v) + 2.0
    return x.to(dtype), w.to(dtype), None, y


# --- references -----------------------------------------------------------------------------

def reference(x, w, b, y, reduction, grad, ignore_index=-100, softcap=None):
    """fp64 loss and gradients of F.cross_entropy(F.linear(x, w, b), y) through autograd; with a
    softcap c, of F.cross_entropy(c * tanh(F.linear(x, w, b) / c), y)."""
    x64 = x.detach().double().requires_grad_()
    w64 = w.detach().double().requires_grad_()
    b64 = None if b is None else b.detach().double().requires_grad_()
    logits = F.linear(x64.reshape(-1, x64.shape[-1]), w64, b64)
    if softcap is not None:
        logits = softcap * torch.tanh(logits / softcap)
    loss = F.cross_entropy(logits, y.reshape(-1).long(), ignore_index=ignore_index, reduction=reduction)
    if reduction == "none":
        loss = loss.reshape(y.shape)
    loss.backward(grad.double())
    return loss.detach(), x64.grad, w64.grad, None if b is None else b64.grad


def run_lfce(x, w, b, y, reduction, grad, **options):
    """lfce loss and gradients for leaf copies of the inputs."""
    import lfce  # here: the CPU tests of these helpers need no library

    x = x.detach().clone().requires_grad_()
    w = w.detach().clone().requires_grad_()
    b = None if b is None else b.detach().clone().requires_grad_()
    loss = lfce.linear_cross_entropy(x, w, y, b, reduction=reduction, **options)
    loss.backward(grad)
    return loss.detach(), x.grad, w.grad, None if b is None else b.grad


def chunked_reference(x, w, b, y, reduction, grad, ignore_index=-100, tokens_per_chunk=1024,
                      grad_hidden_dtype=torch.float64, logits_hook=None, dz_hook=None):
    """The same as reference(), token chunk by token chunk, without autograd.

    Only one chunk's [tokens, V] logits exist at a time (in float64), and grad_weight /
    grad_bias accumulate in float64, so N·V or N·H beyond 2^31 stays affordable.
    grad_hidden is stored as grad_hidden_dtype (float32 halves a huge one; its rounding,
    2^-24, is far below any tolerance here).
    logits_hook, dz_hook: optional callables applied to each chunk's float64 logits before
    the softmax and to its logit gradient before the GEMMs, to model a kernel's roundings
    (e.g. dz rounded to bf16, as lfce does, or logits rounded to bf16, as it must not).
    """
    x2, y1 = x.detach().reshape(-1, x.shape[-1]), y.reshape(-1).long()
    n = x2.shape[0]
    w64 = w.detach().double()
    b64 = None if b is None else b.detach().double()
    valid = y1 != ignore_index
    count = valid.sum().double()
    g = grad.detach().double().reshape(-1)
    if reduction == "mean":
        g = g / count
    token_loss = torch.zeros(n, dtype=torch.float64, device=x.device)
    grad_x = torch.zeros(x2.shape, dtype=grad_hidden_dtype, device=x.device)
    grad_w = torch.zeros_like(w64)
    grad_b = None if b is None else torch.zeros_like(b64)
    for t0 in range(0, n, tokens_per_chunk):
        t1 = min(n, t0 + tokens_per_chunk)
        xc, yc, vc = x2[t0:t1].double(), y1[t0:t1], valid[t0:t1]
        z = F.linear(xc, w64, b64)
        if logits_hook is not None:
            z = logits_hook(z)
        lse = torch.logsumexp(z, dim=1)
        safe_y = torch.where(vc, yc, torch.zeros_like(yc))
        rows = torch.arange(t1 - t0, device=x.device)
        token_loss[t0:t1] = torch.where(vc, lse - z[rows, safe_y], torch.zeros_like(lse))
        gc = g if g.numel() == 1 else g[t0:t1]
        gc = torch.where(vc, gc.expand(t1 - t0), torch.zeros_like(lse))
        dz = torch.exp(z - lse[:, None])
        dz[rows, safe_y] -= 1.0
        dz *= gc[:, None]
        del z
        if dz_hook is not None:
            dz = dz_hook(dz)
        grad_x[t0:t1] = (dz @ w64).to(grad_hidden_dtype)
        grad_w += dz.t() @ xc
        if grad_b is not None:
            grad_b += dz.sum(dim=0)
    if reduction == "none":
        loss = token_loss.reshape(y.shape)
    elif reduction == "sum":
        loss = token_loss.sum()
    else:
        loss = token_loss.sum() / count
    return loss, grad_x.reshape(x.shape), grad_w, grad_b
