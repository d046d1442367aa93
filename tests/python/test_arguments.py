"""Misuse is reported before any work, with a message that names the bad value.

One misuse per test. The Python checks run on CPU tensors: options, shapes and
dtypes are checked before the device, so no GPU is needed. The tests marked
``lib`` exercise the C library's own validation through ctypes (no GPU either).
"""

import ctypes
import re

import pytest
import torch

import lfce
from lfce import _bridge, _lib, _ops

N, H, V = 4, 16, 10


def inputs(n=N, h=H, v=V, dtype=torch.bfloat16):
    return torch.randn(n, h).to(dtype), torch.randn(v, h).to(dtype), torch.randint(0, v, (n,))


def raises(exception, *fragments):
    """pytest.raises matching every fragment literally, in order."""
    return pytest.raises(exception, match=".*".join(re.escape(f) for f in fragments))


# --- options -------------------------------------------------------------------------------

def test_bad_reduction_is_named():
    with raises(ValueError, "reduction", "'avg'"):
        lfce.linear_cross_entropy(*inputs(), reduction="avg")


def test_bad_mode_is_named():
    with raises(ValueError, "mode", "'lazy'"):
        lfce.linear_cross_entropy(*inputs(), mode="lazy")


def test_zero_chunk_size_is_named():
    with raises(ValueError, "chunk_size", "0"):
        lfce.linear_cross_entropy(*inputs(), chunk_size=0)


def test_negative_workspace_budget_is_named():
    with raises(ValueError, "workspace_budget", "-1"):
        lfce.linear_cross_entropy(*inputs(), workspace_budget=-1)


def test_float_ignore_index_is_named():
    with raises(TypeError, "ignore_index", "1.5"):
        lfce.linear_cross_entropy(*inputs(), ignore_index=1.5)


def test_chunk_size_too_wide_for_int64_is_named():
    with raises(ValueError, "chunk_size", str(2**64 + 1)):
        lfce.linear_cross_entropy(*inputs(), chunk_size=2**64 + 1)


def test_ignore_index_too_wide_for_int64_is_named():
    with raises(ValueError, "ignore_index", str(2**63)):
        lfce.linear_cross_entropy(*inputs(), ignore_index=2**63)


NAN, INF = float("nan"), float("inf")


@pytest.mark.parametrize("option, value, exception", [
    ("softcap", 0, ValueError), ("softcap", -1.0, ValueError), ("softcap", NAN, ValueError),
    ("softcap", INF, ValueError), ("softcap", 2e6, ValueError), ("softcap", "30", TypeError),
    ("softcap", True, TypeError),
    ("temperature", 0, ValueError), ("temperature", -1.0, ValueError), ("temperature", 1e-7, ValueError),
    ("temperature", NAN, ValueError), ("temperature", INF, ValueError), ("temperature", 2e6, ValueError),
    ("temperature", "0.7", TypeError), ("temperature", True, TypeError),
    ("z_loss_scale", -1e-4, ValueError), ("z_loss_scale", NAN, ValueError), ("z_loss_scale", INF, ValueError),
    ("z_loss_scale", -INF, ValueError), ("z_loss_scale", 2e6, ValueError), ("z_loss_scale", 2**1024, ValueError),
    ("z_loss_scale", "1e-4", TypeError), ("z_loss_scale", False, TypeError),
    ("label_smoothing", -0.1, ValueError), ("label_smoothing", 1.5, ValueError), ("label_smoothing", NAN, ValueError),
    ("label_smoothing", INF, ValueError), ("label_smoothing", -INF, ValueError), ("label_smoothing", 2, ValueError),
    ("label_smoothing", "0.1", TypeError), ("label_smoothing", True, TypeError),
    ("return_z_loss", 1, TypeError), ("return_z_loss", "yes", TypeError), ("return_z_loss", None, TypeError),
    ("shift", 1, TypeError), ("shift", "yes", TypeError), ("shift", None, TypeError),
    ("token_scaling", 1, TypeError), ("token_scaling", "yes", TypeError), ("token_scaling", None, TypeError)])
def test_bad_loss_option_is_named(option, value, exception):
    with raises(exception, option, repr(value)):
        lfce.linear_cross_entropy(*inputs(), **{option: value})
    with raises(exception, option, repr(value)):
        lfce.LinearCrossEntropyLoss(**{option: value})


@pytest.mark.parametrize("option, value", [("softcap", 1e-46), ("softcap", 2e-39), ("z_loss_scale", 1e-40),
                                           ("label_smoothing", 1e-45)])
def test_a_loss_option_that_float32_makes_zero_or_subnormal_is_named(option, value):
    # As a float32 the value would be 0 (the option silently off) or subnormal (NaN in the math).
    with raises(ValueError, option, "float32's smallest normal number", f"got {value!r}"):
        lfce.linear_cross_entropy(*inputs(), **{option: value})


