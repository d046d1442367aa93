"""Output-layer shapes of common models: name -> (hidden size, vocabulary size).

The table lives in the library (runtime/presets.cpp), shared with the `lfce` command line.
It is read on first use (``table()``, or the module attribute ``PRESETS``), so importing
this module, and ``python -m lfce --help``, work without the library.
"""

import functools

from . import _lib


@functools.cache
def table():
    """The presets: name -> (hidden size, vocabulary size); loads the library."""
    return _lib.presets()


def __getattr__(name):  # PEP 562: PRESETS is computed when first read
    if name == "PRESETS":
        return table()
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
