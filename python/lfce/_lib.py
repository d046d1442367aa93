"""ctypes binding of liblfce.so: a field-for-field mirror of include/lfce/lfce.h.

Nothing here imports torch, so kernel generation (``lfce.generate``) and the
offline report of ``python -m lfce`` work on a machine without PyTorch or a GPU.

The library is loaded on first use (``load()``), from the first of:

1. the path in the environment variable ``LFCE_LIBRARY``;
2. ``liblfce.so`` next to this file (an installed package);
3. ``<repo>/build/liblfce.so``, the CMake build tree of a source checkout.
"""

import ctypes
import os
import threading

from . import _check
from .errors import (
    CacheError,
    CompileError,
    CudaError,
    InternalError,
    InvalidArgumentError,
    LibraryError,
    OutOfResources,
)

__all__ = [
    "KERNEL_CALLBACK",
    "BackwardArgs",
    "CompileError",
    "CudaError",
    "ForwardArgs",
    "KernelInfo",
    "Problem",
    "check",
    "library_candidates",
    "load",
]

# LFCE_ABI_VERSION of the lfce.h this file mirrors: bump both together.
ABI_VERSION = 11

# lfce_status
OK = 0
ERR_INVALID_ARGUMENT = 1
ERR_COMPILE = 2
ERR_CUDA = 3
ERR_INTERNAL = 4
ERR_IO = 5
ERR_OUT_OF_RESOURCES = 6

# lfce_dtype
DTYPE_BF16 = 0
DTYPE_FP16 = 1
DTYPE_FP32 = 2

# lfce_index_dtype
INDEX_INT64 = 0
INDEX_INT32 = 1

# lfce_reduction
REDUCTION_MEAN = 0
REDUCTION_SUM = 1
REDUCTION_NONE = 2

# lfce_mode
MODE_RECOMPUTE = 0
MODE_EAGER = 1

# lfce_output: flags of lfce_problem.outputs, the forward's extra per-token outputs
OUTPUT_ENTROPY = 1    # a row of lse: -sum_v p_v log p_v (differentiable through grad_lse)
OUTPUT_LOGPROB = 2    # a row of lse: log p_y of the target (differentiable through grad_lse)
OUTPUT_PREDICTED = 4  # lfce_forward_args.predicted: argmax ids, -1 for ignored tokens
OUTPUTS_ALL = OUTPUT_ENTROPY | OUTPUT_LOGPROB | OUTPUT_PREDICTED

DTYPES = {"bf16": DTYPE_BF16, "fp16": DTYPE_FP16, "fp32": DTYPE_FP32}
REDUCTIONS = {"mean": REDUCTION_MEAN, "sum": REDUCTION_SUM, "none": REDUCTION_NONE}
MODES = {"recompute": MODE_RECOMPUTE, "eager": MODE_EAGER}

BUILD_HINT = "build it with `cmake -S . -B build && cmake --build build` in the repository root"


class Problem(ctypes.Structure):
    """struct lfce_problem."""

    _fields_ = [
        ("tokens", ctypes.c_int64),
        ("hidden", ctypes.c_int64),
        ("vocab", ctypes.c_int64),
        ("dtype", ctypes.c_int32),
        ("target_dtype", ctypes.c_int32),
        ("has_bias", ctypes.c_int32),
        ("reduction", ctypes.c_int32),
        ("mode", ctypes.c_int32),
        ("softcap", ctypes.c_float),
        ("temperature", ctypes.c_float),
        ("z_loss_scale", ctypes.c_float),
        ("label_smoothing", ctypes.c_float),
        ("has_class_weight", ctypes.c_int32),
        ("accumulate_grad_weight", ctypes.c_int32),  # 1: grad_weight is an fp32 buffer added to
        ("accumulate_grad_bias", ctypes.c_int32),  # 1: grad_bias likewise
        ("token_scaling", ctypes.c_int32),  # 1: each token's loss and gradient times its p(target); a row of lse
        ("outputs", ctypes.c_int32),  # a sum of OUTPUT_* flags (0: none)
        ("ignore_index", ctypes.c_int64),
        ("chunk_size", ctypes.c_int64),
        ("workspace_budget", ctypes.c_int64),
        ("sequence_length", ctypes.c_int64),  # T: causal shift over sequences of T tokens (0: none)
    ]


