"""The temperature, the z-loss, label smoothing, class weights and token scaling, alone and together: lfce against
an fp64 reference written here from the definitions, independent of the kernels and of
checks.reference:

    u = c * tanh(z / c) (with a softcap c), then u / T;
    loss = F.cross_entropy(u, y, weight=w, label_smoothing=eps, ignore_index, reduction)
           + s * logsumexp(u_i)**2 of each counted token, reduced as the loss ("mean": / the count)

differentiated by autograd; with token scaling (Liger-Kernel's use_token_scaling) each counted
token's loss is first multiplied by its detached softmax(u_i)[y_i]. So "mean" divides the (weighted, smoothed) cross-entropy by the sum of
the counted tokens' class weights (PyTorch's) and the z-loss by their count (Liger-Kernel's).

The options are strong here (T = 0.6 or 1.7 against logits of std 2.5, s = 0.05 or 0.2 where LSE
is 12 to 14, c = 3), so that a kernel that ignores one, or drops its term of the gradient, misses
by far more than the tolerance: each test checks that the reference without each option is more
than 10x the tolerance away (checked on the CPU for bf16: 12x to 120x). PaLM's s = 1e-4 runs at V = 256000. V = 64007 is a multiple of no
tile; bias on and off covers both forms of the sm_90a forward epilogue (registers without a
bias, staged with one). With LFCE_DEVICE_ARCH=sm_80 the same tests run the mma.sync path.

Label smoothing and class weights barely move a mean loss over random targets (the smoothed
term's mean is the plain one's; weights independent of the loss average out), so their tests
use predicted_inputs: every other counted token's target is the class its logits rank first
(as a trained model's), and the weights favour those classes. Each option then moves the loss
and grad_hidden by more than 10x the tolerance (checked in each test, as above).
"""

import pytest
import torch
import torch.nn.functional as F
from checks import (
    GRAD,
    LOSS,
    assert_bitwise_equal,
    assert_close,
    assert_gradients_match,
    make_inputs,
    shifted_problem,
    upstream,
)

import lfce

pytestmark = pytest.mark.gpu

IGNORE = -100
# name: (LossOptions keywords, bias)
CASES = {
    "temperature": ({"temperature": 0.6}, True),
    "z_loss": ({"z_loss_scale": 0.05}, False),
    # the capped softmax is flatter: s = 0.05 would not matter enough
    "softcap_z_loss": ({"softcap": 3.0, "z_loss_scale": 0.2}, True),
    "temperature_softcap": ({"softcap": 3.0, "temperature": 0.6}, False),
    "all": ({"softcap": 3.0, "temperature": 1.7, "z_loss_scale": 0.2}, True),
}


def options_reference(x, w, b, y, reduction, grad, softcap=None, temperature=1.0, z_loss_scale=0.0,
                      label_smoothing=0.0, class_weight=None, token_scaling=False):
    """fp64 (loss, grad_hidden, grad_weight, grad_bias) and the z-loss term alone, reduced as the loss."""
    x64 = x.detach().double().requires_grad_()
    w64 = w.detach().double().requires_grad_()
    b64 = None if b is None else b.detach().double().requires_grad_()
    logits = F.linear(x64, w64, b64)
    if softcap is not None:
        logits = softcap * torch.tanh(logits / softcap)
    logits = logits / temperature
    counted = y != IGNORE
    weight = None if class_weight is None else class_weight.double()
    ce = F.cross_entropy(logits, y.long(), weight=weight, ignore_index=IGNORE, label_smoothing=label_smoothing,
                         reduction="none" if token_scaling else reduction)
    z_loss = torch.where(counted, z_loss_scale * torch.logsumexp(logits, dim=-1) ** 2, torch.zeros_like(logits[:, 0]))
    if token_scaling:
        target = torch.where(counted, y.long(), 0)
        scale = torch.where(counted, logits.softmax(-1).gather(1, target[:, None])[:, 0], 0.0).detach()
        ce, z_loss = ce * scale, z_loss * scale
        if reduction != "none":  # "mean": the cross-entropy over the sum of w_y (the count without weights)
            counted_weight = counted.double() if weight is None else torch.where(counted, weight[target], 0.0)
            ce = ce.sum() / (counted_weight.sum() if reduction == "mean" else 1.0)
    if reduction != "none":
        z_loss = z_loss.sum() / (counted.sum().double() if reduction == "mean" else 1.0)
    loss = ce + z_loss
    loss.backward(grad.double())
    return (loss.detach(), x64.grad, w64.grad, None if b is None else b64.grad), z_loss.detach()


