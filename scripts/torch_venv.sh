#!/usr/bin/env bash
# Makes build/venv-torch, a virtual environment with the packages of tests/python/requirements-torch.txt
# (PyTorch 2.4+, transformers, pytest; from PyPI), in which ctest's python.cpu.torch runs the Python
# CPU tests again: the fake implementations, opcheck and torch.compile of the custom ops, and
# lfce.transformers need them, and Debian 12's python3-torch is 1.13. An existing environment is
# reused as long as the requirements file is unchanged (the copy in it is the stamp).
# Usage: bash scripts/torch_venv.sh [dir]   (default build/venv-torch)
set -euo pipefail
cd "$(dirname "$0")/.."
venv="${1:-build/venv-torch}"
requirements=tests/python/requirements-torch.txt
if cmp -s "$requirements" "$venv/requirements-torch.txt" && [ -x "$venv/bin/python" ]; then
  echo "$venv: up to date ($("$venv/bin/python" -c 'import torch; print("torch", torch.__version__)'))"
  exit 0
fi
echo "--- $venv: installing $(grep -v '^#' "$requirements" | tr '\n' ' ')---"
start=$SECONDS
rm -f "$venv/requirements-torch.txt"
/usr/bin/python3 -m venv "$venv"
"$venv/bin/python" -m pip install -q --disable-pip-version-check -r "$requirements"
# Fail here, not in the tests, when the torch installed lacks the custom-op API.
"$venv/bin/python" -c 'import torch.library as l, torch
assert all(hasattr(l, n) for n in ("custom_op", "register_fake", "register_autograd")), torch.__version__'
cp "$requirements" "$venv/requirements-torch.txt"
echo "$venv: ready in $((SECONDS - start)) s"
