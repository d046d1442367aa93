"""The drop-in entry points keep the anchors' signatures, and refuse options lfce lacks (no GPU).

The expected signatures are written here from Liger-Kernel 0.8.5 (liger_kernel.transformers)
and Cut Cross-Entropy 25.1.1 (cut_cross_entropy): argument names, kinds, order and defaults
(annotations aside). An option lfce does not implement raises NotImplementedError naming it,
before any tensor is looked at.
"""

import inspect
import re

import pytest
import torch

import lfce
from lfce.compat import cce, liger


def shape(fn):
    """(name, kind, default) of each parameter: the signature without annotations."""
    return [(p.name, p.kind, p.default) for p in inspect.signature(fn).parameters.values()]


def liger_functional(input, weight, target, bias=None, ce_weight=None, ignore_index=-100, lse_square_scale=0.0,
                     label_smoothing=0.0, reduction="mean", softcap=None, return_z_loss=False, accum_dtype=None,
                     use_token_scaling=False, return_token_accuracy=False, return_predicted_tokens=False,
                     chunk_mem_const=1):
    pass


def liger_init(self, ce_weight=None, ignore_index=-100, lse_square_scale=0.0, label_smoothing=0.0, reduction="mean",
               softcap=None, return_z_loss=False, accum_dtype=None, use_token_scaling=False,
               return_token_accuracy=False, return_predicted_tokens=False):
    pass


def liger_forward(self, lin_weight, _input, target, bias=None):
    pass


def cce_functional(e, c, targets, ignore_index=-100, softcap=None, reduction="mean", shift=False, filter_eps="high",
                   impl=cce.LinearCrossEntropyImpl.CCE):
    pass


def test_liger_functional_has_liger_kernels_signature():
    assert shape(liger.liger_fused_linear_cross_entropy) == shape(liger_functional)


def test_liger_module_has_liger_kernels_constructor_and_forward():
    assert shape(liger.LigerFusedLinearCrossEntropyLoss.__init__) == shape(liger_init)
    assert shape(liger.LigerFusedLinearCrossEntropyLoss.forward) == shape(liger_forward)


def test_cce_functional_has_cut_cross_entropys_signature():
    assert shape(cce.linear_cross_entropy) == shape(cce_functional)
    assert cce.LinearCrossEntropyImpl.CCE.name == "CCE"


def cpu_inputs():
    return torch.randn(4, 16), torch.randn(10, 16), torch.randint(0, 10, (4,))


def assert_computed(result):
    """Every tensor a call returned (a loss, a tuple with z_loss, or Liger's CrossEntropyOutput) is
    finite: the options were accepted and lfce computed the loss on the CPU."""
    if isinstance(result, liger.CrossEntropyOutput):
        result = tuple(vars(result).values())
    tensors = [t for t in (result if isinstance(result, tuple) else (result,)) if isinstance(t, torch.Tensor)]
    assert tensors and all(bool(torch.isfinite(t).all()) for t in tensors), result


def test_liger_functional_names_an_option_lfce_lacks():
    x, w, y = cpu_inputs()
    with pytest.raises(NotImplementedError, match="Liger-Kernel's option accum_dtype="):
        liger.liger_fused_linear_cross_entropy(x, w, y, accum_dtype=torch.bfloat16)


def test_liger_module_names_an_option_lfce_lacks_at_construction():
    with pytest.raises(NotImplementedError, match="Liger-Kernel's option accum_dtype=torch.bfloat16"):
        liger.LigerFusedLinearCrossEntropyLoss(accum_dtype=torch.bfloat16)


LIGER_CALLS = [lambda x, w, y, **options: liger.liger_fused_linear_cross_entropy(x, w, y, **options),
               lambda x, w, y, **options: liger.LigerFusedLinearCrossEntropyLoss(**options)(w, x, y)]


