"""``python3 -m bench``: see the package docstring or ``--help``."""

import sys

from . import main

sys.exit(main())
