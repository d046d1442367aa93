"""lfce's forward and backward on a few shapes, for compute-sanitizer (needs a GPU).

    compute-sanitizer --tool memcheck --error-exitcode 1 python3 scripts/sanitize_gpu.py
    compute-sanitizer --tool racecheck --error-exitcode 1 python3 scripts/sanitize_gpu.py --small

Covers every kernel kind (bias on), both modes, mean and none, bf16 / fp16 / fp32, a vocabulary
taking several backward chunks (the fp32 grad_hidden accumulator) and edge tiles (N, V not
multiples of any tile); then, in bf16, the loss options' and extra outputs' kernels (class-weighted
smoothing, softcap + temperature + z-loss + token scaling, and the entropy, logprob and predicted
ids with gradients through the lse rows). --small: one tiny shape, for racecheck's slow
shared-memory tracking.
"""

import sys

import torch

import lfce


def run(n, h, v, dtype, mode, reduction, **options):
    g = torch.Generator(device="cuda").manual_seed(0)
    x = torch.randn(n, h, device="cuda", generator=g).to(dtype).requires_grad_()
    w = (torch.randn(v, h, device="cuda", generator=g) * (2.5 / h ** 0.5)).to(dtype).requires_grad_()
    b = (torch.randn(v, device="cuda", generator=g) * 0.5).to(dtype).requires_grad_()
    y = torch.randint(0, v, (n,), device="cuda", generator=g)
    y[::5] = -100
    if options.pop("class_weight", False):
        options["class_weight"] = torch.rand(v, device="cuda", generator=g) + 0.5
    out = lfce.linear_cross_entropy(x, w, y, b, mode=mode, reduction=reduction, **options)
    loss = out if isinstance(out, torch.Tensor) else out.loss
    total = loss.sum()
    if not isinstance(out, torch.Tensor):  # the differentiable extra outputs
        for extra in (out.lse, out.entropy, out.logprob):
            if extra is not None:
                total = total + extra.sum()
    total.backward()
    torch.cuda.synchronize()
    assert torch.isfinite(x.grad).all() and torch.isfinite(w.grad).all() and torch.isfinite(b.grad).all()


def main():
    small = "--small" in sys.argv
    shapes = [(7, 256, 1000, {})] if small else [(7, 4096, 50257, {}), (257, 2304, 50257, {}),
                                                 (65, 2304, 30011, {"chunk_size": 4096})]
    dtypes = [torch.bfloat16] if small else [torch.bfloat16, torch.float16, torch.float32]
    count = 0
    for n, h, v, options in shapes:
        for dtype in dtypes:
            for mode in ("recompute", "eager"):
                for reduction in ("mean", "none"):
                    run(n, h, v, dtype, mode, reduction, **options)
                    count += 1
    option_sets = [{"label_smoothing": 0.1, "class_weight": True},
                   {"softcap": 30.0, "temperature": 0.7, "z_loss_scale": 1e-4, "token_scaling": True},
                   {"return_lse": True, "return_entropy": True, "return_logprob": True, "return_predicted": True}]
    for n, h, v, options in shapes:
        for extra in option_sets:
            for reduction in ("mean", "none"):
                run(n, h, v, torch.bfloat16, "recompute", reduction, **options, **extra)
                count += 1
    print(f"sanitize_gpu: {count} forward+backward runs done")


if __name__ == "__main__":
    main()
