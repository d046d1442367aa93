"""Forward + backward at test_gpu_spills' shape (N=256, H=4096, V=128256, bf16, mean, recompute),
plain and with options; print what the driver's JIT reported for each kernel loaded."""
import sys
import torch
import lfce

torch.manual_seed(0)
N, H, V = 256, 4096, 128256
x = torch.randn(N, H, device="cuda").bfloat16().requires_grad_()
w = (torch.randn(V, H, device="cuda") * 2.5 / H ** 0.5).bfloat16().requires_grad_()
y = torch.randint(0, V, (N,), device="cuda")
opts = [{}, {"return_entropy": True, "return_logprob": True, "return_predicted": True, "label_smoothing": 0.1,
             "class_weight": torch.rand(V, device="cuda"), "softcap": 30.0}]
for o in opts:
    out = lfce.linear_cross_entropy(x, w, y, **o)
    loss = out[0] if isinstance(out, tuple) else out
    loss.backward()
torch.cuda.synchronize()
for k in lfce.kernel_load_stats():
    print(k["local_bytes"], k["registers"], k["spec"])