def run(x, w, b, y, reduction, grad, **options):
    """lfce's (loss, grad_hidden, grad_weight, grad_bias) and z-loss, for leaf copies of the inputs."""
    x, w = (t.detach().clone().requires_grad_() for t in (x, w))
    b = None if b is None else b.detach().clone().requires_grad_()
    loss, z_loss = lfce.linear_cross_entropy(x, w, y, b, reduction=reduction, return_z_loss=True, **options)
    loss.backward(grad)
    return (loss.detach(), x.grad, w.grad, None if b is None else b.grad), z_loss


def rel_l2(a, b):
    a, b = a.double(), b.double()
    return float((a - b).norm() / b.norm())


NO_OPTION = {"softcap": None, "temperature": 1.0, "z_loss_scale": 0.0, "label_smoothing": 0.0, "class_weight": None,
             "token_scaling": False}


def assert_each_option_matters(x, w, b, y, reduction, grad, dtype, ref, **options):
    """The reference without each option set is far outside the tolerances (loss and grad_hidden)."""
    for name, value in options.items():
        none = NO_OPTION[name]
        if value is none or (not isinstance(value, torch.Tensor) and value == none):
            continue
        without, _ = options_reference(x, w, b, y, reduction, grad, **{**options, name: none})
        assert rel_l2(without[0], ref[0]) > 10 * LOSS[dtype].rel_l2, f"{name} barely changes the loss here"
        assert rel_l2(without[1], ref[1]) > 10 * GRAD[dtype].rel_l2, f"{name} barely changes grad_hidden here"


@pytest.mark.parametrize("case", list(CASES))
@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float32], ids=["bf16", "fp32"])
@pytest.mark.parametrize("reduction", ["mean", "sum", "none"])
@pytest.mark.parametrize("mode", ["recompute", "eager"])
def test_options_match_an_fp64_reference(mode, reduction, dtype, case, record_error):
    given, bias = CASES[case]
    loss_options = lfce.LossOptions(**given)  # the options not given at their "off" values (temperature 1.0, ...)
    options = {name: getattr(loss_options, name) for name in ("softcap", "temperature", "z_loss_scale")}
    x, w, b, y = make_inputs(300, 512, 64007, dtype, bias=bias)
    grad = upstream(reduction, y.shape, dtype)  # per token for "none", not uniform
    ours, z_ours = run(x, w, b, y, reduction, grad, mode=mode, **options)
    ref, z_ref = options_reference(x, w, b, y, reduction, grad, **options)
    assert_gradients_match(ours, ref, dtype, reduction, record_error)
    if options["z_loss_scale"]:
        assert_close(f"z_loss ({reduction})", z_ours, z_ref, LOSS[dtype], record_error)
    else:
        assert int(torch.count_nonzero(z_ours)) == 0, "z-loss without a z_loss_scale"
    assert_each_option_matters(x, w, b, y, reduction, grad, dtype, ref, **options)