@pytest.mark.parametrize("call", LIGER_CALLS, ids=["liger", "module"])
@pytest.mark.parametrize("accuracy, predicted", [(True, False), (False, True), (True, True)])
def test_liger_token_accuracy_and_predicted_tokens_reach_lfce_and_come_back_in_liger_kernels_output(
        call, accuracy, predicted, monkeypatch):
    seen = []
    answer = lfce.LossOutput(torch.tensor(1.0), None, None, None, None, torch.tensor(0.5) if accuracy else None,
                             torch.arange(4) if predicted else None)
    monkeypatch.setattr(liger, "linear_cross_entropy", lambda *args, **options: seen.append(options) or answer)
    x, w, y = cpu_inputs()
    out = call(x, w, y, return_token_accuracy=accuracy, return_predicted_tokens=predicted)
    assert (seen[0]["options"].return_accuracy, seen[0]["options"].return_predicted) == (accuracy, predicted)
    assert isinstance(out, liger.CrossEntropyOutput) and out.loss is answer.loss and out.z_loss is None
    assert out.token_accuracy is answer.accuracy and out.predicted_tokens is answer.predicted


@pytest.mark.parametrize("call", LIGER_CALLS, ids=["liger", "module"])
@pytest.mark.parametrize("option", ["return_token_accuracy", "return_predicted_tokens"])
def test_liger_extra_outputs_must_be_bools_named_as_liger_kernel_names_them(call, option):
    x, w, y = cpu_inputs()
    with pytest.raises(TypeError, match=f"{option} must be a bool, got int 1"):
        call(x, w, y, **{option: 1})


@pytest.mark.parametrize("call", [
    lambda x, w, y, **options: liger.liger_fused_linear_cross_entropy(x, w, y, **options),
    lambda x, w, y, **options: liger.LigerFusedLinearCrossEntropyLoss(**options)(w, x, y)], ids=["liger", "module"])
@pytest.mark.parametrize("value", [False, True])
def test_liger_use_token_scaling_reaches_lfce_as_token_scaling(call, value, monkeypatch):
    seen = []
    monkeypatch.setattr(liger, "linear_cross_entropy", lambda *args, **options: seen.append(options) or (None, None))
    x, w, y = cpu_inputs()
    call(x, w, y, use_token_scaling=value, lse_square_scale=1e-4, return_z_loss=True)
    assert seen[0]["options"].token_scaling is value and seen[0]["options"].return_z_loss is True


@pytest.mark.parametrize("call", [
    lambda x, w, y, **options: liger.liger_fused_linear_cross_entropy(x, w, y, **options),
    lambda x, w, y, **options: liger.LigerFusedLinearCrossEntropyLoss(**options)(w, x, y)], ids=["liger", "module"])
def test_liger_use_token_scaling_must_be_a_bool_named_as_liger_kernel_names_it(call):
    x, w, y = cpu_inputs()
    with pytest.raises(TypeError, match="use_token_scaling must be a bool, got int 1"):
        call(x, w, y, use_token_scaling=1)
    assert_computed(call(x, w, y, use_token_scaling=True))  # accepted: lfce computes it on the CPU


def test_liger_fp32_accumulation_computes_what_the_default_computes(monkeypatch):
    # lfce always accumulates in fp32: accum_dtype=torch.float32 is accepted and changes nothing
    # lfce is asked for; any other accumulation dtype is refused, naming it.
    seen = []
    monkeypatch.setattr(liger, "linear_cross_entropy", lambda *args, **options: seen.append(options))
    x, w, y = cpu_inputs()
    liger.LigerFusedLinearCrossEntropyLoss(accum_dtype=torch.float32)(w, x, y)
    liger.LigerFusedLinearCrossEntropyLoss()(w, x, y)
    liger.liger_fused_linear_cross_entropy(x, w, y, accum_dtype=torch.float32)
    assert len(seen) == 3 and seen[0] == seen[1] == seen[2], seen
    with pytest.raises(NotImplementedError, match="accum_dtype=torch.bfloat16"):
        liger.LigerFusedLinearCrossEntropyLoss(accum_dtype=torch.bfloat16)