def test_numpy_scalars_are_taken_as_options_and_reach_the_operator_as_python_values(monkeypatch):
    np = pytest.importorskip("numpy")
    seen = []
    monkeypatch.setattr(_ops, "forward", lambda args: seen.append(args) or (torch.zeros(()),))
    lfce.linear_cross_entropy(*inputs(), softcap=np.float32(30.0), temperature=np.float64(0.5),
                              z_loss_scale=np.float32(0.25), label_smoothing=np.float16(0.5),
                              token_scaling=np.True_, shift=np.False_, chunk_size=np.int64(64),
                              ignore_index=np.int32(-100))
    (args,) = seen
    assert args.ignore_index == -100 and type(args.ignore_index) is int
    assert args.chunk_size == 64 and type(args.chunk_size) is int
    options = (args.softcap, args.temperature, args.z_loss_scale, args.label_smoothing, args.token_scaling)
    assert options == (30.0, 0.5, 0.25, 0.5, True)
    assert [type(a) for a in options] == [float, float, float, float, bool]
    assert type(args.sequence_length) is int and args.sequence_length == 0  # shift=np.False_: no sequence length
    with raises(TypeError, "shift must be a bool", "str"):
        lfce.linear_cross_entropy(*inputs(), shift="no")


def test_label_smoothing_range_message_gives_the_bounds():
    with raises(ValueError, "label_smoothing must be None or a number in [0, 1]", "got 1.5"):
        lfce.linear_cross_entropy(*inputs(), label_smoothing=1.5)


@pytest.mark.parametrize("value", [0, 0.0, 1, 1.0, 0.1])
def test_label_smoothing_accepts_the_closed_range(value):
    assert torch.isfinite(lfce.linear_cross_entropy(*inputs(), label_smoothing=value))  # accepted: computed on the CPU


def test_bool_chunk_size_is_named():
    with raises(TypeError, "chunk_size", "True"):
        lfce.linear_cross_entropy(*inputs(), chunk_size=True)


def test_module_names_a_workspace_budget_too_wide_for_int64():
    with raises(ValueError, "workspace_budget", str(2**63)):
        lfce.LinearCrossEntropyLoss(workspace_budget=2**63)


def test_module_checks_options_at_construction():
    with raises(ValueError, "reduction", "'avg'"):
        lfce.LinearCrossEntropyLoss(reduction="avg")


# --- tensors -------------------------------------------------------------------------------

def test_non_tensor_hidden_is_named():
    _, w, y = inputs()
    with raises(TypeError, "hidden", "list"):
        lfce.linear_cross_entropy([[0.0] * H] * N, w, y)


def test_weight_hidden_size_mismatch_is_named():
    x, _, y = inputs()
    w = torch.randn(V, H + 8).to(torch.bfloat16)
    with raises(ValueError, "weight", f"H = {H}", f"({V}, {H + 8})"):
        lfce.linear_cross_entropy(x, w, y)


def test_targets_shape_mismatch_is_named():
    x, w, _ = inputs()
    with raises(ValueError, "targets", f"({N},)", f"({N + 1},)"):
        lfce.linear_cross_entropy(x, w, torch.zeros(N + 1, dtype=torch.int64))


def test_float_targets_are_named():
    x, w, _ = inputs()
    with raises(TypeError, "targets", "torch.float32"):
        lfce.linear_cross_entropy(x, w, torch.zeros(N))


def test_mixed_dtypes_are_named():
    x, w, y = inputs()
    with raises(TypeError, "weight", "torch.bfloat16", "torch.float32"):
        lfce.linear_cross_entropy(x, w.float(), y)


def test_int8_hidden_is_named():
    x, w, y = inputs()
    with raises(TypeError, "hidden", "torch.int8"):
        lfce.linear_cross_entropy(x.to(torch.int8), w.to(torch.int8), y)


def test_bias_wrong_shape_is_named():
    x, w, y = inputs()
    with raises(ValueError, "bias", f"({V},)", f"({V + 1},)"):
        lfce.linear_cross_entropy(x, w, y, torch.zeros(V + 1, dtype=torch.bfloat16))


def test_no_tokens_is_named():
    _, w, _ = inputs()
    with raises(ValueError, "no tokens", f"(0, {H})", "N = 0"):
        lfce.linear_cross_entropy(torch.empty(0, H, dtype=torch.bfloat16), w, torch.empty(0, dtype=torch.int64))


def test_tensors_on_a_device_other_than_cuda_or_cpu_are_refused():
    with raises(ValueError, "lfce runs on CUDA or CPU tensors", "hidden is on meta"):
        lfce.linear_cross_entropy(*(t.to("meta") for t in inputs()))