def predicted_inputs(n, h, v, dtype, bias, every=2, device="cuda"):
    """make_inputs (every fifth token ignored) with the target of every ``every``-th counted token the
    class its logits rank first (cross-entropy about 3 instead of 14), and class weights [V] (fp32)
    in [0.25, 2.25), those of the predicted targets' classes 2 and of the other targets' 0.5."""
    x, w, b, y = make_inputs(n, h, v, dtype, bias=bias, device=device)
    logits = F.linear(x.float(), w.float(), None if b is None else b.float())
    counted = y != IGNORE
    predicted = counted & (torch.arange(n, device=device) % every == 0)
    y = torch.where(predicted, logits.argmax(dim=-1), y)
    weights = torch.rand(v, device=device, generator=torch.Generator(device=device).manual_seed(7)) * 2 + 0.25
    weights[y[counted & ~predicted]] = 0.5
    weights[y[predicted]] = 2.0
    return x, w, b, y, weights


# name: (options, bias, every how many counted tokens a target is predicted); every case has ignored
# tokens; "class_weight": True stands for predicted_inputs' weights. The weights matter to "mean" as the
# predicted and the other tokens' losses differ (every = 2); label smoothing most where all are
# predicted (every = 1), which the softcap's flattened logits need. Dropping any one option moves
# the bf16 reference by 14x to 130x the loss tolerance and grad_hidden by 24x to 780x (measured
# on the CPU with these shapes).
WEIGHTED_CASES = {
    "label_smoothing": ({"label_smoothing": 0.2}, False, 1),
    "class_weight": ({"class_weight": True}, True, 2),
    "smoothing_class_weight": ({"label_smoothing": 0.2, "class_weight": True}, False, 2),
    "class_weight_z_loss": ({"class_weight": True, "z_loss_scale": 0.05}, True, 2),  # two "mean" denominators
    "smoothing_softcap": ({"label_smoothing": 0.2, "softcap": 7.0}, True, 1),
}


def weighted_case(case, n, h, v, dtype, device="cuda"):
    """(x, w, b, y) and the options of a WEIGHTED_CASES entry, with its class weights."""
    options, bias, every = WEIGHTED_CASES[case]
    x, w, b, y, weights = predicted_inputs(n, h, v, dtype, bias, every, device)
    return (x, w, b, y), {**options, "class_weight": weights if options.get("class_weight") else None}


@pytest.mark.parametrize("case", list(WEIGHTED_CASES))
@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float32], ids=["bf16", "fp32"])
@pytest.mark.parametrize("reduction", ["mean", "sum", "none"])
@pytest.mark.parametrize("mode", ["recompute", "eager"])
def test_smoothing_and_class_weights_match_pytorchs_cross_entropy(mode, reduction, dtype, case, record_error):
    inputs, options = weighted_case(case, 300, 512, 64007, dtype)
    check_predicted_case(inputs, options, mode, reduction, dtype, record_error)


def check_predicted_case(inputs, options, mode, reduction, dtype, record_error):
    """lfce's loss, gradients and z-loss against options_reference (a per-token upstream gradient
    for "none"), and each option far from the tolerance."""
    x, w, b, y = inputs
    grad = upstream(reduction, y.shape, dtype)
    ours, z_ours = run(x, w, b, y, reduction, grad, mode=mode, **options)
    ref, z_ref = options_reference(x, w, b, y, reduction, grad, **options)
    assert_gradients_match(ours, ref, dtype, reduction, record_error)
    if options.get("z_loss_scale"):
        assert_close(f"z_loss ({reduction})", z_ours, z_ref, LOSS[dtype], record_error)
    assert_each_option_matters(x, w, b, y, reduction, grad, dtype, ref, **options)


# name: (options, bias, every how many counted tokens a target is predicted), as WEIGHTED_CASES: with
# random targets at V = 64007 every p(target) is about 1e-6; predicted targets spread the scales
# over several decades, so a kernel that scales the wrong token or not at all misses by far.
TOKEN_SCALING_CASES = {
    "token_scaling": ({}, False, 2),
    "z_loss": ({"z_loss_scale": 0.05}, True, 2),
    "softcap_z_loss": ({"softcap": 7.0, "z_loss_scale": 0.05}, True, 1),
    "smoothing_class_weight": ({"label_smoothing": 0.2, "class_weight": True}, False, 2),
}