class ForwardArgs(ctypes.Structure):
    """struct lfce_forward_args."""

    _fields_ = [
        ("hidden", ctypes.c_void_p),
        ("weight", ctypes.c_void_p),
        ("bias", ctypes.c_void_p),
        ("targets", ctypes.c_void_p),
        ("class_weight", ctypes.c_void_p),  # const float*, [vocab]; NULL unless has_class_weight
        ("lse", ctypes.c_void_p),  # float*: [lse_rows() * tokens]
        ("token_loss", ctypes.c_void_p),  # float*
        ("loss", ctypes.c_void_p),  # float*
        ("valid_count", ctypes.c_void_p),  # float*: [1], or [3] with has_class_weight
        ("predicted", ctypes.c_void_p),  # int64_t*: [tokens] with OUTPUT_PREDICTED, else NULL
        ("workspace", ctypes.c_void_p),
        ("workspace_bytes", ctypes.c_size_t),
        ("device", ctypes.c_int32),
        ("stream", ctypes.c_void_p),
    ]


class BackwardArgs(ctypes.Structure):
    """struct lfce_backward_args."""

    _fields_ = [
        ("hidden", ctypes.c_void_p),
        ("weight", ctypes.c_void_p),
        ("bias", ctypes.c_void_p),
        ("targets", ctypes.c_void_p),
        ("class_weight", ctypes.c_void_p),  # const float*, as given to the forward
        ("lse", ctypes.c_void_p),  # const float*
        ("valid_count", ctypes.c_void_p),  # const float*
        ("grad_loss", ctypes.c_void_p),  # const float*; NULL means 1
        ("grad_lse", ctypes.c_void_p),  # const float*, laid out like lse; NULL: none (not with fp16)
        ("grad_hidden", ctypes.c_void_p),
        ("grad_weight", ctypes.c_void_p),  # in dtype, or float* added to with accumulate_grad_weight
        ("grad_bias", ctypes.c_void_p),  # in dtype, or float* added to with accumulate_grad_bias
        ("workspace", ctypes.c_void_p),
        ("workspace_bytes", ctypes.c_size_t),
        ("device", ctypes.c_int32),
        ("stream", ctypes.c_void_p),
    ]


class KernelInfo(ctypes.Structure):
    """struct lfce_kernel_info; its pointers live only during the callback."""

    _fields_ = [
        ("name", ctypes.c_char_p),
        ("spec", ctypes.c_char_p),
        ("ptx", ctypes.c_char_p),
        ("ptx_size", ctypes.c_size_t),
        ("compile_ms", ctypes.c_double),
        ("smem_bytes", ctypes.c_uint32),
        ("threads", ctypes.c_uint32),
    ]


KERNEL_CALLBACK = ctypes.CFUNCTYPE(None, ctypes.POINTER(KernelInfo), ctypes.c_void_p)


class Precompiled(ctypes.Structure):
    """lfce_precompiled."""

    _fields_ = [
        ("name", ctypes.c_char_p),
        ("spec", ctypes.c_char_p),
        ("key", ctypes.c_char_p),
        ("cache_hit", ctypes.c_int32),
        ("compile_ms", ctypes.c_double),
        ("elapsed_ms", ctypes.c_double),
        ("ptx_size", ctypes.c_size_t),
    ]


class KernelLoad(ctypes.Structure):
    """lfce_kernel_load."""

    _fields_ = [
        ("spec", ctypes.c_char_p),
        ("device", ctypes.c_int32),
        ("source", ctypes.c_char_p),
        ("llvm_ms", ctypes.c_double),
        ("jit_ms", ctypes.c_double),
        ("disk_ms", ctypes.c_double),
        ("load_ms", ctypes.c_double),
        ("total_ms", ctypes.c_double),
        ("registers", ctypes.c_int32),
        ("local_bytes", ctypes.c_int32),
    ]


TUNE_PROGRESS = ctypes.CFUNCTYPE(None, ctypes.c_int64, ctypes.c_int64, ctypes.c_double, ctypes.c_char_p,
                                 ctypes.c_char_p, ctypes.c_void_p)


class TuneOptions(ctypes.Structure):
    """lfce_tune_options."""

    _fields_ = [
        ("device", ctypes.c_int32),
        ("space", ctypes.c_char_p),
        ("budget_minutes", ctypes.c_double),
        ("verify", ctypes.c_int32),
        ("repetitions", ctypes.c_int32),
        ("progress", TUNE_PROGRESS),
        ("user", ctypes.c_void_p),
    ]