@pytest.mark.parametrize("call", [
    lambda x, w, y, cap: cce.linear_cross_entropy(x, w, y, softcap=cap),
    lambda x, w, y, cap: liger.liger_fused_linear_cross_entropy(x, w, y, softcap=cap),
    lambda x, w, y, cap: liger.LigerFusedLinearCrossEntropyLoss(softcap=cap)(w, x, y)], ids=["cce", "liger", "module"])
def test_softcap_reaches_lfces_own_checks(call):
    x, w, y = cpu_inputs()
    with pytest.raises(ValueError, match="softcap must be None .* got -1.0"):
        call(x, w, y, -1.0)
    assert_computed(call(x, w, y, 20.0))  # accepted: lfce computes it on the CPU


@pytest.mark.parametrize("call", [
    lambda x, w, y, s: liger.liger_fused_linear_cross_entropy(x, w, y, lse_square_scale=s, return_z_loss=True),
    lambda x, w, y, s: liger.LigerFusedLinearCrossEntropyLoss(lse_square_scale=s, return_z_loss=True)(w, x, y)],
    ids=["liger", "module"])
def test_liger_z_loss_reaches_lfces_own_checks_under_liger_kernels_name(call):
    x, w, y = cpu_inputs()
    with pytest.raises(ValueError, match=r"lse_square_scale must be None or a number in \[0, 1e6\] .* got -0.0001"):
        call(x, w, y, -1e-4)
    assert_computed(call(x, w, y, 1e-4))  # accepted: lfce computes it on the CPU


@pytest.mark.parametrize("call", [
    lambda x, w, y, **options: liger.liger_fused_linear_cross_entropy(x, w, y, **options),
    lambda x, w, y, **options: liger.LigerFusedLinearCrossEntropyLoss(**options)(w, x, y)], ids=["liger", "module"])
def test_liger_ce_weight_and_label_smoothing_reach_lfce_as_class_weight_and_label_smoothing(call, monkeypatch):
    seen = []
    monkeypatch.setattr(liger, "linear_cross_entropy", lambda *args, **options: seen.append(options))
    x, w, y = cpu_inputs()
    ce_weight = torch.rand(10)
    call(x, w, y, ce_weight=ce_weight, label_smoothing=0.1, lse_square_scale=1e-4, reduction="sum")
    options = seen[0]["options"]
    assert seen[0]["class_weight"] is ce_weight and options.label_smoothing == 0.1
    assert options.z_loss_scale == 1e-4 and options.reduction == "sum"


@pytest.mark.parametrize("call", [
    lambda x, w, y, **options: liger.liger_fused_linear_cross_entropy(x, w, y, **options),
    lambda x, w, y, **options: liger.LigerFusedLinearCrossEntropyLoss(**options)(w, x, y)], ids=["liger", "module"])
@pytest.mark.parametrize("option, value, exception, message", [
    ("ce_weight", [1.0] * 10, TypeError, "ce_weight must be None or a torch.Tensor of shape [V], got list"),
    ("ce_weight", torch.ones(10, dtype=torch.int64), TypeError, "ce_weight must have a floating dtype"),
    ("ce_weight", torch.ones(10, 2), ValueError, "ce_weight must have shape [V], got shape (10, 2)"),
    ("label_smoothing", 1.5, ValueError, "label_smoothing must be None or a number in [0, 1]"),
    ("label_smoothing", "0.1", TypeError, "label_smoothing must be None or a number")])
def test_liger_ce_weight_and_label_smoothing_are_checked_under_liger_kernels_names(call, option, value, exception,
                                                                                  message):
    x, w, y = cpu_inputs()
    with pytest.raises(exception, match=re.escape(message)):
        call(x, w, y, **{option: value})