def test_tensors_on_a_device_other_than_cuda_or_cpu_are_refused_through_the_module():
    with raises(ValueError, "lfce runs on CUDA or CPU tensors", "meta"):
        lfce.LinearCrossEntropyLoss()(*(t.to("meta") for t in inputs()))


def test_an_unsupported_dtype_is_named_with_float64_for_cpu_tensors():
    x, w, y = inputs()
    with raises(TypeError, "hidden must be torch.bfloat16, torch.float16 or torch.float32 (or torch.float64 on CPU "
                "tensors), got torch.int16"):
        lfce.linear_cross_entropy(x.to(torch.int16), w.to(torch.int16), y)


def test_float64_off_the_cpu_is_refused():
    x, w, y = (t.double() if t.is_floating_point() else t for t in inputs())
    with raises(TypeError, "(or torch.float64 on CPU tensors), got torch.float64"):
        lfce.linear_cross_entropy(x.to("meta"), w.to("meta"), y.to("meta"))


# --- class weights -------------------------------------------------------------------------

def test_class_weight_that_is_not_a_tensor_is_named():
    with raises(TypeError, "class_weight must be None or a torch.Tensor", "list"):
        lfce.linear_cross_entropy(*inputs(), class_weight=[1.0] * V)
    with raises(TypeError, "class_weight must be None or a torch.Tensor", "list"):
        lfce.LinearCrossEntropyLoss(class_weight=[1.0] * V)


def test_integer_class_weight_is_named():
    with raises(TypeError, "class_weight must have a floating dtype", "torch.int64"):
        lfce.linear_cross_entropy(*inputs(), class_weight=torch.ones(V, dtype=torch.int64))
    with raises(TypeError, "class_weight must have a floating dtype", "torch.int64"):
        lfce.LinearCrossEntropyLoss(class_weight=torch.ones(V, dtype=torch.int64))


def test_two_dimensional_class_weight_is_named():
    with raises(ValueError, "class_weight must have shape [V]", f"({V}, 1)"):
        lfce.linear_cross_entropy(*inputs(), class_weight=torch.ones(V, 1))
    with raises(ValueError, "class_weight must have shape [V]", f"({V}, 1)"):
        lfce.LinearCrossEntropyLoss(class_weight=torch.ones(V, 1))


def test_class_weight_of_another_length_than_the_vocabulary_is_named():
    with raises(ValueError, "class_weight", f"[V] = ({V},)", f"got shape ({V + 1},)"):
        lfce.linear_cross_entropy(*inputs(), class_weight=torch.ones(V + 1))


def test_module_checks_the_class_weight_length_at_each_call():
    loss_fn = lfce.LinearCrossEntropyLoss(class_weight=torch.ones(V + 1))  # V is known only at the call
    with raises(ValueError, "class_weight", f"[V] = ({V},)", f"got shape ({V + 1},)"):
        loss_fn(*inputs())


def test_class_weight_with_fp16_inputs_is_refused():
    with raises(ValueError, "class_weight", "torch.float16", "torch.bfloat16 or torch.float32"):
        lfce.linear_cross_entropy(*inputs(dtype=torch.float16), class_weight=torch.ones(V))


def test_z_loss_with_fp16_inputs_is_refused_naming_the_fix():
    with raises(ValueError, "z_loss_scale=0.0001 is not supported with torch.float16", "torch.bfloat16"):
        lfce.linear_cross_entropy(*inputs(dtype=torch.float16), z_loss_scale=1e-4)


def test_class_weight_on_another_device_than_hidden_is_named():
    with raises(ValueError, "class_weight is on meta but hidden is on cpu"):
        lfce.linear_cross_entropy(*inputs(), class_weight=torch.ones(V, device="meta"))


def operator_spy(monkeypatch):
    """Stand in for the operator; return the list of class_weight tensors it was given."""
    seen = []

    def operator(args):
        seen.append(args.class_weight)
        return (torch.zeros(()),)

    monkeypatch.setattr(_ops, "forward", operator)
    return seen


def test_fp32_contiguous_class_weight_reaches_the_operator_uncopied(monkeypatch):
    seen = operator_spy(monkeypatch)
    weights = torch.rand(V)
    lfce.linear_cross_entropy(*inputs(), class_weight=weights)
    assert seen[0].data_ptr() == weights.data_ptr() and seen[0].dtype == torch.float32


def test_class_weight_reaches_the_operator_as_detached_contiguous_fp32(monkeypatch):
    seen = operator_spy(monkeypatch)
    weights = torch.rand(2 * V, dtype=torch.float64, requires_grad=True)
    lfce.linear_cross_entropy(*inputs(), class_weight=weights[::2])
    got = seen[0]
    assert got.dtype == torch.float32 and got.is_contiguous() and not got.requires_grad
    assert torch.equal(got, weights.detach()[::2].float())