class TuneResult(ctypes.Structure):
    """lfce_tune_result."""

    _fields_ = [
        ("kernel", ctypes.c_char_p),
        ("default_config", ctypes.c_char_p),
        ("winner", ctypes.c_char_p),
        ("default_ms", ctypes.c_double),
        ("winner_ms", ctypes.c_double),
        ("speedup", ctypes.c_double),
        ("measured", ctypes.c_int32),
        ("reused", ctypes.c_int32),
        ("failed", ctypes.c_int32),
        ("rejected", ctypes.c_int32),
        ("path", ctypes.c_char_p),
    ]


TUNE_CALLBACK = ctypes.CFUNCTYPE(None, ctypes.POINTER(TuneResult), ctypes.c_void_p)
PRECOMPILE_CALLBACK = ctypes.CFUNCTYPE(None, ctypes.POINTER(Precompiled), ctypes.c_void_p)


class DeviceLimits(ctypes.Structure):
    """lfce_device_limits."""

    _fields_ = [
        ("sm_count", ctypes.c_int32),
        ("smem_per_block", ctypes.c_int32),
    ]
KERNEL_LOAD_CALLBACK = ctypes.CFUNCTYPE(None, ctypes.POINTER(KernelLoad), ctypes.c_void_p)

# The structs passed by pointer, by their name in lfce.h: their sizes are checked at load.
STRUCTS = {
    "lfce_problem": Problem,
    "lfce_forward_args": ForwardArgs,
    "lfce_backward_args": BackwardArgs,
    "lfce_kernel_info": KernelInfo,
    "lfce_precompiled": Precompiled,
    "lfce_device_limits": DeviceLimits,
    "lfce_kernel_load": KernelLoad,
    "lfce_tune_options": TuneOptions,
    "lfce_tune_result": TuneResult,
}

# lfce_field_callback: (field, offset, size, user).
FIELD_CALLBACK = ctypes.CFUNCTYPE(None, ctypes.c_char_p, ctypes.c_size_t, ctypes.c_size_t, ctypes.c_void_p)

_P = ctypes.POINTER
# name -> (restype, argtypes), in the order of lfce.h.
_SIGNATURES = {
    "lfce_version": (ctypes.c_char_p, []),
    "lfce_abi_version": (ctypes.c_int, []),
    "lfce_struct_size": (ctypes.c_int, [ctypes.c_char_p, _P(ctypes.c_size_t)]),
    "lfce_struct_layout": (ctypes.c_int, [ctypes.c_char_p, FIELD_CALLBACK, ctypes.c_void_p]),
    "lfce_last_error": (ctypes.c_char_p, []),
    "lfce_last_resource_error": (ctypes.c_int, [_P(ctypes.c_char_p), _P(ctypes.c_int64), _P(ctypes.c_int64)]),
    "lfce_set_log_level": (ctypes.c_int, [ctypes.c_char_p]),
    "lfce_check_problem": (ctypes.c_int, [_P(Problem)]),
    "lfce_forward_workspace_size": (ctypes.c_int, [_P(Problem), _P(ctypes.c_size_t)]),
    "lfce_backward_workspace_size": (ctypes.c_int, [_P(Problem), _P(ctypes.c_size_t)]),
    "lfce_backward_chunk_size": (ctypes.c_int, [_P(Problem), _P(ctypes.c_int64)]),
    "lfce_forward": (ctypes.c_int, [_P(Problem), _P(ForwardArgs)]),
    "lfce_backward": (ctypes.c_int, [_P(Problem), _P(BackwardArgs)]),
    "lfce_forward_backward_workspace_size": (ctypes.c_int, [_P(Problem), _P(ctypes.c_size_t)]),
    "lfce_forward_backward": (ctypes.c_int, [_P(Problem), _P(ForwardArgs), ctypes.c_void_p, ctypes.c_void_p,
                                             ctypes.c_void_p]),
    "lfce_scale_gradient": (ctypes.c_int, [ctypes.c_int32, ctypes.c_void_p, ctypes.c_void_p, ctypes.c_int64,
                                           ctypes.c_void_p, ctypes.c_int32, ctypes.c_void_p]),
    "lfce_eager_schedule": (ctypes.c_int, [_P(Problem), _P(ctypes.c_int32), _P(ctypes.c_int64)]),
    "lfce_generate": (ctypes.c_int, [_P(Problem), ctypes.c_char_p, KERNEL_CALLBACK, ctypes.c_void_p]),
    "lfce_cache_dir": (ctypes.c_char_p, []),
    "lfce_set_cache_dir": (ctypes.c_int, [ctypes.c_char_p]),
    "lfce_reload_options": (ctypes.c_int, []),
    "lfce_precompile": (ctypes.c_int, [_P(Problem), ctypes.c_char_p, PRECOMPILE_CALLBACK, ctypes.c_void_p]),
    "lfce_precompile_for": (ctypes.c_int, [_P(Problem), ctypes.c_char_p, _P(DeviceLimits), PRECOMPILE_CALLBACK,
                                           ctypes.c_void_p]),
    "lfce_kernel_load_stats": (ctypes.c_int, [KERNEL_LOAD_CALLBACK, ctypes.c_void_p]),
    "lfce_tune": (ctypes.c_int, [_P(Problem), _P(TuneOptions), TUNE_CALLBACK, ctypes.c_void_p, _P(ctypes.c_int32)]),
    "lfce_plan_is_tuned": (ctypes.c_int, [_P(Problem), ctypes.c_int32, _P(ctypes.c_int32)]),
    "lfce_generator_version": (ctypes.c_char_p, []),
    "lfce_preset_names": (ctypes.c_char_p, []),
    "lfce_preset": (ctypes.c_int, [ctypes.c_char_p, _P(ctypes.c_int64), _P(ctypes.c_int64)]),
    "lfce_compile_count": (ctypes.c_int64, []),
}

