"""``python3 -m lfce.bench``: see the package docstring or ``--help``."""

import sys

from . import main

sys.exit(main())
