"""An unchunked model of the operators lfce::forward / lfce::backward in plain PyTorch, written from
lfce.h's definitions independently of lfce's CPU implementation (python/lfce/_cpu.py), which the
CPU tests compare with it operator output by operator output (test_cpu_path.py): the lse rows, the
counts, eager mode's gradients, a direct backward call with grad_lse.

It computes from the whole [N, V] logits in fp32: the forward's LSE reused in
the backward, each gradient rounded once to its input's dtype, or added into its accumulator.
With token scaling lse is [2N] as lfce.h has it: the LSEs, then each token's scale p(target) (0 for
ignored tokens), which multiplies that token's loss and gradient. The extra outputs (lfce.h's
lfce_output flags) add the entropy and logprob rows to lse and fill predicted; the backward adds
grad_lse's terms to dz (dLSE/du = p, dH/du = -p (u - S) with S = LSE - H from the saved rows,
dlogp_y/du = onehot(y) - p for counted tokens) before the softcap and temperature slope.
"""

import torch
import torch.nn.functional as F

from lfce import _lib, _ops


def _logits(hidden, weight, bias):
    return F.linear(hidden.float(), weight.float(), None if bias is None else bias.float())


def _softmax_logits(hidden, weight, bias, softcap, temperature):
    """The logits the softmax sees (capped, then / T) and d them / d logits."""
    logits = _logits(hidden, weight, bias)
    slope = torch.ones_like(logits)
    if softcap is not None:
        capped = torch.tanh(logits / softcap)
        logits, slope = softcap * capped, 1 - capped * capped
    return logits / temperature, slope / temperature


def _class_weights(class_weight, vocab):
    return torch.ones(vocab) if class_weight is None else class_weight


def _rows(lse, n, token_scaling, outputs):
    """lse [rows * N] as {name: [N] row} (lfce.h's order), the rows present only."""
    names = ["lse"] + ["scale"] * bool(token_scaling) + ["entropy"] * bool(outputs & _lib.OUTPUT_ENTROPY)
    names += ["logprob"] * bool(outputs & _lib.OUTPUT_LOGPROB)
    return dict(zip(names, lse.reshape(len(names), n)))


def _grads(hidden, weight, bias, targets, class_weight, lse, count, grad_loss, ignore_index, reduction, options,
           grad_lse=None, outputs=0):
    """fp32 (grad_hidden, grad_weight, grad_bias) from dz_v = (P p_v - T [v = y] - U w_v) * slope per
    row, the constants as lfce's (docs/design.md): P = a ((1 - eps) w_y + eps W / V) + b 2 s LSE,
    T = a (1 - eps) w_y, U = a eps / V; a scales the cross-entropy (the upstream gradient, / sum of
    w_y for mean, times the token's scale with token scaling), b the z-loss (/ the count, likewise).
    With grad_lse, its rows' terms are added before the slope (see the module docstring)."""
    softcap, temperature, z_loss_scale, eps, token_scaling = options
    logits, slope = _softmax_logits(hidden, weight, bias, softcap, temperature)
    vocab = weight.shape[0]
    valid = targets != ignore_index
    target = torch.where(valid & (targets >= 0) & (targets < vocab), targets, 0).long()
    w = _class_weights(class_weight, vocab)
    w_sum = count[2] if class_weight is not None else vocab  # the forward's sum (written with smoothing)
    g = grad_loss.float().expand(hidden.shape[0]) if grad_loss is not None else torch.ones(hidden.shape[0])
    n = hidden.shape[0]
    rows = _rows(lse, n, token_scaling, outputs)
    lse, scale = rows["lse"], rows.get("scale", torch.ones(n))
    a = b = g * valid * scale
    if reduction == "mean":
        a, b = a / (count[1] if class_weight is not None else count[0]), b / count[0]
    p = torch.exp(logits - lse[:, None])  # the forward's LSE, as lfce
    onehot = F.one_hot(target, vocab).float()
    big_p = a * ((1 - eps) * w[target] + eps * w_sum / vocab) + b * 2 * z_loss_scale * lse
    dz = big_p[:, None] * p - (a * (1 - eps) * w[target])[:, None] * onehot
    dz = dz - (a * eps / vocab)[:, None] * w[None, :]
    if grad_lse is not None:
        upstream = _rows(grad_lse, n, token_scaling, outputs)
        dz = dz + upstream["lse"][:, None] * p
        if "entropy" in rows:  # S = sum_v p_v u_v = LSE - H, from the forward's rows
            mean_logit = lse - rows["entropy"]
            dz = dz - upstream["entropy"][:, None] * p * (logits - mean_logit[:, None])
        if "logprob" in rows:
            dz = dz + (upstream["logprob"] * valid)[:, None] * (onehot - p)
    dz = dz * slope
    return dz @ weight.float(), dz.t() @ hidden.float(), dz.sum(0)


def _outputs(grads, hidden, weight, bias, wanted, accumulators=(None, None)):
    """The operators' gradient outputs: each wanted one in its input's dtype, or added into its
    accumulator (then [0], as one not wanted); [0] for the others."""
    out = []
    for g, like, want, accumulator in zip(grads, (hidden, weight, bias), wanted, (None,) + tuple(accumulators)):
        if want and like is not None and accumulator is not None:
            accumulator.add_(g)  # fp32, as the kernels add their fp32 sums
            want = False
        out.append(g.to(like.dtype) if want and like is not None else hidden.new_empty(0))
    return tuple(out)


