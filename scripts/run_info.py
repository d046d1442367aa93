"""Write what a test run depends on (date, GPUs, driver, torch, commit) to the JSON file named by argv[1].

Used by scripts/gpu_tests.sh and scripts/multigpu_tests.sh. The commit is $LFCE_COMMIT when set (a
build carried to another machine), else the checkout's HEAD, with "-dirty" when it has changes.
"""
import datetime
import json
import os
import subprocess
import sys

import torch


def smi(field):
    try:
        return subprocess.run(["nvidia-smi", "--query-gpu=" + field, "--format=csv,noheader"], check=False,
                              capture_output=True, text=True, timeout=30).stdout.strip().splitlines()[0]
    except (OSError, subprocess.SubprocessError, IndexError) as e:  # recorded, not fatal
        return f"unavailable ({e})"


def commit():
    if os.environ.get("LFCE_COMMIT"):
        return os.environ["LFCE_COMMIT"]
    def git(*args):
        return subprocess.run(["git", *args], check=False, capture_output=True, text=True).stdout.strip()
    try:
        head = git("rev-parse", "HEAD")
        return (head + "-dirty" if git("status", "--porcelain") else head) if head else "unknown"
    except OSError:
        return "unknown"


info = {
    "date": datetime.datetime.now(datetime.timezone.utc).isoformat(timespec="seconds"),
    "gpu": torch.cuda.get_device_name(0) if torch.cuda.is_available() else smi("name"),
    "gpus": torch.cuda.device_count() if torch.cuda.is_available() else 0,
    "driver": smi("driver_version"),
    "torch": torch.__version__,
    "cuda": torch.version.cuda,
    "commit": commit(),
}
with open(sys.argv[1], "w") as f:
    json.dump(info, f, indent=2)
    f.write("\n")
print(json.dumps(info))
