#!/usr/bin/env bash
# Installs what building and testing lfce needs on Debian 12 (run as root, or with sudo).
# The CUDA toolkit (for cuda.h and ptxas) is expected under /usr/local/cuda.
set -euo pipefail
packages=(cmake g++ make llvm-19-dev libzstd-dev zlib1g-dev libspdlog-dev libfmt-dev libgtest-dev
          python3 python3-pytest python3-torch python3-venv binutils nlohmann-json3-dev libcli11-dev ccache)
missing=()
for p in "${packages[@]}"; do
  dpkg -s "$p" >/dev/null 2>&1 || missing+=("$p")
done
if ((${#missing[@]})); then
  echo "installing: ${missing[*]}"
  sudo=""; [ "$(id -u)" -eq 0 ] || sudo="sudo"
  $sudo apt-get update -q
  DEBIAN_FRONTEND=noninteractive $sudo apt-get install -y -q --no-install-recommends "${missing[@]}"
fi
if [ ! -f /usr/local/cuda/include/cuda.h ] && [ -z "${CUDA_HOME:-}" ]; then
  echo "error: the CUDA toolkit is not installed (no /usr/local/cuda/include/cuda.h); set CUDA_HOME" >&2
  exit 1
fi
