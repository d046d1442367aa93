"""Every exception lfce raises on purpose is an lfce.LfceError, and still the built-in exception a
caller caught before (ValueError, TypeError, OSError, RuntimeError, NotImplementedError): one
test per class, each raised by lfce itself where the CPU can make it happen, else by the status
of the C library that maps to it."""

import ctypes.util
import os
import pickle

import pytest
import torch

import lfce
from lfce import _bridge, _lib
from lfce.compat import liger


def inputs():
    return torch.randn(4, 16), torch.randn(10, 16), torch.randint(0, 10, (4,))


def caught(call, builtin):
    """The exception ``call`` raises, checked to be an lfce.LfceError and a ``builtin``."""
    with pytest.raises(lfce.LfceError) as info:
        call()
    assert isinstance(info.value, builtin), f"{type(info.value).__name__} is not a {builtin.__name__}"
    return info.value


def test_a_bad_value_is_an_invalid_argument_error_and_a_value_error():
    error = caught(lambda: lfce.linear_cross_entropy(*inputs(), reduction="avg"), ValueError)
    assert type(error) is lfce.InvalidArgumentError and "reduction" in str(error)


def test_a_value_of_the_wrong_type_is_an_argument_type_error_and_a_type_error():
    error = caught(lambda: lfce.linear_cross_entropy(*inputs(), chunk_size=True), TypeError)
    assert type(error) is lfce.ArgumentTypeError and "chunk_size" in str(error)


def test_an_option_lfce_lacks_is_an_unsupported_error_and_a_not_implemented_error():
    error = caught(lambda: liger.LigerFusedLinearCrossEntropyLoss(accum_dtype=torch.float16), NotImplementedError)
    assert type(error) is lfce.UnsupportedError and "accum_dtype" in str(error)


def test_the_library_rejecting_an_argument_is_an_invalid_argument_error():
    problem = _lib.make_problem(tokens=8, hidden=16, vocab=0, dtype=_lib.DTYPE_BF16)
    error = caught(lambda: _lib.check(_lib.load().lfce_check_problem(ctypes.byref(problem))), ValueError)
    assert type(error) is lfce.InvalidArgumentError and "vocab" in str(error)


def test_a_gpu_with_too_little_shared_memory_is_out_of_resources_with_its_numbers(tmp_path):
    """Precompiling for a GPU whose shared memory per block is below every tile of a kernel: an
    OutOfResources (a ValueError, as this was before) carrying the resource, the bytes the
    smallest tile needs and the limit; that many bytes then suffice, one byte less does not."""
    previous = lfce.cache_dir()
    lfce.set_cache_dir(str(tmp_path))
    try:
        error = caught(lambda: lfce.precompile(vocab=1000, hidden=64, archs="sm_80", tokens=64, smem_per_block=1024),
                       ValueError)
        assert type(error) is lfce.OutOfResources
        assert (error.resource, error.limit) == ("shared memory per block", 1024) and error.required > 1024
        assert "shared memory per block = 1024 bytes" in str(error) and f"at least {error.required}" in str(error)
        assert pickle.loads(pickle.dumps(error)).required == error.required
        lfce.precompile(vocab=1000, hidden=64, archs="sm_80", tokens=64, smem_per_block=error.required)
        short = caught(lambda: lfce.precompile(vocab=1000, hidden=64, archs="sm_80", tokens=64,
                                               smem_per_block=error.required - 1), ValueError)
        assert (short.required, short.limit) == (error.required, error.required - 1)
    finally:
        lfce.set_cache_dir(previous)


@pytest.fixture
def reload(monkeypatch):
    """load() again from scratch; the loaded library comes back after the test."""
    path = _lib.load()._name
    monkeypatch.setattr(_lib, "_lib", None)
    return path


def test_a_missing_library_is_a_library_error_and_an_os_error(monkeypatch, reload, tmp_path):
    missing = str(tmp_path / "liblfce.so")
    monkeypatch.setenv("LFCE_LIBRARY", missing)
    error = caught(_lib.load, OSError)
    assert type(error) is lfce.LibraryError and missing in str(error) and "LFCE_LIBRARY" in str(error)


def test_a_library_of_another_abi_is_a_library_error(monkeypatch, reload):
    libc = ctypes.util.find_library("c")
    stand_in = next(p for p in ("/lib/x86_64-linux-gnu/libc.so.6", "/usr/lib/x86_64-linux-gnu/libc.so.6", libc or "")
                    if p and os.path.isfile(p))
    monkeypatch.setenv("LFCE_LIBRARY", stand_in)  # a shared library without lfce_abi_version
    error = caught(_lib.load, OSError)
    assert type(error) is lfce.LibraryError and "lfce_abi_version" in str(error)


@pytest.mark.parametrize("status, cls, builtin", [
    ("ERR_COMPILE", lfce.CompileError, RuntimeError),
    ("ERR_CUDA", lfce.CudaError, RuntimeError),
    ("ERR_IO", lfce.CacheError, OSError),
    (99, lfce.InternalError, RuntimeError),
])
def test_each_library_status_is_its_lfce_error(status, cls, builtin):
    code = getattr(_lib, status) if isinstance(status, str) else status
    error = caught(lambda: _lib.check(code), builtin)
    assert type(error) is cls


def test_a_missing_process_group_is_a_process_group_error(monkeypatch):
    import torch.distributed as dist

    import lfce.distributed as lfce_dist

    monkeypatch.setattr(lfce_dist.functional, "_DEVICE_TYPE", "cpu")
    assert not dist.is_initialized()
    error = caught(lambda: lfce_dist.linear_cross_entropy(*inputs()), RuntimeError)
    assert type(error) is lfce.ProcessGroupError and "init_process_group" in str(error)


def test_a_first_call_inside_graph_capture_is_a_usage_error(monkeypatch):
    monkeypatch.setattr(torch.cuda, "is_current_stream_capturing", lambda: True)
    problem = _lib.make_problem(tokens=8, hidden=16, vocab=10, dtype=_lib.DTYPE_BF16)
    error = caught(lambda: _bridge._require_loaded(("never loaded",), problem, "forward"), RuntimeError)
    assert type(error) is lfce.UsageError and "warm-up" in str(error)


def test_every_public_error_class_derives_from_lfce_error():
    for name in lfce.errors.__all__:
        assert issubclass(getattr(lfce, name), lfce.LfceError), name
        assert name in lfce.__all__, name