_lock = threading.Lock()
_lib = None


def library_candidates():
    """The paths ``load()`` tries, in order."""
    env = os.environ.get("LFCE_LIBRARY")
    if env:
        return [env]  # an explicit choice is never silently replaced by another build
    package_dir = os.path.dirname(os.path.abspath(__file__))
    repo = os.path.dirname(os.path.dirname(package_dir))
    return [os.path.join(package_dir, "liblfce.so"), os.path.join(repo, "build", "liblfce.so")]


def load():
    """Load liblfce.so once and return the ctypes handle with every signature set."""
    global _lib
    if _lib is not None:
        return _lib
    with _lock:
        if _lib is None:
            tried = library_candidates()
            path = next((p for p in tried if os.path.isfile(p)), None)
            if path is None:
                raise LibraryError(
                    "liblfce.so not found; tried " + ", ".join(tried)
                    + " (set LFCE_LIBRARY to its path, or " + BUILD_HINT + ")"
                )
            lib = ctypes.CDLL(path)  # RTLD_LOCAL: keep our LLVM away from Triton's
            _check_abi(lib, path)
            for name, (restype, argtypes) in _SIGNATURES.items():
                fn = getattr(lib, name)
                fn.restype = restype
                fn.argtypes = argtypes
            _lib = lib
    return _lib


def _check_abi(lib, path):
    """Refuse a library built from another lfce.h: its structs and signatures may differ."""
    mismatch = f"{path} was built for another version of this package: "
    hint = "; rebuild the library from the same checkout as this package (" + BUILD_HINT + ")"
    try:
        abi_version = lib.lfce_abi_version
    except AttributeError:
        raise LibraryError(mismatch + "it has no lfce_abi_version (it predates ABI version 1), this package "
                           f"needs ABI version {ABI_VERSION}" + hint) from None
    abi_version.restype, abi_version.argtypes = ctypes.c_int, []
    found = abi_version()
    if found != ABI_VERSION:
        raise LibraryError(mismatch + f"library ABI version {found}, this package needs ABI version {ABI_VERSION}"
                           + hint)
    struct_size = lib.lfce_struct_size
    struct_size.restype, struct_size.argtypes = _SIGNATURES["lfce_struct_size"]
    for name, struct in STRUCTS.items():
        size = ctypes.c_size_t(0)
        if struct_size(name.encode(), ctypes.byref(size)) != OK or size.value != ctypes.sizeof(struct):
            raise LibraryError(mismatch + f"struct {name} is {size.value} bytes in the library and "
                               f"{ctypes.sizeof(struct)} bytes in lfce/_lib.py (both at ABI version {ABI_VERSION})"
                               + hint)
    try:
        struct_layout = lib.lfce_struct_layout
    except AttributeError:
        raise LibraryError(mismatch + "it has no lfce_struct_layout, by which this package checks its struct "
                           "mirrors field by field" + hint) from None
    struct_layout.restype, struct_layout.argtypes = _SIGNATURES["lfce_struct_layout"]
    for name, struct in STRUCTS.items():
        problem = _layout_mismatch(struct_layout, name, struct)
        if problem:
            raise LibraryError(mismatch + f"struct {name}: {problem} (both at ABI version {ABI_VERSION})" + hint)


