"""Output-layer shapes of common models: name -> (hidden size, vocabulary size).

The table lives in the library (runtime/presets.cpp), shared with the `lfce` command line.
"""

from ._lib import presets as _presets

PRESETS = _presets()
