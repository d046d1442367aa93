"""The handshake at load: a library built from another lfce.h is refused with a message naming
both versions and the library's path, before any struct crosses into it (no GPU needed)."""

import ctypes
import re

import pytest

from lfce import _lib


def raises(exception, *fragments):
    return pytest.raises(exception, match=".*".join(re.escape(f) for f in fragments))


@pytest.fixture
def reload(monkeypatch):
    """load() again from scratch; the loaded library comes back after the test."""
    path = _lib.load()._name
    monkeypatch.setattr(_lib, "_lib", None)
    return path


def test_load_refuses_a_library_of_another_abi_version(monkeypatch, reload):
    monkeypatch.setattr(_lib, "ABI_VERSION", _lib.ABI_VERSION + 1)
    with raises(OSError, reload, f"library ABI version {_lib.ABI_VERSION - 1}",
                f"needs ABI version {_lib.ABI_VERSION}", "rebuild"):
        _lib.load()
    assert _lib._lib is None, "a refused library must not be kept"


class ShortProblem(ctypes.Structure):
    _fields_ = _lib.Problem._fields_[:-1]


def test_load_refuses_a_struct_of_another_size(monkeypatch, reload):
    monkeypatch.setitem(_lib.STRUCTS, "lfce_problem", ShortProblem)
    with raises(OSError, reload, "lfce_problem", f"{ctypes.sizeof(_lib.Problem)} bytes in the library",
                f"{ctypes.sizeof(ShortProblem)} bytes in lfce/_lib.py"):
        _lib.load()


def _swapped(struct, first, second):
    """A copy of the mirror `struct` with fields `first` and `second` (one size) swapped."""
    fields = list(struct._fields_)
    names = [field for field, *_ in fields]
    i, j = names.index(first), names.index(second)
    fields[i], fields[j] = fields[j], fields[i]
    return type("Swapped" + struct.__name__, (ctypes.Structure,), {"_fields_": fields})


@pytest.mark.parametrize("first, second", [("reduction", "mode"), ("softcap", "temperature")])
def test_load_refuses_a_mirror_with_two_fields_of_one_size_swapped(monkeypatch, reload, first, second):
    swapped = _swapped(_lib.Problem, first, second)
    assert ctypes.sizeof(swapped) == ctypes.sizeof(_lib.Problem)  # the size check cannot see it
    offset = getattr(_lib.Problem, first).offset
    monkeypatch.setitem(_lib.STRUCTS, "lfce_problem", swapped)
    with raises(OSError, reload, f"struct lfce_problem: field {first} at offset {offset} in the library",
                f"field {second} there in lfce/_lib.py"):
        _lib.load()


def _libc_path():
    with open("/proc/self/maps") as maps:
        for line in maps:
            match = re.search(r"(/\S*/libc\.so\.6)$", line.strip())
            if match:
                return match.group(1)
    pytest.fail("libc.so.6 is not mapped in this process")


def test_load_names_a_library_without_the_handshake(monkeypatch, reload):
    libc = _libc_path()  # a shared library without lfce_abi_version stands in for an old liblfce.so
    monkeypatch.setenv("LFCE_LIBRARY", libc)
    with raises(OSError, libc, "no lfce_abi_version", f"needs ABI version {_lib.ABI_VERSION}"):
        _lib.load()


def test_every_mirrored_struct_has_the_library_size():
    lib = _lib.load()
    for name, struct in _lib.STRUCTS.items():
        size = ctypes.c_size_t(0)
        _lib.check(lib.lfce_struct_size(name.encode(), ctypes.byref(size)))
        assert size.value == ctypes.sizeof(struct), name


def test_struct_size_names_an_unknown_struct():
    size = ctypes.c_size_t(0)
    with raises(ValueError, "lfce_struct_size", "'lfce_nothing'"):
        _lib.check(_lib.load().lfce_struct_size(b"lfce_nothing", ctypes.byref(size)))


def test_every_mirrored_struct_has_the_library_layout():
    lib = _lib.load()
    for name, struct in _lib.STRUCTS.items():
        assert _lib._layout_mismatch(lib.lfce_struct_layout, name, struct) is None, name


def test_struct_layout_names_an_unknown_struct():
    callback = _lib.FIELD_CALLBACK(lambda *_: None)
    with raises(ValueError, "lfce_struct_layout", "'lfce_nothing'"):
        _lib.check(_lib.load().lfce_struct_layout(b"lfce_nothing", callback, None))