@pytest.mark.parametrize("case", list(TOKEN_SCALING_CASES))
@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float32], ids=["bf16", "fp32"])
@pytest.mark.parametrize("reduction", ["mean", "sum", "none"])
@pytest.mark.parametrize("mode", ["recompute", "eager"])
def test_token_scaling_matches_an_fp64_reference(mode, reduction, dtype, case, record_error):
    options, bias, every = TOKEN_SCALING_CASES[case]
    x, w, b, y, weights = predicted_inputs(300, 512, 64007, dtype, bias, every)
    options = {**options, "class_weight": weights if options.get("class_weight") else None, "token_scaling": True}
    check_predicted_case((x, w, b, y), options, mode, reduction, dtype, record_error)


# Each option alone at the large vocabulary, with values that move the loss and gradients far past
# the tolerances there (assert_each_option_matters checks it).
LARGE_VOCABULARY_OPTIONS = {
    "softcap": {"softcap": 3.0},
    "temperature": {"temperature": 0.6},
    "z_loss": {"z_loss_scale": 0.05},
    "label_smoothing": {"label_smoothing": 0.2},
    "class_weight": {"class_weight": True},
    "token_scaling": {"token_scaling": True},
}


# fp32 with softcap 3 checks the cap's slope where it saturates: taken as 1 - t^2 from t = tanh, its
# relative error grows as t nears 1 and grad_weight rows of rare classes came out 1.39e-4 from fp64
# (docs/measurements.md#softcap-slope); the kernels take it as s (2 - s), s = 2 / (e^(2|x|) + 1)
# (template_util.h capped_logit_with_slope).
LARGE_VOCABULARY_CASES = [(dtype, option) for dtype in ("bf16", "fp32") for option in LARGE_VOCABULARY_OPTIONS]


@pytest.mark.parametrize("dtype_name,option", LARGE_VOCABULARY_CASES)
@pytest.mark.parametrize("reduction", ["mean", "sum", "none"])
@pytest.mark.parametrize("mode", ["recompute", "eager"])
def test_each_option_alone_at_a_large_vocabulary(mode, reduction, dtype_name, option, record_error):
    dtype = {"bf16": torch.bfloat16, "fp32": torch.float32}[dtype_name]
    x, w, b, y, weights = predicted_inputs(64, 256, 256000, dtype, bias=True)
    options = dict(LARGE_VOCABULARY_OPTIONS[option])
    if options.get("class_weight"):
        options["class_weight"] = weights
    check_predicted_case((x, w, b, y), options, mode, reduction, dtype, record_error)


# The named option combinations at the large vocabulary, in the whole matrix (the outputs' two are in
# test_gpu_extra_outputs.py): softcap with z-loss, and label smoothing with class weights (every fifth
# token ignored, predicted_inputs). With z_loss_scale 0.05 beside softcap 3, dropping the cap moved the
# bf16 "mean" loss by only 7x its tolerance (their changes partly cancel;
# docs/measurements.md#option-combinations); 0.2, as at V = 64007, moves each by 34x or more (fp64
# reference on the CPU).
LARGE_VOCABULARY_COMBINATIONS = {
    "softcap_z_loss": {"softcap": 3.0, "z_loss_scale": 0.2},
    "smoothing_class_weight": {"label_smoothing": 0.2, "class_weight": True},
}


