# One lfce recompute fwd+bwd at gemma2-2b (N=8192), then cuBLAS's W·xᵀ (the dlogits shape), for ncu.
import sys, torch
sys.path.insert(0, 'python')
import lfce
n, h, v = 8192, 2304, 256000
x = torch.randn(n, h, device='cuda', dtype=torch.bfloat16, requires_grad=True)
w = (torch.randn(v, h, device='cuda') / 48).to(torch.bfloat16).requires_grad_()
y = torch.randint(0, v, (n,), device='cuda')
torch.autograd.grad(lfce.linear_cross_entropy(x, w, y), (x, w))
torch.cuda.synchronize()
with torch.no_grad():
    z = w @ x.t()
torch.cuda.synchronize()