def test_module_keeps_its_class_weight_as_a_buffer_as_cross_entropy_loss_does(monkeypatch):
    weights = torch.rand(V)
    loss_fn = lfce.LinearCrossEntropyLoss(class_weight=weights, label_smoothing=0.1)
    assert dict(loss_fn.named_buffers()) == {"class_weight": weights}
    assert "class_weight" in loss_fn.state_dict()
    assert "class_weight=[10]" in repr(loss_fn) and "label_smoothing=0.1" in repr(loss_fn)
    assert "class_weight" not in lfce.LinearCrossEntropyLoss().state_dict()  # None: no entry, as PyTorch's
    seen = operator_spy(monkeypatch)
    loss_fn(*inputs())
    assert seen[0].data_ptr() == weights.data_ptr()


# --- gradient accumulators ----------------------------------------------------------------

def with_bias(dtype=torch.bfloat16):
    x, w, y = inputs(dtype=dtype)
    return x, w, y, torch.randn(V).to(dtype)


# name: (keyword arguments, exception, fragments of its message); each call has a bias but the last
ACCUMULATOR_MISUSES = {
    "weight_not_a_tensor": ({"weight_grad_accumulator": [0.0] * V}, TypeError,
                            ("weight_grad_accumulator must be None or an fp32 torch.Tensor of shape [V, H]", "list")),
    "bias_not_a_tensor": ({"bias_grad_accumulator": 0.0}, TypeError,
                          ("bias_grad_accumulator must be None or an fp32 torch.Tensor of shape [V]", "float")),
    "weight_transposed": ({"weight_grad_accumulator": torch.zeros(H, V)}, ValueError,
                          ("weight_grad_accumulator must have the shape of weight", f"({V}, {H})", f"({H}, {V})")),
    "bias_too_long": ({"bias_grad_accumulator": torch.zeros(V + 1)}, ValueError,
                      ("bias_grad_accumulator must have the shape of bias", f"({V},)", f"({V + 1},)")),
    "weight_in_bf16": ({"weight_grad_accumulator": torch.zeros(V, H, dtype=torch.bfloat16)}, TypeError,
                       ("weight_grad_accumulator must be torch.float32", "got torch.bfloat16")),
    "bias_in_fp64": ({"bias_grad_accumulator": torch.zeros(V, dtype=torch.float64)}, TypeError,
                     ("bias_grad_accumulator must be torch.float32", "got torch.float64")),
    "weight_not_contiguous": ({"weight_grad_accumulator": torch.zeros(H, V).t()}, ValueError,
                              ("weight_grad_accumulator must be contiguous", f"strides (1, {V})")),
    "bias_requires_grad": ({"bias_grad_accumulator": torch.zeros(V, requires_grad=True)}, ValueError,
                           ("bias_grad_accumulator must not require grad",)),
}


@pytest.mark.parametrize("misuse", list(ACCUMULATOR_MISUSES))
def test_a_bad_gradient_accumulator_is_named(misuse):
    kwargs, exception, fragments = ACCUMULATOR_MISUSES[misuse]
    with raises(exception, *fragments):
        lfce.linear_cross_entropy(*with_bias(), **kwargs)


def test_bias_grad_accumulator_without_a_bias_is_named():
    with raises(ValueError, "bias_grad_accumulator needs a bias", "bias is None"):
        lfce.linear_cross_entropy(*inputs(), bias_grad_accumulator=torch.zeros(V))


@pytest.mark.parametrize("name, buffer", [("weight_grad_accumulator", torch.zeros(V, H)),
                                          ("bias_grad_accumulator", torch.zeros(V))])
@pytest.mark.parametrize("reduction", ["mean", "none"])  # "none" would recompute, but the request is eager
def test_gradient_accumulators_in_eager_mode_are_refused_naming_both(name, buffer, reduction):
    with raises(ValueError, f"{name} needs mode='recompute', got mode='eager'", "before the upstream gradient"):
        lfce.linear_cross_entropy(*with_bias(), mode="eager", reduction=reduction, **{name: buffer})


def test_module_names_a_gradient_accumulator_in_eager_mode_at_the_call():
    loss_fn = lfce.LinearCrossEntropyLoss(mode="eager")  # the buffer comes with each call
    with raises(ValueError, "weight_grad_accumulator needs mode='recompute'"):
        loss_fn(*inputs(), weight_grad_accumulator=torch.zeros(V, H))


def test_module_names_a_bad_gradient_accumulator():
    with raises(TypeError, "weight_grad_accumulator must be torch.float32", "torch.float16"):
        lfce.LinearCrossEntropyLoss()(*inputs(), weight_grad_accumulator=torch.zeros(V, H, dtype=torch.float16))


def test_gradient_accumulator_on_another_device_than_hidden_is_named():
    with raises(ValueError, "weight_grad_accumulator is on meta but hidden is on cpu"):
        lfce.linear_cross_entropy(*inputs(), weight_grad_accumulator=torch.zeros(V, H, device="meta"))


