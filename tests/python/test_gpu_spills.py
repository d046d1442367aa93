"""No kernel lfce loads by default spills registers to local memory, as the driver compiles it
(needs a GPU).

CI assembles the generated PTX with the toolkit's ptxas and checks for spills there, but the
driver's JIT, which compiles what users run, allocates registers differently: on an H200 with
driver 580 it spilled (and serialised wgmma) in kernels that ptxas 13.0 assembled cleanly. This
test reads what the driver reported for each kernel it loaded (lfce.kernel_load_stats) after a
forward and backward at llama3-8b's output layer (H = 4096, V = 128256) for each dtype, bias,
reduction and mode; N is small (a run-time size), so it costs the compiles, not the GEMMs.
"""

import pytest
import torch
from checks import make_inputs

import lfce

pytestmark = pytest.mark.gpu

N, H, V = 256, 4096, 128256


@pytest.mark.parametrize("mode", ["recompute", "eager"])
@pytest.mark.parametrize("reduction", ["mean", "none"])
@pytest.mark.parametrize("bias", [False, True], ids=["no_bias", "bias"])
@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float16], ids=["bf16", "fp16"])
def test_default_kernels_do_not_spill_under_the_driver_jit(dtype, bias, reduction, mode):
    x, w, b, y = make_inputs(N, H, V, dtype, bias=bias)
    x.requires_grad_()
    w.requires_grad_()
    if b is not None:
        b.requires_grad_()
    loss = lfce.linear_cross_entropy(x, w, y, bias=b, reduction=reduction, mode=mode)
    (loss.sum() if reduction == "none" else loss).backward()
    torch.cuda.synchronize()
    loaded = [k for k in lfce.kernel_load_stats() if f";H={H};" in k["spec"]]
    assert loaded, "no kernel of this shape was loaded"
    spilled = [(k["spec"], k["local_bytes"], k["registers"]) for k in loaded if k["local_bytes"] > 0]
    assert not spilled, f"kernels that spill under the driver's JIT (spec, local bytes, registers): {spilled}"


# The loss options and extra outputs add per-column loads and per-row statistics to the same
# epilogues (both paths: with and without a bias); each set's kernels, as the driver compiles them.
OPTION_SETS = {
    "softcap": {"softcap": 30.0},
    "softcap_temperature": {"softcap": 30.0, "temperature": 0.7},
    "softcap_z_loss": {"softcap": 30.0, "z_loss_scale": 1e-4},
    "temperature_z_loss": {"temperature": 0.7, "z_loss_scale": 1e-4},
    "softcap_temperature_z_loss": {"softcap": 30.0, "temperature": 0.7, "z_loss_scale": 1e-4},
    "smoothing_class_weights": {"label_smoothing": 0.1, "class_weight": True},
    "token_scaling": {"token_scaling": True},
    "outputs": {"return_lse": True, "return_entropy": True, "return_logprob": True, "return_predicted": True},
    "outputs_smoothing_class_weights_softcap": {"return_entropy": True, "return_logprob": True,
                                                "return_predicted": True, "label_smoothing": 0.1,
                                                "class_weight": True, "softcap": 30.0},
}


@pytest.mark.parametrize("bias", [False, True], ids=["no_bias", "bias"])
@pytest.mark.parametrize("options", list(OPTION_SETS), ids=list(OPTION_SETS))
def test_option_kernels_do_not_spill_under_the_driver_jit(options, bias):
    x, w, b, y = make_inputs(N, H, V, torch.bfloat16, bias=bias)
    kwargs = dict(OPTION_SETS[options])
    if kwargs.pop("class_weight", False):
        kwargs["class_weight"] = torch.rand(V, device=x.device) + 0.5
    x.requires_grad_()
    w.requires_grad_()
    before = {k["spec"] for k in lfce.kernel_load_stats()}  # each kernel is checked by the test that loads it
    out = lfce.linear_cross_entropy(x, w, y, bias=b, **kwargs)
    total = out if isinstance(out, torch.Tensor) else out.loss
    if not isinstance(out, torch.Tensor):  # the differentiable outputs' gradients too (their dlogits kernel)
        for extra in (out.lse, out.entropy, out.logprob):
            if extra is not None:
                total = total + extra.sum()
    total.backward()
    torch.cuda.synchronize()
    loaded = [k for k in lfce.kernel_load_stats() if f";H={H};" in k["spec"] and k["spec"] not in before]
    spilled = [(k["spec"], k["local_bytes"], k["registers"]) for k in loaded if k["local_bytes"] > 0]
    assert not spilled, f"kernels that spill under the driver's JIT (spec, local bytes, registers): {spilled}"
