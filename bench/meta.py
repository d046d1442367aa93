"""What a benchmark result depends on besides its shape, and where its JSON goes (no GPU needed)."""

import ctypes
import datetime
import importlib.metadata
import json
import os
import subprocess

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
BASELINE = "F.linear + F.cross_entropy with the logits in the input dtype (bf16 logits for bf16), as users run it"
# Distributions whose versions decide the anchors' figures: name in the JSON -> distribution name.
PACKAGES = {"triton": "triton", "liger_kernel": "liger-kernel", "cut_cross_entropy": "cut-cross-entropy"}


def git_commit(root=REPO):
    """(commit, dirty): ($LFCE_COMMIT, None) when set (a copy whose .git is absent or stale, as on
    a device machine), else git's for the checkout at ``root``, else (None, None)."""
    if os.environ.get("LFCE_COMMIT"):
        return os.environ["LFCE_COMMIT"], None
    try:
        head = subprocess.run(["git", "-C", root, "rev-parse", "HEAD"], check=False, capture_output=True, text=True,
                              timeout=10)
        if head.returncode == 0:
            status = subprocess.run(["git", "-C", root, "status", "--porcelain", "--untracked-files=no"],
                                    check=False, capture_output=True, text=True, timeout=10)
            return head.stdout.strip(), (bool(status.stdout.strip()) if status.returncode == 0 else None)
    except (OSError, subprocess.SubprocessError):
        pass
    return None, None


def package_versions():
    """Installed (or --wheels-unpacked) versions of Triton, Liger-Kernel and CCE; None where absent."""
    versions = {}
    for key, distribution in PACKAGES.items():
        try:
            versions[key] = importlib.metadata.version(distribution)
        except importlib.metadata.PackageNotFoundError:
            versions[key] = None
    return versions


def _driver_versions():
    """(NVIDIA driver release from nvidia-smi, CUDA version the driver supports), None where unknown."""
    release = None
    try:
        smi = subprocess.run(["nvidia-smi", "--query-gpu=driver_version", "--format=csv,noheader"],
                             check=False, capture_output=True, text=True, timeout=30)
        if smi.returncode == 0 and smi.stdout.strip():
            release = smi.stdout.splitlines()[0].strip()
    except (OSError, subprocess.SubprocessError):
        pass
    cuda = None
    try:
        version = ctypes.c_int(0)
        if ctypes.CDLL("libcuda.so.1").cuDriverGetVersion(ctypes.byref(version)) == 0:
            cuda = f"{version.value // 1000}.{version.value % 1000 // 10}"
    except OSError:
        pass
    return release, cuda


def _gpu_info(device=0):
    import torch

    release, cuda = _driver_versions()
    return {"gpu": torch.cuda.get_device_name(device), "driver_version": release, "driver_cuda_version": cuda,
            "torch": torch.__version__, "torch_cuda": torch.version.cuda}


def metadata(command, gpu_info=None, root=REPO):
    """Everything a result depends on besides its shape: a dict for the JSON's top level.

    gpu_info: the GPU, driver and torch fields (default: read from device 0 and the driver).
    """
    from lfce import __version__, _lib

    commit, dirty = git_commit(root)
    meta = {"date": datetime.datetime.now(datetime.timezone.utc).isoformat(timespec="seconds"),
            "command": command, "lfce": __version__, "generator_version": _lib.generator_version(),
            "git_commit": commit, "git_dirty": dirty, "baseline": BASELINE}
    meta.update(package_versions())
    meta.update(_gpu_info() if gpu_info is None else gpu_info)
    return meta


def result_path(result, out_dir, suffix=".json", prefix="bench"):
    """out_dir/<prefix>-<date>-<commit><suffix>: where write_json puts ``result``."""
    commit = (result.get("git_commit") or "nocommit")[:12]
    return os.path.join(out_dir, f"{prefix}-{result['date'][:10]}-{commit}{suffix}")


def write_json(result, out_dir, prefix="bench"):
    """Write ``result`` (metadata() plus "results") to result_path(); return the path."""
    os.makedirs(out_dir, exist_ok=True)
    return save_json(result, result_path(result, out_dir, prefix=prefix))


def save_json(result, path):
    """Write ``result`` to ``path`` whole (through a temporary file); return the path."""
    folder = os.path.dirname(path)
    if folder:
        os.makedirs(folder, exist_ok=True)
    with open(path + ".tmp", "w") as f:  # renamed: a run killed mid-write leaves the previous file whole
        json.dump(result, f, indent=1, sort_keys=True)
        f.write("\n")
    os.replace(path + ".tmp", path)
    return path