def _layout_mismatch(struct_layout, name, struct):
    """How the library's layout of struct `name` differs from the mirror `struct`, by field name,
    offset and size in declaration order (None if it does not): swapped fields of one size keep the
    struct's size, not their offsets."""
    library = []
    callback = FIELD_CALLBACK(lambda field, offset, size, _: library.append((field.decode(), offset, size)))
    if struct_layout(name.encode(), callback, None) != OK:
        return "the library reports no layout for it"
    mirror = [(field, getattr(struct, field).offset, getattr(struct, field).size)
              for field, *_ in struct._fields_]
    for (lib_field, lib_offset, lib_size), (field, offset, size) in zip(library, mirror):
        if lib_field != field:
            return (f"field {lib_field} at offset {lib_offset} in the library, field {field} there in "
                    "lfce/_lib.py")
        if (lib_offset, lib_size) != (offset, size):
            return (f"field {field} at offset {lib_offset} ({lib_size} bytes) in the library, at offset "
                    f"{offset} ({size} bytes) in lfce/_lib.py")
    if len(library) != len(mirror):
        longer, where = (library, "the library") if len(library) > len(mirror) else (mirror, "lfce/_lib.py")
        return f"field {longer[min(len(library), len(mirror))][0]} only in {where}"
    return None


def last_error():
    """The message of the last failed lfce call on this thread ("" if none)."""
    message = load().lfce_last_error()
    return message.decode("utf-8", "replace") if message else ""


_EXCEPTIONS = {
    ERR_INVALID_ARGUMENT: InvalidArgumentError,
    ERR_COMPILE: CompileError,
    ERR_CUDA: CudaError,
    ERR_IO: CacheError,
}


def check(status):
    """Raise the exception matching an lfce_status, with lfce_last_error() as its message.

    LFCE_ERR_INVALID_ARGUMENT -> InvalidArgumentError (a ValueError), LFCE_ERR_COMPILE ->
    CompileError, LFCE_ERR_CUDA -> CudaError, LFCE_ERR_IO (the cache's files) -> CacheError (an
    OSError), LFCE_ERR_OUT_OF_RESOURCES -> OutOfResources (with the resource, the amount required
    and the device's limit from lfce_last_resource_error()), anything else (an lfce bug) ->
    InternalError; every one an lfce.LfceError.
    """
    if status == OK:
        return
    message = last_error() or "(no message)"
    if status == ERR_OUT_OF_RESOURCES:
        resource, required, limit = ctypes.c_char_p(), ctypes.c_int64(), ctypes.c_int64()
        if load().lfce_last_resource_error(ctypes.byref(resource), ctypes.byref(required), ctypes.byref(limit)) != OK:
            raise InternalError(f"lfce internal error: status {status} without its numbers: {message}")
        raise OutOfResources(message, required=required.value, limit=limit.value,
                             resource=(resource.value or b"").decode("utf-8", "replace"))
    if status not in _EXCEPTIONS:
        message = f"lfce internal error (status {status}): {message}"
    raise _EXCEPTIONS.get(status, InternalError)(message)


