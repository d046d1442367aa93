"""lfce: fused linear + cross-entropy GPU kernels, generated at run time.

    import lfce
    loss = lfce.linear_cross_entropy(hidden, lm_head.weight, labels)   # [N, H], [V, H], [N]
    loss.backward()

The [tokens, vocab] logits are never materialised; the loss is fp32. Kernel generation
(``lfce.generate``) needs neither a GPU nor PyTorch; the loss needs PyTorch, and a GPU for CUDA
tensors (CPU tensors, fp64 too, compute the same function in PyTorch). The options can also
travel as one checked value, ``lfce.LossOptions(...)``, passed as ``options=``. Also:
``lfce.compat.liger`` / ``lfce.compat.cce`` (drop-in entry points of Liger-Kernel and Cut
Cross-Entropy) and ``lfce.transformers.apply_lfce`` (Hugging Face causal LMs).
"""

from __future__ import annotations

from .cache import (
    cache_dir,
    kernel_load_stats,
    precompile,
    reload_options,
    set_cache_dir,
    tune,
)
from .errors import (
    ArgumentTypeError,
    CacheError,
    CompileError,
    CudaError,
    InternalError,
    InvalidArgumentError,
    LfceError,
    LibraryError,
    OutOfResources,
    ProcessGroupError,
    UnsupportedError,
    UsageError,
)
from .kernels import generate
from .options import LossOptions

__version__ = "0.1.0"

# The public API (docs/architecture.md, "The Python package", lists the same names).
__all__ = [
    "ArgumentTypeError",
    "CacheError",
    "CompileError",
    "CudaError",
    "InternalError",
    "InvalidArgumentError",
    "LfceError",
    "LibraryError",
    "LinearCrossEntropyLoss",
    "LossOptions",
    "LossOutput",
    "OutOfResources",
    "ProcessGroupError",
    "UnsupportedError",
    "UsageError",
    "__version__",
    "cache_dir",
    "generate",
    "generator_version",
    "kernel_load_stats",
    "library_version",
    "linear_cross_entropy",
    "precompile",
    "reload_options",
    "set_cache_dir",
    "set_log_level",
    "tune",
]

try:
    import torch as _torch  # noqa: F401  (only whether it imports)

    _HAVE_TORCH = True
except ImportError:  # generate() and `python -m lfce` still work without PyTorch
    _HAVE_TORCH = False

if _HAVE_TORCH:  # mypy checks this branch (pyproject.toml: always_true)
    from .functional import LossOutput, linear_cross_entropy
    from .nn import LinearCrossEntropyLoss
else:
    def linear_cross_entropy(*args, **kwargs):
        """Unavailable: PyTorch is not installed."""
        raise ImportError("lfce.linear_cross_entropy needs PyTorch, which is not installed")

    class LinearCrossEntropyLoss:
        """Unavailable: PyTorch is not installed."""

        def __init__(self, *args, **kwargs):
            raise ImportError("lfce.LinearCrossEntropyLoss needs PyTorch, which is not installed")

    class LossOutput:
        """Unavailable: PyTorch is not installed."""

        def __init__(self, *args, **kwargs):
            raise ImportError("lfce.LossOutput needs PyTorch, which is not installed")


def set_log_level(level: str) -> None:
    """Set liblfce's log level: "trace", "debug", "info", "warn", "error" or "off"."""
    from . import _check, _lib

    _lib.check(_lib.load().lfce_set_log_level(_check.text("level", level)))


def library_version() -> str:
    """Version string reported by the loaded liblfce.so."""
    from . import _lib

    return str(_lib.load().lfce_version().decode())


def generator_version() -> str:
    """Version of liblfce.so's kernel generator (a hash of its sources; it keys the kernel cache)."""
    from . import _lib

    return _lib.generator_version()