@pytest.mark.parametrize("case", list(LARGE_VOCABULARY_COMBINATIONS))
@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float32], ids=["bf16", "fp32"])
@pytest.mark.parametrize("reduction", ["mean", "sum", "none"])
@pytest.mark.parametrize("mode", ["recompute", "eager"])
def test_option_combinations_at_a_large_vocabulary(mode, reduction, dtype, case, record_error):
    x, w, b, y, weights = predicted_inputs(64, 256, 256000, dtype, bias=True)
    options = dict(LARGE_VOCABULARY_COMBINATIONS[case])
    if options.get("class_weight"):
        options["class_weight"] = weights
    check_predicted_case((x, w, b, y), options, mode, reduction, dtype, record_error)


@pytest.mark.parametrize("vocab", [64007, 256000])
@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float32], ids=["bf16", "fp32"])
@pytest.mark.parametrize("reduction", ["mean", "sum", "none"])
@pytest.mark.parametrize("mode", ["recompute", "eager"])
def test_shift_matches_the_shifted_problem(mode, reduction, dtype, vocab, record_error):
    """shift=True on hidden [B, T, H] and targets [B, T] against the fp64 reference of position t
    scored against target t + 1 (the last position of each sequence against nothing: no loss, no
    gradient), a non-uniform per-token upstream gradient for "none", a few targets ignored."""
    batch, length, h = 3, 40, 256
    x, w, b, y = make_inputs(batch * length, h, vocab, dtype, bias=True)
    hidden, targets = x.reshape(batch, length, h), y.reshape(batch, length)
    # A class at each sequence's last position (make_inputs ignores every fifth token, these among
    # them): the shift must ignore the position itself, not rely on its target.
    targets[:, -1] = 3
    grad = upstream(reduction, (batch, length), dtype)
    x_leaf, w_leaf, b_leaf = (t.detach().clone().requires_grad_() for t in (hidden, w, b))
    loss = lfce.linear_cross_entropy(x_leaf, w_leaf, targets, b_leaf, reduction=reduction, mode=mode, shift=True)
    assert tuple(loss.shape) == ((batch, length) if reduction == "none" else ())
    loss.backward(grad)
    if reduction == "none":
        assert int(torch.count_nonzero(loss[:, -1])) == 0, "the last position has no target but got a loss"
    assert int(torch.count_nonzero(x_leaf.grad[:, -1])) == 0, "the last position has no target but got a gradient"
    shifted_x, shifted_y = shifted_problem(hidden, targets)
    ref_grad = grad[:, :-1].reshape(-1) if reduction == "none" else grad
    ref, _ = options_reference(shifted_x, w, b, shifted_y, reduction, ref_grad)
    ours = (loss.detach()[:, :-1].reshape(-1) if reduction == "none" else loss.detach(),
            x_leaf.grad[:, :-1].reshape(-1, h), w_leaf.grad, b_leaf.grad)
    assert_gradients_match(ours, ref, dtype, reduction, record_error)


