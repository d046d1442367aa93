"""lfce: fused linear + cross-entropy GPU kernels, generated at run time.

    import lfce
    loss = lfce.linear_cross_entropy(hidden, lm_head.weight, labels)   # [N, H], [V, H], [N]
    loss.backward()

The [tokens, vocab] logits are never materialised; the loss is fp32. Kernel generation
(``lfce.generate``) needs neither a GPU nor PyTorch; the loss needs both. Also:
``lfce.compat.liger`` / ``lfce.compat.cce`` (drop-in entry points of Liger-Kernel and Cut
Cross-Entropy) and ``lfce.transformers.apply_lfce`` (Hugging Face causal LMs).
"""

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
    ProcessGroupError,
    UnsupportedError,
    UsageError,
)
from .kernels import generate

__version__ = "0.1.0"

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
    "LossOutput",
    "ProcessGroupError",
    "UnsupportedError",
    "UsageError",
    "__version__",
    "cache_dir",
    "generate",
    "generator_version",
    "kernel_load_stats",
    "linear_cross_entropy",
    "precompile",
    "reload_options",
    "set_cache_dir",
    "set_log_level",
    "tune",
]

try:
    import torch as _torch
except ImportError:  # generate() and `python -m lfce` still work without PyTorch
    _torch = None

if _torch is not None:
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


def set_log_level(level):
    """Set liblfce's log level: "trace", "debug", "info", "warn", "error" or "off"."""
    from . import _check, _lib

    _lib.check(_lib.load().lfce_set_log_level(_check.text("level", level)))


def library_version():
    """Version string reported by the loaded liblfce.so."""
    from . import _lib

    return _lib.load().lfce_version().decode()


def generator_version():
    """Version of liblfce.so's kernel generator (a hash of its sources; it keys the kernel cache)."""
    from . import _lib

    return _lib.generator_version()
