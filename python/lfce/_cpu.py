"""The operators lfce::forward / lfce::backward on CPU tensors, in PyTorch, chunked over the vocabulary.

The same function as the CUDA kernels (the operators' contract is _ops.py's docstring; the checks
both make are _contract.py's): the logits are formed one vocabulary chunk of ``width`` columns at a
time, never [N, V] whole, so the transient memory is at most four [N, width] tensors plus [N, H]
(docs/options.md#cpu-tensors):

* forward: per chunk, the chunk's row max merged into a running max with the running sum of
  exponentials rescaled (online log-sum-exp), the target logit picked where the target falls in the
  chunk, and the running sums the options need (class-weighted logits for label smoothing, p·u for
  the entropy, the argmax for the predicted ids);
* backward: per chunk, the logits recomputed, dz formed from the forward's LSE with the constants of
  docs/design.md, then grad_hidden += dz·W[chunk] (one [N, H] accumulator), grad_weight[chunk] =
  dzᵀ·x (each row written once, or added into its accumulator) and grad_bias[chunk] = Σ dz.

Accumulation is fp32 (fp64 for fp64 inputs, which the library has no dtype for: the CPU path
takes them so that a model can be compared with its fp64 self); each gradient is rounded once to
its input's dtype. Mode "eager" computes the gradients in the forward with an upstream gradient of
1 through the backward's code, as the operator's contract asks (the same function as recompute).
The loss, lse and valid_count are fp32, fp64 for fp64 inputs.

Where liblfce.so loads, each call first runs the library's own check of the problem
(lfce_check_problem), fp64 checked as fp32, so a CPU call refuses what a CUDA call refuses.

_ops.py registers ``forward`` / ``backward`` as the operators' CPU kernels where this PyTorch has
custom ops (torch.compile, opcheck); its autograd.Function calls them directly for CPU tensors.
"""

import ctypes
import functools

import torch

from . import _bridge, _contract, _lib
from .errors import InvalidArgumentError, LibraryError

__all__ = ["backward", "chunk_width", "forward"]

DEFAULT_WORKSPACE_BUDGET = 256 << 20  # bytes of one chunk's [N, width] logits, as the library's default