def test_misaligned_gradient_accumulator_is_named():
    misaligned = torch.zeros(V * H + 1)[1:].view(V, H)  # 4 bytes past an aligned start
    with raises(ValueError, "weight_grad_accumulator must start on an 8-byte boundary", "storage offset 1"):
        lfce.linear_cross_entropy(*inputs(), weight_grad_accumulator=misaligned)


def test_forward_operator_refuses_gradient_accumulators_in_eager_mode():
    x, w, y = inputs()
    args = _ops.forward_inputs(x, w, None, y, lfce.LossOptions(mode="eager"), weight_grad_accumulator=torch.zeros(V, H),
                               wanted=(True, True, False))
    with raises(ValueError, "gradient accumulators need mode 'recompute', got mode 'eager'"):
        _ops._forward_impl(*args)


def test_token_scaling_reaches_the_operator_and_the_modules_repr(monkeypatch):
    seen = []
    monkeypatch.setattr(_ops, "forward", lambda args: seen.append(args.token_scaling) or (torch.zeros(()),))
    lfce.linear_cross_entropy(*inputs())
    module = lfce.LinearCrossEntropyLoss(token_scaling=True)
    module(*inputs())
    assert seen == [False, True]
    assert "token_scaling=True" in repr(module) and "token_scaling" not in repr(lfce.LinearCrossEntropyLoss())


def test_backward_operator_refuses_an_lse_without_the_scales_token_scaling_needs():
    x, w, y = (t.float() if t.is_floating_point() else t for t in inputs())
    forward = _ops.forward_inputs(x, w, None, y, lfce.LossOptions(token_scaling=True), wanted=(True, True, False))
    with raises(ValueError, f"lse must hold {2 * N} values for {N} tokens with token_scaling=True", f"got {N}"):
        _ops._backward_impl(*_ops._backward_inputs(forward, lse=torch.zeros(N), valid_count=torch.ones(1),
                                                   grad_loss=torch.ones(1)))


def test_make_problem_sets_token_scaling_and_the_outputs():
    p = _lib.make_problem(64, 256, 1000, _lib.DTYPE_BF16, token_scaling=True,
                          outputs=_lib.OUTPUT_ENTROPY | _lib.OUTPUT_PREDICTED)
    assert (p.token_scaling, p.outputs) == (1, 5)
    plain = _lib.make_problem(64, 256, 1000, _lib.DTYPE_BF16)
    assert (plain.token_scaling, plain.outputs) == (0, 0)


def test_make_problem_refuses_outputs_too_wide_for_their_c_type():
    with raises(ValueError, "outputs must be in [-2**31, 2**31 - 1], got 4294967296"):
        _lib.make_problem(64, 256, 1000, _lib.DTYPE_BF16, outputs=2**32)


def test_gradient_accumulators_reach_the_operator_uncopied(monkeypatch):
    seen = []
    monkeypatch.setattr(_ops, "forward", lambda args: seen.append((args.weight_grad_accumulator, args.bias_grad_accumulator))
                        or (torch.zeros(()),))
    main_w, main_b = torch.zeros(V, H), torch.zeros(V)
    lfce.linear_cross_entropy(*with_bias(), weight_grad_accumulator=main_w, bias_grad_accumulator=main_b)
    assert seen[0][0] is main_w and seen[0][1] is main_b


# --- the C library's own checks, through ctypes (no GPU) ---------------------------------

def problem(**changes):
    fields = {"tokens": 64, "hidden": 256, "vocab": 1000, "dtype": _lib.DTYPE_BF16}
    fields.update(changes)
    return _lib.make_problem(**fields)


def check_problem(p):
    _lib.check(_lib.load().lfce_check_problem(ctypes.byref(p)))


@pytest.mark.lib
def test_library_accepts_a_valid_problem():
    check_problem(problem())


@pytest.mark.lib
def test_library_names_zero_vocab():
    with raises(ValueError, "vocab"):
        check_problem(problem(vocab=0))


@pytest.mark.lib
def test_library_accepts_hidden_not_a_multiple_of_8_for_bf16():
    for hidden in (12, 7, 4093):
        check_problem(problem(hidden=hidden))


@pytest.mark.lib
def test_library_names_hidden_above_the_limit():
    with raises(ValueError, "hidden = 2000000"):
        check_problem(problem(hidden=2000000))


@pytest.mark.lib
@pytest.mark.parametrize("field, value", [
    ("softcap", -1.0), ("softcap", NAN), ("softcap", INF), ("softcap", 2e6),
    ("temperature", -1.0), ("temperature", 1e-7), ("temperature", NAN), ("temperature", INF), ("temperature", 2e6),
    ("z_loss_scale", -1e-4), ("z_loss_scale", NAN), ("z_loss_scale", INF), ("z_loss_scale", 2e6),
    ("label_smoothing", -0.1), ("label_smoothing", 1.5), ("label_smoothing", NAN), ("label_smoothing", INF)])