def _shifted(targets, ignore_index, sequence_length):
    """The targets each position is scored against: with a causal shift over sequences of
    sequence_length tokens, the next position's, ignore_index for each sequence's last."""
    if not sequence_length:
        return targets
    return F.pad(targets.reshape(-1, sequence_length)[:, 1:], (0, 1), value=ignore_index).reshape(-1)


def forward_cpu(hidden, weight, bias, targets, class_weight, weight_grad_accumulator, bias_grad_accumulator,
                ignore_index, reduction, mode, chunk_size, workspace_budget, softcap, temperature, z_loss_scale,
                label_smoothing, token_scaling, need_hidden, need_weight, need_bias, outputs=0, sequence_length=0):
    targets = _shifted(targets, ignore_index, sequence_length)
    logits, _ = _softmax_logits(hidden, weight, bias, softcap, temperature)
    vocab = weight.shape[0]
    lse = logits.logsumexp(-1)
    valid = targets != ignore_index
    in_range = (targets >= 0) & (targets < vocab)
    target = torch.where(valid & in_range, targets, 0).long()
    w = _class_weights(class_weight, vocab)
    picked = logits.gather(1, target[:, None])[:, 0]
    smoothed = (w * (lse[:, None] - logits)).sum(-1) / vocab
    cross_entropy = torch.where(valid, (1 - label_smoothing) * w[target] * (lse - picked)
                                + label_smoothing * smoothed, torch.zeros_like(lse))
    z_loss = torch.where(valid, z_loss_scale * lse * lse, torch.zeros_like(lse))
    if token_scaling:  # p(target), 0 for ignored tokens (lfce.h)
        scale = torch.where(valid, torch.exp(picked - lse), torch.zeros_like(lse))
        cross_entropy, z_loss = cross_entropy * scale, z_loss * scale
    count = valid.sum().float().reshape(1)
    if class_weight is not None:  # lfce.h: the count, the sum of w_y, the sum of w (with smoothing only)
        count = torch.stack([count[0], (w[target] * valid).sum(), w.sum() if label_smoothing else torch.tensor(0.0)])
    token_loss = cross_entropy + z_loss
    mean = cross_entropy.sum() / count[1 if class_weight is not None else 0] + z_loss.sum() / count[0]
    loss = {"none": token_loss, "sum": token_loss.sum(), "mean": mean}[reduction]
    eager = _ops._eager(mode, reduction, outputs)  # "none", entropy or logprob recompute, as in lfce
    wanted = (need_hidden, need_weight, need_bias) if eager else (False, False, False)
    rows = [lse, scale] if token_scaling else [lse]
    if outputs & _lib.OUTPUT_ENTROPY:  # -sum_v p_v log p_v = LSE - sum_v p_v u_v, every token
        rows.append(lse - (torch.exp(logits - lse[:, None]) * logits).sum(-1))
    if outputs & _lib.OUTPUT_LOGPROB:  # 0 for ignored tokens, NaN for a target outside [0, V)
        logprob = torch.where(valid, picked - lse, torch.zeros_like(lse))
        rows.append(torch.where(valid & ~in_range, torch.full_like(lse, float("nan")), logprob))
    predicted = torch.empty(0, dtype=torch.int64)
    if outputs & _lib.OUTPUT_PREDICTED:  # torch.argmax gives the first of equal maxima
        predicted = torch.where(valid, logits.argmax(-1), torch.full_like(targets, -1, dtype=torch.int64))
    lse = torch.cat(rows)
    options = (softcap, temperature, z_loss_scale, label_smoothing, token_scaling)
    grads = _grads(hidden, weight, bias, targets, class_weight, lse, count, None, ignore_index, reduction, options,
                   None, outputs)
    return (loss, lse, count) + _outputs(grads, hidden, weight, bias, wanted) + (predicted,)


def backward_cpu(hidden, weight, bias, targets, class_weight, lse, valid_count, grad_loss, weight_grad_accumulator,
                 bias_grad_accumulator, ignore_index, reduction, chunk_size, workspace_budget, softcap, temperature,
                 z_loss_scale, label_smoothing, token_scaling, need_hidden, need_weight, need_bias, grad_lse=None,
                 outputs=0, sequence_length=0):
    targets = _shifted(targets, ignore_index, sequence_length)
    _ops._check_lse(hidden, lse, grad_lse, token_scaling, outputs)  # the operator's own checks, as the CUDA one
    grads = _grads(hidden, weight, bias, targets, class_weight, lse, valid_count, grad_loss, ignore_index, reduction,
                   (softcap, temperature, z_loss_scale, label_smoothing, token_scaling), grad_lse, outputs)
    return _outputs(grads, hidden, weight, bias, (need_hidden, need_weight, need_bias),
                    (weight_grad_accumulator, bias_grad_accumulator))


def inputs(n, h=16, v=40, dtype=torch.float32, bias=False, seed=0):
    """Leaf (hidden, weight, bias or None, targets) on the CPU, every third target ignored."""
    g = torch.Generator().manual_seed(seed)
    x = torch.randn(n, h, generator=g).to(dtype).requires_grad_()
    w = (torch.randn(v, h, generator=g) / h ** 0.5).to(dtype).requires_grad_()
    b = torch.randn(v, generator=g).to(dtype).requires_grad_() if bias else None
    y = torch.randint(0, v, (n,), generator=g)
    y[::3] = -100
    return x, w, b, y
