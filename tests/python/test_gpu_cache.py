"""The kernel cache on a GPU: a new training process loads the cubins an earlier one cached, with
no LLVM and no driver JIT (needs a CUDA GPU)."""

import json

import pytest
from test_cache import run_python

STEP = """
import json, torch, lfce
x = torch.randn(300, 256, device="cuda", dtype=torch.bfloat16, requires_grad=True)
w = torch.randn(5000, 256, device="cuda", dtype=torch.bfloat16, requires_grad=True)
y = torch.randint(0, 5000, (300,), device="cuda")
lfce.linear_cross_entropy(x, w, y).backward()
torch.cuda.synchronize()
print(json.dumps(lfce.kernel_load_stats()))
"""


@pytest.mark.gpu
def test_a_new_process_loads_cached_cubins_without_compiling(tmp_path):
    env = {"LFCE_CACHE_DIR": str(tmp_path), "CUDA_CACHE_DISABLE": "1"}
    cold = json.loads(run_python(STEP, env))
    warm = json.loads(run_python(STEP, env))
    assert {k["source"] for k in cold} == {"llvm"}, cold
    assert len(warm) == len(cold) == 6
    # The warp-specialised wgmma kernels (sm_90a; tile text ".../wgC/...") are compiled whole from
    # their PTX entry, with no cubin kept (the driver's link ignores setmaxnreg); the others load cubins.
    for k in warm:
        whole = "/wg" in k["spec"]
        assert k["source"] == ("ptx-cache" if whole else "cubin-cache"), k
        assert k["llvm_ms"] == 0 and (whole or k["jit_ms"] == 0), k
    print("cold ms per kernel (LLVM + JIT):", [round(k["llvm_ms"] + k["jit_ms"], 1) for k in cold])
    print("warm load ms per kernel:", [round(k["total_ms"], 2) for k in warm])
