"""The ``lfce`` console entry point of an installed package: runs the C++ command line shipped in it."""

import os
import sys

from ._lib import BUILD_HINT


def executable():
    """Path of the C++ command line inside the package (installed by `pip install .`)."""
    return os.path.join(os.path.dirname(os.path.abspath(__file__)), "bin", "lfce")


def main():
    path = executable()
    if not os.path.isfile(path):
        sys.exit(f"lfce: the command line is not installed with this package ({path} is missing); install the "
                 f"package with `pip install .` in the repository root, or {BUILD_HINT} and run build/lfce")
    os.execv(path, ["lfce", *sys.argv[1:]])  # argv[0] as the user typed it, for the usage line