def test_library_names_a_bad_loss_option(field, value):
    p = problem()
    setattr(p, field, value)
    with raises(ValueError, f"lfce_problem.{field}", "got"):
        check_problem(p)


@pytest.mark.lib
def test_library_refuses_an_fp16_temperature_that_could_overflow_dz():
    p = problem(dtype=_lib.DTYPE_FP16, temperature=0.5)
    with raises(ValueError, "lfce_problem.temperature = 0.5 with fp16", "bf16"):
        check_problem(p)


@pytest.mark.lib
def test_library_refuses_class_weights_with_fp16():
    with raises(ValueError, "has_class_weight", "fp16"):
        check_problem(problem(dtype=_lib.DTYPE_FP16, has_class_weight=True))


@pytest.mark.lib
@pytest.mark.parametrize("dtype", [_lib.DTYPE_BF16, _lib.DTYPE_FP32], ids=["bf16", "fp32"])
@pytest.mark.parametrize("label_smoothing", [0.0, 0.1, 1.0])
def test_library_accepts_label_smoothing_and_class_weights(dtype, label_smoothing):
    check_problem(problem(dtype=dtype, label_smoothing=label_smoothing, has_class_weight=True))


@pytest.mark.lib
def test_library_accepts_a_softcap():
    p = problem()
    p.softcap = 30.0
    check_problem(p)


@pytest.mark.lib
@pytest.mark.parametrize("temperature", [0.0, 1.0, 0.7])  # 0: a zero-initialised struct's, none
def test_library_accepts_a_temperature_and_a_z_loss_scale(temperature):
    p = problem()
    p.temperature = temperature
    p.z_loss_scale = 1e-4
    check_problem(p)


@pytest.mark.lib
@pytest.mark.parametrize("mode", [_lib.MODE_RECOMPUTE, _lib.MODE_EAGER])
def test_library_accepts_token_scaling_with_the_loss_options(mode):
    check_problem(problem(token_scaling=True, mode=mode, softcap=30.0, z_loss_scale=1e-4, label_smoothing=0.1,
                          has_class_weight=True))


@pytest.mark.lib
@pytest.mark.parametrize("field", ["accumulate_grad_weight", "accumulate_grad_bias"])
def test_library_refuses_gradient_accumulation_in_eager_mode_naming_field_and_mode(field):
    with raises(ValueError, f"lfce_problem.{field}", "eager"):
        check_problem(problem(mode=_lib.MODE_EAGER, has_bias=True, **{field: True}))


@pytest.mark.lib
def test_library_refuses_bias_gradient_accumulation_without_a_bias():
    with raises(ValueError, "lfce_problem.accumulate_grad_bias", "has_bias"):
        check_problem(problem(accumulate_grad_bias=True))


@pytest.mark.lib
@pytest.mark.parametrize("flag", ["token_scaling", "accumulate_grad_weight"])
def test_library_names_a_flag_that_is_not_0_or_1(flag):
    p = problem()
    setattr(p, flag, 2)
    with raises(ValueError, f"lfce_problem.{flag}", "must be 0 or 1, got 2"):
        check_problem(p)


@pytest.mark.lib
@pytest.mark.parametrize("outputs", [8, -1])
def test_library_names_an_outputs_field_with_a_bit_outside_the_flags(outputs):
    with raises(ValueError, f"lfce_problem.outputs = {outputs} is not valid; expected a sum of "
                "LFCE_OUTPUT_ENTROPY (1), LFCE_OUTPUT_LOGPROB (2) and LFCE_OUTPUT_PREDICTED (4)"):
        check_problem(problem(outputs=outputs))


@pytest.mark.lib
@pytest.mark.parametrize("outputs", range(8))
def test_library_accepts_every_sum_of_the_output_flags(outputs):
    check_problem(problem(outputs=outputs, token_scaling=bool(outputs & 1)))


@pytest.mark.lib
def test_library_accepts_gradient_accumulation_in_recompute_mode():
    check_problem(problem(has_bias=True, accumulate_grad_weight=True, accumulate_grad_bias=True))


@pytest.mark.lib
def test_workspace_sizes_need_no_gpu():
    p = problem()
    assert _lib.forward_workspace_size(p) >= 0
    assert _lib.backward_workspace_size(p) > 0
    assert _lib.backward_chunk_size(p) >= 1


@pytest.mark.lib
def test_workspace_budget_bounds_the_backward_chunk():
    p = problem(tokens=4096, vocab=128256, hidden=4096, workspace_budget=64 << 20)
    chunk = _lib.backward_chunk_size(p)
    assert 4096 * chunk * 2 <= (64 << 20), f"chunk {chunk} of 4096 bf16 rows exceeds the 64 MiB budget"