def make_problem(tokens, hidden, vocab, dtype, target_dtype=INDEX_INT64, has_bias=False,
                 reduction=REDUCTION_MEAN, mode=MODE_RECOMPUTE, ignore_index=-100,
                 chunk_size=None, workspace_budget=None, softcap=None, temperature=1.0, z_loss_scale=0.0,
                 label_smoothing=0.0, has_class_weight=False, accumulate_grad_weight=False,
                 accumulate_grad_bias=False, token_scaling=False, outputs=0, sequence_length=0):
    """Fill an lfce_problem; None for chunk_size / workspace_budget means the library's default,
    None for softcap no softcap; temperature 1, z_loss_scale 0 and label_smoothing 0 are none
    (the library checks the ranges of the four). accumulate_grad_weight / _bias: the backward adds
    into fp32 gradient buffers (recompute mode only). token_scaling: each counted token's loss and
    gradient times its detached p(target); the lse buffer is then [2 * tokens]. outputs: a sum of
    the OUTPUT_* flags (lse_rows() gives the lse buffer's rows). sequence_length: T > 0 for a causal
    shift (each position scored against the next one's target, read in place; tokens a multiple of T).

    Every field is checked to fit its C type (ctypes would wrap it silently); whether the
    values make a valid problem is the library's check (lfce_check_problem).
    """
    wide = {"tokens": tokens, "hidden": hidden, "vocab": vocab, "ignore_index": ignore_index,
            "chunk_size": chunk_size or 0, "workspace_budget": workspace_budget or 0,
            "sequence_length": sequence_length}
    narrow = {"dtype": dtype, "target_dtype": target_dtype, "reduction": reduction, "mode": mode, "outputs": outputs}
    fields = {name: _check.integer(name, value) for name, value in wide.items()}
    fields.update((name, _check.integer(name, value, minimum=_check.INT32_MIN, maximum=_check.INT32_MAX))
                  for name, value in narrow.items())
    return Problem(has_bias=int(bool(has_bias)), softcap=float(softcap or 0.0), temperature=float(temperature),
                   z_loss_scale=float(z_loss_scale), label_smoothing=float(label_smoothing),
                   has_class_weight=int(bool(has_class_weight)),
                   accumulate_grad_weight=int(bool(accumulate_grad_weight)),
                   accumulate_grad_bias=int(bool(accumulate_grad_bias)),
                   token_scaling=int(bool(token_scaling)), **fields)


def lse_rows(token_scaling, outputs):
    """Rows of the forward's lse buffer (lfce.h): the LSEs, then the token scales with token_scaling,
    the entropies with OUTPUT_ENTROPY and the logprobs with OUTPUT_LOGPROB, each row [tokens]."""
    return 1 + bool(token_scaling) + bool(outputs & OUTPUT_ENTROPY) + bool(outputs & OUTPUT_LOGPROB)


def forward_workspace_size(problem):
    size = ctypes.c_size_t(0)
    check(load().lfce_forward_workspace_size(ctypes.byref(problem), ctypes.byref(size)))
    return size.value


def backward_workspace_size(problem):
    size = ctypes.c_size_t(0)
    check(load().lfce_backward_workspace_size(ctypes.byref(problem), ctypes.byref(size)))
    return size.value


def forward_backward_workspace_size(problem):
    size = ctypes.c_size_t(0)
    check(load().lfce_forward_backward_workspace_size(ctypes.byref(problem), ctypes.byref(size)))
    return size.value


def eager_schedule(problem):
    """(three_gemm, token_chunk) of an eager problem: lfce_eager_schedule."""
    three_gemm, chunk = ctypes.c_int32(0), ctypes.c_int64(0)
    check(load().lfce_eager_schedule(ctypes.byref(problem), ctypes.byref(three_gemm), ctypes.byref(chunk)))
    return bool(three_gemm.value), chunk.value


def backward_chunk_size(problem):
    chunk = ctypes.c_int64(0)
    check(load().lfce_backward_chunk_size(ctypes.byref(problem), ctypes.byref(chunk)))
    return chunk.value


def presets():
    """Model presets from the library's table: name -> (hidden size, vocabulary size)."""
    lib = load()
    table = {}
    for name in lib.lfce_preset_names().decode().split(","):
        hidden, vocab = ctypes.c_int64(0), ctypes.c_int64(0)
        check(lib.lfce_preset(name.encode(), ctypes.byref(hidden), ctypes.byref(vocab)))
        table[name] = (hidden.value, vocab.value)
    return table


def generator_version():
    """The kernel generator's version (a hash of its sources) the library was built with."""
    return load().lfce_generator_version().decode()


def plan_is_tuned(problem, device):
    """Whether the problem runs with tuned winners from the cache directory on CUDA device ``device``."""
    device = _check.integer("device", device, minimum=0, maximum=_check.INT32_MAX)
    tuned = ctypes.c_int32(0)
    check(load().lfce_plan_is_tuned(ctypes.byref(problem), device, ctypes.byref(tuned)))
    return bool(tuned.value)
