#!/usr/bin/env bash
# README command 1: install, build, run the main job for a model preset.
#   without a GPU: generate and assemble the preset's kernels, print a table;
#   with a GPU:    forward + backward of the preset, time and memory.
# Usage: bash scripts/run.sh [--model llama3-8b] [--tokens 8192] [...]  (python3 -m lfce --help)
set -euo pipefail
cd "$(dirname "$0")/.."
bash scripts/install_deps.sh
bash scripts/build.sh
# python/ for the package, the root for the benchmark harness (bench/) the GPU main job runs.
export LFCE_LIBRARY="$PWD/build/liblfce.so" PYTHONPATH="$PWD/python:$PWD${PYTHONPATH:+:$PYTHONPATH}"
PYTHON=${PYTHON:-python3}
"$PYTHON" -c "import torch" 2>/dev/null || PYTHON=/usr/bin/python3
if [ $# -eq 0 ]; then set -- --model llama3-8b; fi
exec "$PYTHON" -m lfce "$@"
