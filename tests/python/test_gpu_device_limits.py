"""A smaller GPU on the H200 (needs a GPU): LFCE_DEVICE_SMEM_LIMIT = 99 KiB (RTX 30/40/50, A10,
L4, L40S) and LFCE_DEVICE_SM_COUNT = 108 (A100) make every tile, grid and the loader's
shared-memory check see that device. Each run is a fresh process (the limits are read at the
first use of a device): the kernels it picks must load under the forced limit (the loader
raises CompileError naming the bytes otherwise), give the fp64 reference's results, and differ
from the H200's own choice where the H200's default tile needs more than 99 KiB.
"""

import json
import os
import subprocess
import sys

import pytest

pytestmark = pytest.mark.gpu

SMALL_GPU = {"LFCE_DEVICE_SMEM_LIMIT": str(99 * 1024), "LFCE_DEVICE_SM_COUNT": "108"}

SCRIPT = r"""
import json, sys
import torch
import lfce
from checks import GRAD, LOSS, assert_close, make_inputs, reference, upstream
results = {}
for dtype in (torch.bfloat16, torch.float32):
    for mode in ("recompute", "eager"):
        x, w, b, y = make_inputs(257, 2304, 50257, dtype, bias=True)
        grad = upstream("mean", (), dtype)
        xs, ws, bs = (t.detach().clone().requires_grad_() for t in (x, w, b))
        loss = lfce.linear_cross_entropy(xs, ws, y, bs, mode=mode)
        loss.backward(grad)
        ref = reference(x, w, b, y, "mean", grad)
        assert_close("loss", loss.detach(), ref[0], LOSS[dtype])
        for name, ours, theirs in zip(("grad_hidden", "grad_weight", "grad_bias"), (xs.grad, ws.grad, bs.grad), ref[1:]):
            assert_close(name, ours, theirs, GRAD[dtype])
print(json.dumps(sorted({k["spec"] for k in lfce.kernel_load_stats()})))
"""


def run(extra_env):
    env = dict(os.environ)
    env.update(extra_env)
    env["PYTHONPATH"] = os.pathsep.join([os.path.dirname(__file__), env.get("PYTHONPATH", "")])
    done = subprocess.run([sys.executable, "-c", SCRIPT], env=env, capture_output=True, text=True, timeout=600,
                          check=False)
    assert done.returncode == 0, "with %s:\n%s\n%s" % (extra_env, done.stdout[-3000:], done.stderr[-6000:])
    return set(json.loads(done.stdout.strip().splitlines()[-1]))


def test_a_99_kib_108_sm_gpu_gets_tiles_that_fit_and_the_same_results(tmp_path):
    cache = {"LFCE_CACHE_DIR": str(tmp_path)}
    small = run({**SMALL_GPU, **cache})
    own = run(cache)
    changed = sorted(small - own)
    # The H200's default 16-bit tiles for the backward GEMMs need 131-136 KB: they must change.
    assert any(spec.startswith(("dlogits_backward", "grad_input", "grad_weight")) for spec in changed), (
        "forcing a 99 KiB GPU changed no backward tile:\n%s" % "\n".join(sorted(small)))