@pytest.mark.lib
def test_library_reports_a_version():
    assert lfce.library_version()


@pytest.mark.lib
def test_generate_sm80_bf16_emits_mma_sync():
    kernels = lfce.generate(1000, 256, arch="sm_80", dtype="bf16", tokens=64)
    assert kernels, "lfce_generate produced no kernels"
    for kernel in kernels:
        assert ".entry" in kernel["ptx"], "{} has no .entry".format(kernel["name"])
        assert kernel["ptx_size"] in (len(kernel["ptx"]), len(kernel["ptx"]) + 1), kernel["name"]
        assert kernel["threads"] > 0, kernel["name"]
    assert any("mma.sync" in k["ptx"] for k in kernels), \
        "no mma.sync in " + ", ".join(k["name"] for k in kernels)


@pytest.mark.lib
def test_generate_accepts_torch_dtypes():
    names = [k["name"] for k in lfce.generate(1000, 256, arch="sm_80", dtype=torch.bfloat16, tokens=64)]
    assert names == [k["name"] for k in lfce.generate(1000, 256, arch="sm_80", dtype="bf16", tokens=64)]


@pytest.mark.lib
def test_generate_names_unknown_arch():
    with raises(ValueError, "sm_70"):
        lfce.generate(1000, 256, arch="sm_70")


def test_generate_names_a_vocab_too_wide_for_int64():
    # ctypes would keep the low 64 bits: V = 100.
    with raises(ValueError, "vocab", str(2**64 + 100)):
        lfce.generate(2**64 + 100, 64)


def test_generate_names_a_chunk_size_too_wide_for_int64():
    with raises(ValueError, "chunk_size", str(2**64 + 256)):
        lfce.generate(1000, 64, chunk_size=2**64 + 256)


def test_generate_names_a_bool_hidden():
    with raises(TypeError, "hidden", "True"):
        lfce.generate(1000, True)


def test_generate_names_float_tokens():
    with raises(TypeError, "tokens", "64.0"):
        lfce.generate(1000, 64, tokens=64.0)


def test_generate_names_a_string_has_bias():
    with raises(TypeError, "has_bias", "'no'"):
        lfce.generate(1000, 64, has_bias="no")


def test_generate_refuses_an_arch_with_a_nul():
    with raises(ValueError, "arch", "NUL", repr("sm_80\x00junk")):
        lfce.generate(1000, 64, arch="sm_80\x00junk")


def test_generate_names_a_non_string_arch():
    with raises(TypeError, "arch", "80"):
        lfce.generate(1000, 64, arch=80)


def test_set_log_level_refuses_a_nul():
    with raises(ValueError, "level", "NUL"):
        lfce.set_log_level("warn\x00junk")


def test_make_problem_refuses_a_field_too_wide_for_its_c_type():
    with raises(ValueError, "mode", str(2**31)):
        _lib.make_problem(64, 256, 1000, _lib.DTYPE_BF16, mode=2**31)


def test_generate_names_bad_dtype_before_loading():
    with raises(ValueError, "dtype", "'int8'"):
        lfce.generate(1000, 256, dtype="int8")


@pytest.mark.lib
@pytest.mark.parametrize("status, exception", [
    (_lib.ERR_INVALID_ARGUMENT, ValueError),
    (_lib.ERR_COMPILE, lfce.CompileError),
    (_lib.ERR_CUDA, lfce.CudaError),
    (_lib.ERR_INTERNAL, RuntimeError),
])
def test_check_maps_status_to_exception(status, exception):
    with pytest.raises(exception):
        _lib.check(status)
    _lib.check(_lib.OK)


# --- tune(): every option checked before the GPU is touched -------------------------------

def test_tune_names_a_progress_that_is_not_callable():
    with raises(TypeError, "progress", "42"):
        lfce.tune(vocab=1000, hidden=64, progress=42)


def test_tune_names_repetitions_too_wide_for_int32():
    with raises(ValueError, "repetitions", str(2**32 + 5)):
        lfce.tune(vocab=1000, hidden=64, repetitions=2**32 + 5)


def test_tune_names_a_nan_budget():
    with raises(ValueError, "budget_minutes", "nan"):
        lfce.tune(vocab=1000, hidden=64, budget_minutes=float("nan"))


def test_tune_names_a_negative_device():
    with raises(ValueError, "device", "-1"):
        lfce.tune(vocab=1000, hidden=64, device=-1)


def test_tune_names_a_string_verify():
    with raises(TypeError, "verify", "'yes'"):
        lfce.tune(vocab=1000, hidden=64, verify="yes")


def test_tune_names_a_model_with_a_nul():
    with raises(ValueError, "model", "NUL"):
        lfce.tune("llama3-8b\x00junk")