@pytest.mark.parametrize("call", [
    lambda x, w, y, **options: liger.liger_fused_linear_cross_entropy(x, w, y, **options),
    lambda x, w, y, **options: liger.LigerFusedLinearCrossEntropyLoss(**options)(w, x, y)], ids=["liger", "module"])
def test_liger_ce_weight_and_label_smoothing_are_accepted(call):
    x, w, y = cpu_inputs()
    assert_computed(call(x, w, y, ce_weight=torch.rand(10), label_smoothing=0.1))


def test_cce_names_a_shift_other_than_one():
    x, w, y = cpu_inputs()
    with pytest.raises(NotImplementedError, match="shift=2"):
        cce.linear_cross_entropy(x, w, y, shift=2)


def test_supported_options_reach_lfces_own_checks():
    x, w, y = cpu_inputs()
    assert_computed(liger.liger_fused_linear_cross_entropy(x, w, y, reduction="sum", accum_dtype=torch.float32,
                                                           chunk_mem_const=4))
    assert_computed(cce.linear_cross_entropy(x, w, y, shift=True, filter_eps=None, impl="torch_compile"))


@pytest.mark.parametrize("shift", [1, 0, True, False])
def test_cce_takes_an_int_shift_of_one_or_none_as_cce_does(shift, monkeypatch):
    seen = []
    monkeypatch.setattr(cce, "_lfce_linear_cross_entropy", lambda *args, **options: seen.append(options) or
                        torch.zeros(()))
    x, w, y = cpu_inputs()
    cce.linear_cross_entropy(x, w, y, shift=shift)
    assert seen[0]["options"].shift is bool(shift)


def test_cce_names_a_shift_that_is_not_a_number():
    x, w, y = cpu_inputs()
    with pytest.raises(TypeError, match="shift must be a bool or an int, got str 'yes'"):
        cce.linear_cross_entropy(x, w, y, shift="yes")


@pytest.mark.parametrize("impl", ["garbage", "CCE2", ""])
def test_cce_names_an_implementation_cce_does_not_have(impl):
    x, w, y = cpu_inputs()
    with pytest.raises(ValueError, match=f"impl must be one of Cut Cross-Entropy's implementations .*got '{impl}'"):
        cce.linear_cross_entropy(x, w, y, impl=impl)


@pytest.mark.parametrize("impl", ["cce", "torch_compile", "cce_kahan_full_c", "CCE_EXACT",
                                  cce.LinearCrossEntropyImpl.CCE_EXACT])
def test_cce_accepts_each_of_its_implementations(impl):
    x, w, y = cpu_inputs()
    assert_computed(cce.linear_cross_entropy(x, w, y, impl=impl))  # accepted: lfce computes it on the CPU


@pytest.mark.parametrize("option, value, exception, message", [
    ("softcap", -1.0, ValueError, "softcap must be None or a number in (0, 1e6]"),
    ("ignore_index", "x", TypeError, "ignore_index must be an int, got str 'x'"),
    ("ignore_index", 2.5, TypeError, "ignore_index must be an int, got float 2.5"),
    ("reduction", "avg", ValueError, "reduction must be one of 'mean', 'sum', 'none', got 'avg'"),
    ("return_z_loss", "yes", TypeError, "return_z_loss must be a bool, got str 'yes'")])
def test_liger_module_checks_every_constructor_argument(option, value, exception, message):
    with pytest.raises(exception, match=re.escape(message)):
        liger.LigerFusedLinearCrossEntropyLoss(**{option: value})
    x, w, y = cpu_inputs()
    with pytest.raises(exception, match=re.escape(message)):
        liger.liger_fused_linear_cross_entropy(x, w, y, **{option: value})


def test_liger_functional_names_a_bad_chunk_mem_const():
    x, w, y = cpu_inputs()
    with pytest.raises(ValueError, match=re.escape("chunk_mem_const must be in [1, 2**63 - 1], got 0")):
        liger.liger_fused_linear_cross_entropy(x, w, y, chunk_mem_const=0)
