# lfce's forward and the cuBLAS logits GEMM at gemma2-2b's shape (N=8192, H=2304, V=256000), for ncu.
import sys
import torch
sys.path.insert(0, 'python')
import lfce
n, h, v = 8192, 2304, 256000
x = torch.randn(n, h, device='cuda', dtype=torch.bfloat16)
w = (torch.randn(v, h, device='cuda') / 48).to(torch.bfloat16)
y = torch.randint(0, v, (n,), device='cuda')
with torch.no_grad():
    lfce.linear_cross_entropy(x, w, y)
    z = x @ w.t()
torch.cuda.synchronize()
