"""Entry point of lfce's benchmark harness, python/lfce/bench/ (``python3 -m lfce.bench``).

    python3 bench/lfce_bench.py --out bench/results/

Kept so the command in older notes and results still runs; see ``--help`` for the options.
"""

import os
import sys

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "python"))

from lfce.bench import main

if __name__ == "__main__":
    sys.exit(main())
