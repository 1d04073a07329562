#!/usr/bin/env bash
# Configures and builds qflash into ./build (CUDA backend when nvcc is found; QFLASH_CUDA=OFF to skip).
set -euo pipefail
cd "$(dirname "$0")/.."
jobs=${JOBS:-$(nproc)}
cmake -S . -B build -DCMAKE_BUILD_TYPE=Release -DQFLASH_CUDA="${QFLASH_CUDA:-AUTO}" >/dev/null
cmake --build build -j"$jobs"