def chunk_width(tokens, vocab, chunk_size=None, workspace_budget=None, element_size=4):
    """Vocabulary columns per chunk: chunk_size when given (in either mode), else as many as fit one
    [tokens, width] tensor of element_size bytes (the accumulation dtype's) in workspace_budget
    (256 MiB by default)."""
    if chunk_size is not None:
        return max(1, min(int(chunk_size), vocab))
    budget = DEFAULT_WORKSPACE_BUDGET if workspace_budget is None else int(workspace_budget)
    return max(1, min(vocab, budget // (max(tokens, 1) * element_size)))


def _width(hidden, weight, chunk_size, workspace_budget):
    element_size = torch.finfo(_bridge.statistics_dtype(hidden)).bits // 8
    return chunk_width(hidden.shape[0], weight.shape[0], chunk_size, workspace_budget, element_size)


# --- the library's check -----------------------------------------------------------------------

_no_library = []  # the LibraryError of a failed load, once: no CPU call retries it


def _library():
    if _no_library:
        return None
    try:
        return _lib.load()
    except LibraryError as error:
        _no_library.append(error)
        return None


def _check_problem(hidden, weight, bias, targets, class_weight, ignore_index, reduction, mode, chunk_size,
                   workspace_budget, options, outputs, sequence_length, accumulate=(False, False)):
    """lfce_check_problem on this call's problem (fp64 as fp32: the options valid for one are valid for
    the other); nothing when liblfce.so is not there (the Python checks have run)."""
    library = _library()
    if library is None:
        return
    softcap, temperature, z_loss_scale, label_smoothing, token_scaling = options
    problem = _lib.make_problem(
        hidden.shape[0], hidden.shape[1], weight.shape[0], _bridge.DTYPES.get(hidden.dtype, _lib.DTYPE_FP32),
        target_dtype=_bridge.INDEX_DTYPES[targets.dtype], has_bias=bias is not None,
        reduction=_lib.REDUCTIONS[reduction], mode=_lib.MODES[mode], ignore_index=ignore_index,
        chunk_size=chunk_size, workspace_budget=workspace_budget, softcap=softcap, temperature=temperature,
        z_loss_scale=z_loss_scale, label_smoothing=label_smoothing, has_class_weight=class_weight is not None,
        accumulate_grad_weight=accumulate[0], accumulate_grad_bias=accumulate[1], token_scaling=token_scaling,
        outputs=outputs, sequence_length=sequence_length)
    _lib.check(library.lfce_check_problem(ctypes.byref(problem)))


def _check_inputs(hidden, class_weight, valid_count=None):
    """What a direct operator call must pass: class weights (and for the backward valid_count) in
    the statistics dtype, the three counts with class weights."""
    dtype = _bridge.statistics_dtype(hidden)
    if class_weight is not None and class_weight.dtype != dtype:
        raise InvalidArgumentError(f"lfce operators on CPU: class_weight must be {dtype} for {hidden.dtype} inputs, "
                                   f"got {class_weight.dtype}")
    if class_weight is not None and valid_count is not None and valid_count.numel() < 3:
        raise InvalidArgumentError("lfce::backward: with class_weight, valid_count must hold 3 counts (as "
                                   f"lfce::forward returns it), got {valid_count.numel()}")


# --- the logits, one chunk at a time -------------------------------------------------------------

class _Problem:
    """One call's inputs in the accumulation dtype, the targets each position is scored against, and
    the chunks of the vocabulary."""

    def __init__(self, hidden, weight, bias, targets, class_weight, ignore_index, softcap, temperature,
                 sequence_length, width):
        self.dtype = _bridge.statistics_dtype(hidden)
        self.input_dtype = hidden.dtype
        self.x = hidden.to(self.dtype)  # [N, H], the only input converted whole
        self.weight, self.bias, self.class_weight = weight, bias, class_weight
        self.softcap, self.temperature = softcap, temperature
        self.n, self.vocab = hidden.shape[0], weight.shape[0]
        y = _shifted(targets, ignore_index, sequence_length)
        self.valid = y != ignore_index
        self.in_range = (y >= 0) & (y < self.vocab)
        self.y = y.long()
        self.target = self.y.masked_fill(~(self.valid & self.in_range), 0)  # a safe index for every row
        self.chunks = [(v0, min(v0 + width, self.vocab)) for v0 in range(0, self.vocab, width)]

    def logits(self, v0, v1, slope=False):
        """(u, du/dz or None) of columns [v0, v1): the logits the softmax sees, u = softcap(z) / T, and
        with slope=True their derivative where a softcap makes it one more [N, chunk] tensor (None
        without a softcap: du/dz = 1 / T). In place past the GEMM: one [N, chunk] tensor for u."""
        z = self.x @ self.weight[v0:v1].to(self.dtype).t()
        if self.bias is not None:
            z.add_(self.bias[v0:v1].to(self.dtype))
        if self.softcap is None:
            return z.div_(self.temperature), None
        capped = z.div_(self.softcap).tanh_()
        derivative = capped.square().neg_().add_(1).div_(self.temperature) if slope else None
        return capped.mul_(self.softcap / self.temperature), derivative

    def weights(self, v0, v1):
        """The class weights of columns [v0, v1), None without class weights (all 1)."""
        return None if self.class_weight is None else self.class_weight[v0:v1]

    def hits(self, v0, v1):
        """(rows, columns within the chunk) of the counted tokens whose target falls in [v0, v1)."""
        rows = (self.valid & self.in_range & (self.y >= v0) & (self.y < v1)).nonzero().reshape(-1)
        return rows, self.y[rows] - v0


def _shifted(targets, ignore_index, sequence_length):
    """The target of each position: with a causal shift over sequences of sequence_length tokens,
    the next position's, ignore_index for each sequence's last."""
    if not sequence_length:
        return targets
    rows = targets.reshape(-1, sequence_length)
    last = torch.full_like(rows[:, :1], ignore_index)
    return torch.cat([rows[:, 1:], last], dim=1).reshape(-1)


def _row_statistics(problem, smoothing, entropy, predicted):
    """One pass over the chunks: (lse, target logit, sum_v w_v u_v or None, sum_v p_v u_v or None,
    argmax or None) per row, the LSE merged chunk by chunk (online max and rescaled sum)."""
    n, dtype = problem.n, problem.dtype
    running_max = torch.full((n,), float("-inf"), dtype=dtype)
    total = torch.zeros(n, dtype=dtype)
    picked = torch.zeros(n, dtype=dtype)
    weighted = torch.zeros(n, dtype=dtype) if smoothing else None
    moment = torch.zeros(n, dtype=dtype) if entropy else None
    best, argmax = (torch.full((n,), float("-inf"), dtype=dtype), torch.zeros(n, dtype=torch.int64)) \
        if predicted else (None, None)
    for v0, v1 in problem.chunks:
        u, _ = problem.logits(v0, v1)
        chunk_max, chunk_arg = u.max(dim=1)
        new_max = torch.maximum(running_max, chunk_max)
        rescale = torch.exp(running_max - new_max)
        e = torch.sub(u, new_max[:, None]).exp_()
        total = total * rescale + e.sum(dim=1)
        if entropy:  # sum_v e_v u_v per row, with no [N, chunk] product
            moment = moment * rescale + torch.einsum("ij,ij->i", e, u)
        del e
        running_max = new_max
        rows, columns = problem.hits(v0, v1)
        picked[rows] = u[rows, columns]
        if smoothing:
            w = problem.weights(v0, v1)
            weighted += u.sum(dim=1) if w is None else u @ w
        if predicted:  # strictly greater: the lowest index among equal maxima, as torch.argmax
            better = chunk_max > best
            best = torch.where(better, chunk_max, best)
            argmax = torch.where(better, chunk_arg + v0, argmax)
    lse = running_max + torch.log(total)
    return lse, picked, weighted, None if moment is None else moment / total, argmax


# --- the operators -------------------------------------------------------------------------------

def _empty(like):
    return like.new_empty(0)


def _without_autocast(function):
    """The CPU kernels compute in their inputs' dtypes and fp32 (fp64): CPU autocast, which would run
    their matmuls in its own dtype, is off inside them (lfce.linear_cross_entropy casts the inputs to
    the autocast dtype first, as F.linear's are cast)."""
    @functools.wraps(function)
    def without_autocast(*args, **kwargs):
        with torch.autocast("cpu", enabled=False):
            return function(*args, **kwargs)
    return without_autocast


@_without_autocast
def forward(hidden, weight, bias, targets, class_weight, weight_grad_accumulator, bias_grad_accumulator,
            ignore_index, reduction, mode, chunk_size, workspace_budget, softcap, temperature, z_loss_scale,
            label_smoothing, token_scaling, need_hidden, need_weight, need_bias, outputs=0, sequence_length=0):
    """lfce::forward on CPU tensors (the outputs of _ops.py's contract)."""
    eager = _contract.eager(mode, reduction, outputs)
    if eager and (weight_grad_accumulator is not None or bias_grad_accumulator is not None):
        raise InvalidArgumentError("lfce::forward: gradient accumulators need mode 'recompute', got mode 'eager'")
    _check_inputs(hidden, class_weight)
    wanted = (need_hidden, need_weight, need_bias and bias is not None) if eager else (False, False, False)
    eager = eager and any(wanted)
    options = (softcap, temperature, z_loss_scale, label_smoothing, token_scaling)
    _check_problem(hidden, weight, bias, targets, class_weight, ignore_index, reduction,
                   "eager" if eager else "recompute", chunk_size, workspace_budget, options, outputs, sequence_length)
    p = _Problem(hidden, weight, bias, targets, class_weight, ignore_index, softcap, temperature, sequence_length,
                 _width(hidden, weight, chunk_size, workspace_budget))
    eps = label_smoothing
    lse, picked, weighted, mean_logit, argmax = _row_statistics(p, eps != 0.0, bool(outputs & _lib.OUTPUT_ENTROPY),
                                                                bool(outputs & _lib.OUTPUT_PREDICTED))
    nan = torch.full_like(lse, float("nan"))
    picked = torch.where(p.valid & ~p.in_range, nan, picked)  # a target outside [0, V): a NaN loss
    zero = torch.zeros_like(lse)
    w_y = torch.ones_like(lse) if class_weight is None else class_weight[p.target]
    cross_entropy = (1 - eps) * w_y * (lse - picked)
    if eps:
        w_sum = p.vocab if class_weight is None else class_weight.sum()
        cross_entropy = cross_entropy + eps * (w_sum * lse - weighted) / p.vocab
    cross_entropy = torch.where(p.valid, cross_entropy, zero)
    z_loss = torch.where(p.valid, z_loss_scale * lse * lse, zero)
    rows = [lse]
    if token_scaling:  # p(target), 0 for ignored tokens (lfce.h)
        scale = torch.where(p.valid, torch.exp(picked - lse), zero)
        cross_entropy, z_loss = cross_entropy * scale, z_loss * scale
        rows.append(scale)
    count = p.valid.sum().to(p.dtype).reshape(1)
    if class_weight is not None:  # lfce.h: the count, the sum of w_y, the sum of w (with smoothing only)
        all_weights = class_weight.sum() if eps else torch.zeros((), dtype=p.dtype)
        count = torch.stack([count[0], torch.where(p.valid, w_y, zero).sum(), all_weights])
    token_loss = cross_entropy + z_loss
    if reduction == "none":
        loss = token_loss
    elif reduction == "sum":
        loss = token_loss.sum()
    else:
        loss = cross_entropy.sum() / count[1 if class_weight is not None else 0] + z_loss.sum() / count[0]
    if outputs & _lib.OUTPUT_ENTROPY:  # -sum_v p_v log p_v = LSE - sum_v p_v u_v, every token
        rows.append(lse - mean_logit)
    if outputs & _lib.OUTPUT_LOGPROB:  # 0 for ignored tokens, NaN for a target outside [0, V)
        rows.append(torch.where(p.valid, picked - lse, zero))
    predicted = _empty(targets.long())
    if outputs & _lib.OUTPUT_PREDICTED:
        predicted = torch.where(p.valid, argmax, torch.full_like(argmax, -1))
    lse = torch.cat(rows)
    grads = tuple(_empty(hidden) for _ in range(3))  # three tensors: outputs must not alias each other
    if eager:  # the backward's code with an upstream gradient of 1: the same function as recompute mode
        grads = _gradients(p, lse, count, torch.ones(1, dtype=p.dtype), None, reduction, options, outputs, wanted,
                           (None, None))
    return (loss, lse, count) + grads + (predicted,)


@_without_autocast
def backward(hidden, weight, bias, targets, class_weight, lse, valid_count, grad_loss, weight_grad_accumulator,
             bias_grad_accumulator, ignore_index, reduction, chunk_size, workspace_budget, softcap, temperature,
             z_loss_scale, label_smoothing, token_scaling, need_hidden, need_weight, need_bias, grad_lse=None,
             outputs=0, sequence_length=0):
    """lfce::backward on CPU tensors (the outputs of _ops.py's contract)."""
    _check_inputs(hidden, class_weight, valid_count)
    _contract.check_lse(hidden, lse, grad_lse, token_scaling, outputs)
    wanted = (need_hidden, need_weight, need_bias and bias is not None)
    accumulators = (weight_grad_accumulator, bias_grad_accumulator)
    options = (softcap, temperature, z_loss_scale, label_smoothing, token_scaling)
    _check_problem(hidden, weight, bias, targets, class_weight, ignore_index, reduction, "recompute", chunk_size,
                   workspace_budget, options, outputs, sequence_length, _bridge.accumulated(wanted, accumulators))
    if not any(wanted):
        return tuple(_empty(hidden) for _ in range(3))
    p = _Problem(hidden, weight, bias, targets, class_weight, ignore_index, softcap, temperature, sequence_length,
                 _width(hidden, weight, chunk_size, workspace_budget))
    return _gradients(p, lse.to(p.dtype), valid_count.to(p.dtype), grad_loss, grad_lse, reduction, options, outputs,
                      wanted, accumulators)


def _gradients(p, lse, count, grad_loss, grad_lse, reduction, options, outputs, wanted, accumulators):
    """(grad_hidden, grad_weight, grad_bias), each [0] where not wanted or added into its accumulator,
    from dz_v = (P p_v - T [v = y] - U w_v) * du/dz per row, the constants as lfce's (docs/design.md):
    P = a ((1 - eps) w_y + eps W / V) + b 2 s LSE, T = a (1 - eps) w_y, U = a eps / V; a scales the
    cross-entropy (the upstream gradient, / the sum of w_y for "mean", times the token's scale with
    token scaling), b the z-loss (/ the count). grad_lse's rows add p (LSE), -p (u - S) with S = LSE - H
    (entropy) and onehot - p (logprob of a counted token) before du/dz."""
    _, _, z_loss_scale, eps, token_scaling = options
    n, vocab, dtype = p.n, p.vocab, p.dtype
    names = ["lse"] + ["scale"] * bool(token_scaling) + ["entropy"] * bool(outputs & _lib.OUTPUT_ENTROPY)
    names += ["logprob"] * bool(outputs & _lib.OUTPUT_LOGPROB)
    rows = dict(zip(names, lse.reshape(len(names), n)))
    upstream = None if grad_lse is None else dict(zip(names, grad_lse.to(dtype).reshape(len(names), n)))
    lse = rows["lse"]
    g = grad_loss.to(dtype).reshape(-1).expand(n)
    a = torch.where(p.valid, g, torch.zeros_like(g))
    if token_scaling:
        a = a * rows["scale"]
    b = a
    if reduction == "mean":
        a, b = a / count[1 if p.class_weight is not None else 0], b / count[0]
    w_y = torch.ones_like(lse) if p.class_weight is None else p.class_weight[p.target]
    w_sum = vocab if p.class_weight is None else count[2]  # the forward's sum (written with smoothing)
    big_p = a * ((1 - eps) * w_y + eps * w_sum / vocab) + b * (2 * z_loss_scale) * lse
    one_hot = a * (1 - eps) * w_y
    uniform = a * eps / vocab
    if upstream is not None:
        big_p = big_p + upstream["lse"]
        if "logprob" in upstream:
            logprob_grad = torch.where(p.valid, upstream["logprob"], torch.zeros_like(lse))
            big_p, one_hot = big_p - logprob_grad, one_hot - logprob_grad
        if "entropy" in upstream:
            mean_logit = lse - rows["entropy"]
    need_hidden, need_weight, need_bias = wanted
    add_weight, add_bias = _bridge.accumulated(wanted, accumulators)
    grad_hidden = torch.zeros_like(p.x) if need_hidden else None
    grad_weight = None if not need_weight or add_weight else torch.empty_like(p.weight)
    grad_bias = None if not need_bias or add_bias else torch.empty_like(p.bias)
    # Per chunk, in place where it can be: u, p (becoming dz), du/dz with a softcap, and the entropy's
    # term with its gradient: at most four [N, chunk] tensors.
    for v0, v1 in p.chunks:
        u, slope = p.logits(v0, v1, slope=True)
        prob = torch.sub(u, lse[:, None]).exp_()
        entropy_term = None
        if upstream is not None and "entropy" in upstream:  # r_H p_v (u_v - S)
            entropy_term = u.sub_(mean_logit[:, None]).mul_(prob).mul_(upstream["entropy"][:, None])
        del u
        dz = prob.mul_(big_p[:, None])
        if entropy_term is not None:
            dz.sub_(entropy_term)
            del entropy_term
        if eps:
            w = p.weights(v0, v1)
            dz.addr_(uniform, torch.ones(v1 - v0, dtype=dtype) if w is None else w, alpha=-1)
        hit_rows, hit_columns = p.hits(v0, v1)
        dz[hit_rows, hit_columns] -= one_hot[hit_rows]
        if slope is not None:
            dz.mul_(slope)
            del slope
        elif p.temperature != 1.0:
            dz.div_(p.temperature)
        if need_hidden:
            grad_hidden += dz @ p.weight[v0:v1].to(dtype)
        if need_weight:
            chunk = dz.t() @ p.x
            if add_weight:
                accumulators[0][v0:v1] += chunk.to(accumulators[0].dtype)
            else:
                grad_weight[v0:v1] = chunk
        if need_bias:
            if add_bias:
                accumulators[1][v0:v1] += dz.sum(dim=0).to(accumulators[1].dtype)
            else:
                grad_bias[v0:v1] = dz.sum(dim=0)
    grads = (None if grad_hidden is None else grad_hidden.to(p.input_dtype), grad_weight, grad_bias)
    return tuple(p.x.new_empty(0, dtype=p.input_dtype) if g is None else g for g in grads)

