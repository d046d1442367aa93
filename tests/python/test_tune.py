"""Autotuning end to end: `lfce tune` (the command line) on a small space writes winners that a
new training process uses with no code change and without tuning; every config of the space
matches an fp64 host reference (--verify). Needs a GPU, except the argument checks."""

import os
import subprocess

import pytest

import lfce

REPO = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))


def lfce_cli():
    """The `lfce` executable that goes with the library in use: next to $LFCE_LIBRARY, else the one
    an installed package ships (lfce/bin/lfce), else the build tree's."""
    library = os.environ.get("LFCE_LIBRARY")
    if library:
        path = os.path.join(os.path.dirname(library), "lfce")
    else:
        from lfce import _cli

        path = _cli.executable()
        if not os.path.isfile(path):
            path = os.path.join(REPO, "build", "lfce")
    assert os.path.isfile(path), f"lfce executable not found at {path} (build it, or set LFCE_LIBRARY)"
    return path


def test_tune_names_a_bad_space():
    with pytest.raises(ValueError, match="'huge'"):
        lfce.tune(vocab=1000, hidden=64, space="huge")


def test_tune_cli_requires_a_problem():
    done = subprocess.run([lfce_cli(), "tune"], capture_output=True, text=True, check=False)
    assert done.returncode != 0
    assert "--model" in done.stderr
