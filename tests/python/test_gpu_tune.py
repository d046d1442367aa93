"""Autotuning end to end on a GPU: `lfce tune` on a small space, every config checked against an
fp64 host reference (--verify), writes winners that a new training process uses with no code change
and without tuning."""

import os
import subprocess
import sys

import pytest
from test_tune import REPO, lfce_cli

STEP = """
import torch, lfce
x = torch.randn(1000, 512, device="cuda", dtype=torch.bfloat16, requires_grad=True)
w = torch.randn(8192, 512, device="cuda", dtype=torch.bfloat16, requires_grad=True)
y = torch.randint(0, 8192, (1000,), device="cuda")
lfce.linear_cross_entropy(x, w, y).backward()
torch.cuda.synchronize()
"""


@pytest.mark.gpu
def test_tuned_winners_are_used_by_the_next_process(tmp_path):
    cache = str(tmp_path)
    tune = subprocess.run(
        [lfce_cli(), "tune", "--vocab", "8192", "--hidden", "512", "--tokens", "1000", "--space", "small",
         "--verify", "--repetitions", "3", "--cache-dir", cache],
        capture_output=True, text=True, timeout=900, check=False)
    print(tune.stdout)
    assert tune.returncode == 0, tune.stderr[-4000:]
    for kernel in ("lse_forward", "dlogits_backward", "grad_weight", "grad_input"):
        assert kernel in tune.stdout
    assert "(none)" not in tune.stdout, "a kernel had no config that passed: " + tune.stdout
    assert len(os.listdir(os.path.join(cache, "tuning"))) == 4

    # Again: resumable, nothing is measured twice.
    again = subprocess.run([lfce_cli(), "tune", "--vocab", "8192", "--hidden", "512", "--tokens", "1000",
                            "--space", "small", "--cache-dir", cache], capture_output=True, text=True, timeout=900,
                           check=False)
    assert again.returncode == 0, again.stderr[-4000:]
    rows = [line.split() for line in again.stdout.splitlines() if line.startswith(("lse_forward", "grad_", "dlogits"))]
    assert rows and all(row[-4] == "0" for row in rows), again.stdout  # column "new"

    env = dict(os.environ, LFCE_CACHE_DIR=cache, LFCE_LOG_LEVEL="info", PYTHONPATH=os.path.join(REPO, "python"))
    env.pop("LFCE_AUTOTUNE", None)
    step = subprocess.run([sys.executable, "-c", STEP], env=env, capture_output=True, text=True, timeout=600,
                          check=False)
    assert step.returncode == 0, step.stderr[-4000:]
    used = [line for line in step.stderr.splitlines() if "using tuned config" in line]
    assert len(used) == 4, step.stderr[-4000:]
    assert "LFCE_AUTOTUNE" not in step.stderr, step.stderr[-4000:]  # no sweep on first use