@pytest.mark.parametrize("length", [1, 40, 240])
@pytest.mark.parametrize("targets_dtype", [torch.int64, torch.int32], ids=["i64", "i32"])
@pytest.mark.parametrize("reduction", ["mean", "none"])
@pytest.mark.parametrize("mode", ["recompute", "eager"])
def test_shift_is_bitwise_the_problem_of_the_shifted_targets(mode, reduction, targets_dtype, length):
    """shift=True reads target t + 1 in place; the same call on a shifted copy of the targets
    (ignore_index at each sequence's last position) runs the same arithmetic, so every output and
    gradient is bitwise equal, with every option that reads a target (smoothing, class weights,
    z-loss, token scaling, logprob, accuracy, predicted) and sequences that do not line up with
    the kernels' row blocks (T = 40), one per token (T = 1: nothing counted) and one in all."""
    n, h, vocab = 240, 256, 64007
    x, w, b, y, weights = predicted_inputs(n, h, vocab, torch.bfloat16, bias=True)
    targets = y.to(targets_dtype).reshape(-1, length)
    targets[:, -1] = 3  # a class there (make_inputs ignores these): the shift itself must ignore it
    padded = F.pad(targets[:, 1:], (0, 1), value=IGNORE)
    grad = upstream(reduction, (n // length, length), torch.bfloat16)
    # (logprob's gradient would make "eager" recompute)
    options = {"reduction": reduction, "mode": mode, "label_smoothing": 0.1, "class_weight": weights,
               "z_loss_scale": 1e-3, "token_scaling": True, "return_z_loss": True, "return_logprob": mode == "recompute",
               "return_accuracy": True, "return_predicted": True}

    def call(labels, shift):
        leaves = [t.detach().clone().reshape(-1, length, h) if t is x else t.detach().clone() for t in (x, w, b)]
        leaves = [t.requires_grad_() for t in leaves]
        out = lfce.linear_cross_entropy(*leaves[:2], labels, leaves[2], shift=shift, **options)
        (out.loss * grad).sum().backward()
        return out, [t.grad for t in leaves]

    ours, our_grads = call(targets, True)
    theirs, their_grads = call(padded, False)
    for name in ("loss", "z_loss", "logprob", "accuracy", "predicted"):
        a, b_ = getattr(ours, name), getattr(theirs, name)
        if a is None and b_ is None:
            continue
        assert torch.equal(a, b_) or (a.isnan().all() and b_.isnan().all()), f"{name} differs with shift=True"
    for name, a, b_ in zip(("hidden", "weight", "bias"), our_grads, their_grads):
        assert torch.equal(a, b_), f"grad_{name} differs with shift=True"
    if length == 1:  # nothing counted: the mean is NaN, every gradient 0
        assert all(int(torch.count_nonzero(g)) == 0 for g in our_grads)
    else:
        assert int(torch.count_nonzero(our_grads[0][:, -1])) == 0 and int(torch.count_nonzero(our_grads[0])) > 0


def test_smoothing_class_weights_and_z_loss_at_a_large_vocabulary(record_error):
    x, w, b, y, weights = predicted_inputs(128, 256, 256000, torch.bfloat16, bias=False)
    grad = upstream("mean", (), torch.bfloat16)
    options = {"label_smoothing": 0.1, "class_weight": weights, "z_loss_scale": 1e-4, "softcap": 30.0}
    ours, z_ours = run(x, w, b, y, "mean", grad, **options)
    ref, z_ref = options_reference(x, w, b, y, "mean", grad, **options)
    assert_gradients_match(ours, ref, torch.bfloat16, "mean", record_error)
    assert_close("z_loss (mean)", z_ours, z_ref, LOSS[torch.bfloat16], record_error)


def test_palm_z_loss_with_a_temperature_at_a_large_vocabulary(record_error):
    x, w, b, y = make_inputs(128, 256, 256000, torch.bfloat16, bias=False)
    grad = upstream("mean", (), torch.bfloat16)
    options = {"softcap": 30.0, "temperature": 0.8, "z_loss_scale": 1e-4}
    ours, z_ours = run(x, w, b, y, "mean", grad, **options)
    ref, z_ref = options_reference(x, w, b, y, "mean", grad, **options)
    assert_gradients_match(ours, ref, torch.bfloat16, "mean", record_error)
    assert_close("z_loss (mean)", z_ours, z_ref, LOSS[torch.bfloat16], record_error)


def test_z_loss_of_every_ignored_token_is_zero_and_all_ignored_gives_nan():
    x, w, _, y = make_inputs(40, 256, 5000, torch.bfloat16, ignore="all")
    loss, z_loss = lfce.linear_cross_entropy(x, w, y, reduction="none", z_loss_scale=0.05, return_z_loss=True)
    assert int(torch.count_nonzero(loss)) == 0 and int(torch.count_nonzero(z_loss)) == 0
    loss, z_loss = lfce.linear_cross_entropy(x, w, y, z_loss_scale=0.05, return_z_loss=True)
    assert torch.isnan(loss) and torch.isnan(z_loss), "mean over no counted token is NaN, as PyTorch's"
    weights = torch.rand(5000, device="cuda") + 0.5
    options = {"label_smoothing": 0.1, "class_weight": weights}
    loss = lfce.linear_cross_entropy(x, w, y, reduction="none", **options)
    assert int(torch.count_nonzero(loss)) == 0, "an ignored token's smoothed, weighted loss is not 0"
    assert torch.isnan(lfce.linear_cross_entropy(x, w, y, **options)), "mean over no class weight is NaN"


@pytest.mark.parametrize("mode", ["recompute", "eager"])
@pytest.mark.parametrize("target_terms", [False, True], ids=["logit_options", "smoothing_and_class_weights"])
def test_options_are_deterministic_and_independent_of_the_vocab_chunk(mode, target_terms):
    """Run to run bit-identical; with a narrower chunk, grad_weight and grad_bias bit-identical
    (each row is computed whole inside one chunk) and grad_hidden within fp32 reassociation.
    Softcap, temperature and z-loss; or label smoothing and class weights with a z-loss and a softcap."""
    if target_terms:
        x, w, b, y, weights = predicted_inputs(64, 2304, 151937, torch.bfloat16, bias=True)
        options = {"softcap": 10.0, "z_loss_scale": 0.05, "label_smoothing": 0.2, "class_weight": weights}
    else:
        x, w, b, y = make_inputs(64, 2304, 151937, torch.bfloat16, bias=True)
        options = {"softcap": 3.0, "temperature": 1.7, "z_loss_scale": 0.05}
    grad = upstream("mean", (), torch.bfloat16)
    first, z_first = run(x, w, b, y, "mean", grad, mode=mode, **options)
    again, z_again = run(x, w, b, y, "mean", grad, mode=mode, **options)
    for name, a, e in zip(("loss", "grad_hidden", "grad_weight", "grad_bias", "z_loss"), again + (z_again,),
                          first + (z_first,)):
        assert_bitwise_equal(name, a, e)
    chunked, _ = run(x, w, b, y, "mean", grad, chunk_size=256, mode=mode, **options)
    assert_bitwise_equal("loss", chunked[0], first[0])
    assert_bitwise_equal("grad_weight", chunked[2], first[2])
    assert_bitwise_equal("grad_bias", chunked[3], first[3])
    assert rel_l2(chunked[1], first[1]) < 1e-2


def test_problems_that_differ_only_in_an_option_get_their_own_kernels():
    """Same shapes, one option changed at a time: each loss differs (the plan cache keys on the
    options), and the plain problem's loss is the same before and after."""
    x, w, _, y = make_inputs(96, 256, 5000, torch.bfloat16)
    plain = lfce.linear_cross_entropy(x, w, y)
    losses = {"plain": plain}
    weights = torch.rand(5000, device="cuda") + 0.5
    for name, options in (("temperature", {"temperature": 0.7}), ("z_loss", {"z_loss_scale": 1e-3}),
                          ("temperature_z_loss", {"temperature": 0.7, "z_loss_scale": 1e-3}),
                          ("label_smoothing", {"label_smoothing": 0.1}), ("class_weight", {"class_weight": weights}),
                          ("smoothing_class_weight", {"label_smoothing": 0.1, "class_weight": weights})):
        losses[name] = lfce.linear_cross_entropy(x, w, y, **options)
    values = {name: float(loss) for name, loss in losses.items()}
    assert len(set(values.values())) == len(values), f"two problems shared a result: {values}"
    assert_bitwise_equal("plain loss after the others", lfce.linear_cross_entropy(x, w, y), plain)


def test_options_reach_the_module_and_liger_kernels_entry_points():
    from lfce.compat import liger

    x, w, b, y = make_inputs(96, 256, 5000, torch.bfloat16, bias=True)
    for reduction in ("mean", "sum", "none"):
        expected = lfce.linear_cross_entropy(x, w, y, b, reduction=reduction, softcap=30.0, z_loss_scale=1e-3,
                                             return_z_loss=True)
        module = lfce.LinearCrossEntropyLoss(reduction=reduction, softcap=30.0, z_loss_scale=1e-3, return_z_loss=True)
        for name, got in (
                ("module", module(x, w, y, b)),
                ("liger", liger.liger_fused_linear_cross_entropy(x, w, y, b, reduction=reduction, softcap=30.0,
                                                                 lse_square_scale=1e-3, return_z_loss=True)),
                ("liger module", liger.LigerFusedLinearCrossEntropyLoss(
                    reduction=reduction, softcap=30.0, lse_square_scale=1e-3, return_z_loss=True)(w, x, y, b))):
            loss, z_loss = (got.loss, got.z_loss) if name.startswith("liger") else got
            assert_bitwise_equal(f"{name} loss ({reduction})", loss, expected[0])
            assert_bitwise_equal(f"{name} z_loss ({reduction})", z_loss, expected[1])
        t = lfce.LinearCrossEntropyLoss(reduction=reduction, temperature=0.7)(x, w, y, b)
        assert_bitwise_equal(f"module temperature ({reduction})", t,
                             lfce.linear_cross_entropy(x, w, y, b, reduction=reduction, temperature=0.7))
        weights = torch.rand(5000, device="cuda", dtype=torch.float64) + 0.5  # used as fp32
        expected = lfce.linear_cross_entropy(x, w, y, b, reduction=reduction, label_smoothing=0.1,
                                             class_weight=weights.float())
        module = lfce.LinearCrossEntropyLoss(reduction=reduction, label_smoothing=0.1, class_weight=weights)
        for name, got in (
                ("module", module(x, w, y, b)),
                ("liger", liger.liger_fused_linear_cross_entropy(x, w, y, b, ce_weight=weights, label_smoothing=0.1,
                                                                 reduction=reduction)),
                ("liger module", liger.LigerFusedLinearCrossEntropyLoss(
                    ce_weight=weights, label_smoothing=0.1, reduction=reduction)(w, x, y, b))):
            assert_bitwise_equal(f"{name} smoothed, weighted loss ({reduction})", got, expected)


@pytest.mark.parametrize("mode", ["recompute", "eager"])
def test_z_loss_at_a_large_lse_is_refused_in_fp16_and_matches_fp64_in_bf16(mode, record_error):
    # fp16's dz scale bounds |p - onehot| by 1; the z-loss multiplies p by 1 + 2 s LSE (here 1 + 2 * 0.05 * ~40 = 5),
    # which overflowed dz to inf: the library refuses fp16 with a z-loss, and bf16 (the fix it names) stays exact.
    x, w, b, y = make_inputs(256, 256, 5000, torch.bfloat16, bias=True)
    b.data += 40.0  # every logit + 40: LSE about 40 + log V
    grad = upstream("mean", (), torch.bfloat16)
    with pytest.raises(ValueError, match=r"z_loss_scale=0.05 is not supported with torch.float16.*"
                                         r"use torch.bfloat16 or torch.float32"):
        run(x.half(), w.half(), b.half(), y, "mean", grad.half(), z_loss_scale=0.05, mode=mode)
    ours, z_ours = run(x, w, b, y, "mean", grad, z_loss_scale=0.05, mode=mode)
    for name, value in zip(("loss", "grad_hidden", "grad_weight", "grad_bias"), ours):
        assert bool(torch.isfinite(value).all()), f"{name} is not finite at LSE ~ 40 with z_loss_scale 0.05"
    ref, z_ref = options_reference(x, w, b, y, "mean", grad, z_loss_scale=0.05)
    assert_gradients_match(ours, ref, torch.bfloat16, "mean", record_error)
    assert_close("z_loss (mean)", z_ours, z_ref, LOSS[torch.bfloat16], record_error)