@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float32], ids=["bf16", "fp32"])
def test_odd_hidden_size_reaches_the_operator_unpadded(monkeypatch, dtype):
    """H = 7 (rows of 14 or 28 bytes): hidden and weight go to the operator as they are. lfce
    padded both to a multiple of 8 / 4 with F.pad (a copy of each) before its kernels read such
    rows in place."""
    seen = []

    def operator(args):
        seen.append((tuple(args.hidden.shape), tuple(args.weight.shape)))
        return (torch.zeros(()),)

    monkeypatch.setattr(_ops, "forward", operator)
    lfce.linear_cross_entropy(torch.randn(5, 7).to(dtype), torch.randn(40, 7).to(dtype),
                              torch.zeros(5, dtype=torch.int64))
    assert seen == [((5, 7), (40, 7))]


def test_row_slices_of_odd_hidden_size_are_used_in_place():
    """lfce.h asks rows of H = 7 bf16 elements (14 bytes) to start on 2 bytes only: a slice of
    whole rows is passed as it is, not copied; 16-byte rows still need a 16-byte start."""
    odd = torch.zeros(10, 7, dtype=torch.bfloat16)[3:]
    assert odd.data_ptr() % 16 and _bridge._rows_aligned(odd).data_ptr() == odd.data_ptr()
    even = torch.zeros(10, 8, dtype=torch.bfloat16)[3:]
    assert _bridge._rows_aligned(even).data_ptr() % 16 == 0


@pytest.mark.lib
def test_eager_schedule_and_workspace_through_the_bindings():
    """lfce_eager_schedule / lfce_forward_backward_workspace_size as the eager forward asks for them: all
    tokens in one chunk by default, a budget in bytes of [chunk, V] exponentials bounding it (rows of
    64), a softcap taking the forward and recompute backward; the workspace at least the chunk's dz."""
    n, h, v = 4096, 512, 32000
    eager = _lib.make_problem(n, h, v, _lib.DTYPE_BF16, mode=_lib.MODE_EAGER)
    assert _lib.eager_schedule(eager) == (True, n)
    assert _lib.forward_backward_workspace_size(eager) >= n * v * 2
    budgeted = _lib.make_problem(n, h, v, _lib.DTYPE_BF16, mode=_lib.MODE_EAGER, workspace_budget=1000 * v * 2)
    assert _lib.eager_schedule(budgeted) == (True, 960)
    capped = _lib.make_problem(n, h, v, _lib.DTYPE_BF16, mode=_lib.MODE_EAGER, softcap=30.0)
    assert _lib.eager_schedule(capped) == (False, n)
    with raises(ValueError, "lfce_eager_schedule needs lfce_problem.mode = LFCE_MODE_EAGER"):
        _lib.eager_schedule(_lib.make_problem(n, h, v, _lib.DTYPE_BF16))


def test_allocator_bytes_reads_the_two_counters_of_the_nested_statistics(monkeypatch):
    """_bridge._allocator_bytes takes reserved and allocated from the allocator's nested statistics, and
    PyTorch's public counters where this PyTorch has no such dictionary."""
    stats = {"reserved_bytes": {"all": {"current": 300}}, "allocated_bytes": {"all": {"current": 120}}}
    monkeypatch.setattr(torch._C, "_cuda_memoryStats", lambda index: stats, raising=False)
    assert _bridge._allocator_bytes(torch.device("cuda", 0)) == (300, 120)
    monkeypatch.setattr(torch._C, "_cuda_memoryStats", lambda index: {}, raising=False)
    monkeypatch.setattr(torch.cuda, "memory_reserved", lambda device=None: 7)
    monkeypatch.setattr(torch.cuda, "memory_allocated", lambda device=None: 5)
    assert _bridge._allocator_bytes(torch.device("cuda", 0)) == (7, 5)


def test_eager_budget_is_none_when_the_workspace_fits_an_eighth_of_free_memory(monkeypatch):
    """Eager mode's default token chunk (_bridge._eager_budget): every token at once (None) while the
    [N, V] exponentials fit in an eighth of the free memory (the driver's free memory plus what the
    caching allocator holds unused), else the largest power of two under that eighth."""
    mib = 1 << 20
    monkeypatch.setattr(torch.cuda, "mem_get_info", lambda device=None: (700 * mib, 1 << 40))
    monkeypatch.setattr(_bridge, "_allocator_bytes", lambda device: (200 * mib, 100 * mib))
    weight = torch.empty(1000, 8, dtype=torch.bfloat16)
    # An eighth of 800 MiB is 100 MiB: N = 52428 tokens of V = 1000 bf16 exponentials fit, 52429 not.
    assert _bridge._eager_budget(torch.empty(52428, 8, dtype=torch.bfloat16), weight) is None
    assert _bridge._eager_budget(torch.empty(52429, 8, dtype=torch.bfloat16), weight) == 64 * mib
