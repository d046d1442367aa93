"""Shared setup of the Python tests.

Markers:

* ``gpu``: needs a CUDA GPU. Skipped with reason "no CUDA GPU" on a machine
  without one, but FAILS when the machine should have one (/dev/nvidia0 exists or
  LFCE_REQUIRE_GPU=1) and torch cannot use it: a GPU test is never silently
  skipped on a GPU machine.
* ``multigpu``: needs two CUDA GPUs and a torchrun world of two processes or more
  (scripts/multigpu_tests.sh launches them). Skipped with reason "needs 2 CUDA GPUs" on a
  machine with fewer; FAILS when the machine has two (/dev/nvidia1 exists, torch sees two, or
  LFCE_REQUIRE_MULTIGPU=1) but the test runs outside torchrun or cannot see them.
* ``lib``: needs liblfce.so. Never skipped: if the library is missing the test
  errors with the paths tried and how to build it.

A test or module that needs an optional dependency (PyTorch 2.4+, transformers, matplotlib)
skips itself with ``pytest.skip(missing_dependency(reason))`` where it is absent; that FAILS
instead where LFCE_REQUIRE_OPTIONAL_DEPS=1 (ctest's python.cpu.torch sets it: that run
exists to have them).

The package under test is the one in this checkout (python/), not an installed copy; the
benchmark harness (bench/, run from a checkout) is imported from the repository root.

Numeric tests report what they measured through the ``record_error`` fixture: each
value becomes a JUnit XML property (``<tensor>.rel_l2``, ``.elementwise``, ``.row``:
the worst elementwise and per-row error as a fraction of its bound) and a line of the
summary printed at the end of the run, so the tolerances in checks.py can be tuned
from one GPU run.
"""

import os
import sys

import pytest

REPO = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
sys.path.insert(0, REPO)  # the benchmark harness, bench/ (not part of the package)
sys.path.insert(0, os.path.join(REPO, "python"))

import torch

from lfce import _lib


def pytest_configure(config):
    config.addinivalue_line("markers", "gpu: needs a CUDA GPU (fails instead of skipping on a GPU machine)")
    config.addinivalue_line("markers", "lib: needs liblfce.so (errors, never skips, when it is missing)")
    config.addinivalue_line("markers", "multigpu: needs 2 CUDA GPUs under torchrun (fails instead of skipping on a "
                                       "2-GPU machine)")


def missing_dependency(reason):
    """The reason, for the caller's module-level skip; fails instead where LFCE_REQUIRE_OPTIONAL_DEPS=1."""
    if os.environ.get("LFCE_REQUIRE_OPTIONAL_DEPS") == "1":
        pytest.fail(f"{reason}; this run must have it (LFCE_REQUIRE_OPTIONAL_DEPS=1)", pytrace=False)
    return reason


def _gpu_expected():
    return os.path.exists("/dev/nvidia0") or os.environ.get("LFCE_REQUIRE_GPU") == "1"


def one_gpu_world():
    """LFCE_MULTIGPU_ONE_GPU=1: the multi-GPU tests' processes share GPU 0 and talk over gloo (CUDA
    tensors; lfce.distributed's gloo path), so that a machine with one GPU runs the shard kernels of
    every rank. NCCL needs a GPU a process: its own path is not run then."""
    return os.environ.get("LFCE_MULTIGPU_ONE_GPU") == "1"


def _multigpu_setup():
    gpus = torch.cuda.device_count() if torch.cuda.is_available() else 0
    world = int(os.environ.get("WORLD_SIZE", "1"))
    if (gpus >= 2 or one_gpu_world() and gpus >= 1) and world >= 2:
        return
    expected = os.path.exists("/dev/nvidia1") or gpus >= 2 or os.environ.get("LFCE_REQUIRE_MULTIGPU") == "1"
    if not expected:
        pytest.skip(f"needs 2 CUDA GPUs (found {gpus})")
    if world < 2:
        pytest.fail("multi-GPU tests run under torchrun, one process a GPU: bash scripts/multigpu_tests.sh <results "
                    f"dir> (this process is not in a torchrun world: WORLD_SIZE={world})", pytrace=False)
    pytest.fail(f"this machine should have 2 GPUs but torch sees {gpus} (torch {torch.__version__}, CUDA build "
                f"{torch.version.cuda})", pytrace=False)


@pytest.hookimpl(tryfirst=True)
def pytest_runtest_setup(item):
    if item.get_closest_marker("multigpu") is not None:
        _multigpu_setup()
    if item.get_closest_marker("gpu") is None or torch.cuda.is_available():
        return
    if _gpu_expected():
        pytest.fail("this machine should have a GPU (/dev/nvidia0 exists or LFCE_REQUIRE_GPU=1) but "
                    f"torch.cuda.is_available() is False (torch {torch.__version__}, "
                    f"CUDA build {torch.version.cuda})", pytrace=False)
    pytest.skip("no CUDA GPU")


@pytest.fixture(scope="session")
def lib():
    """The loaded liblfce.so; raises (the test errors) with the paths tried if it is missing."""
    return _lib.load()


@pytest.fixture(autouse=True)
def _load_library_for_marked_tests(request):
    if any(request.node.get_closest_marker(name) is not None for name in ("lib", "gpu", "multigpu")):
        request.getfixturevalue("lib")


@pytest.fixture(autouse=True)
def _give_back_cached_gpu_memory(request):
    """With LFCE_TEST_SHARED_GPU=1 (scripts/gpu_tests.sh running several pytest processes on one GPU),
    each GPU test hands the blocks PyTorch's allocator cached back to the driver, so that one
    process's largest test does not keep memory the others need."""
    yield
    if os.environ.get("LFCE_TEST_SHARED_GPU") == "1" and request.node.get_closest_marker("gpu") is not None \
            and torch.cuda.is_available():
        torch.cuda.empty_cache()


_MEASURED = []  # (test id, tensor, metrics) for the end-of-run summary


@pytest.fixture
def record_error(request, record_property):
    """A callable (tensor name, metrics from checks.measure) that records the measured error."""
    def record(name, metrics):
        _MEASURED.append((request.node.nodeid, name, metrics))
        for key in ("rel_l2", "rounding", "elementwise", "row"):
            if metrics.get(key) is not None:
                record_property(f"{name}.{key}", f"{metrics[key]:.4g}")
    return record


def pytest_terminal_summary(terminalreporter):
    if not _MEASURED:
        return
    terminalreporter.section("measured errors (elementwise, row: worst error / its bound)")
    for nodeid, name, m in _MEASURED:
        row = "-" if m.get("row") is None else "{:.3g}".format(m["row"])
        terminalreporter.write_line("%-9.3g %-9.3g %-9s %-16s %s" % (m["rel_l2"], m["elementwise"], row, name,
                                                                     nodeid.split("::")[-1]))
