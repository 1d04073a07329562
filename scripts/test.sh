#!/usr/bin/env bash
# The test command: build, then run the CPU test suite (unit, parity, identity, e2e) with ctest.
# Also builds an ASan/UBSan copy and runs the parser tests (safetensors fuzz, configs, tokenizer).
set -euo pipefail
cd "$(dirname "$0")/.."
bash scripts/build.sh
# The CUDA kernels must also compile for a consumer card (24 GB Ampere by default; 0 skips).
if command -v nvcc >/dev/null 2>&1 && [ "${QFLASH_CUDA_CHECK_ARCH:-86}" != "0" ] && [ "${QFLASH_CUDA:-AUTO}" != "OFF" ]; then
  cmake -S . -B build -DQFLASH_CUDA_CHECK_ARCH="${QFLASH_CUDA_CHECK_ARCH:-86}" >/dev/null
  cmake --build build -j"${JOBS:-$(nproc)}" --target qflash_cuda_archcheck
fi
OMP_NUM_THREADS=${OMP_NUM_THREADS:-1} ctest --test-dir build --output-on-failure -j"${JOBS:-$(nproc)}" --timeout 1500
if [ "${QFLASH_SKIP_ASAN:-0}" != "1" ]; then
  cmake -S . -B build-asan -DCMAKE_BUILD_TYPE=Debug -DQFLASH_SANITIZE=ON -DQFLASH_CUDA=OFF >/dev/null
  cmake --build build-asan -j"${JOBS:-$(nproc)}" --target qflash_tests
  ./build-asan/qflash_tests --gtest_filter='Io*:Config*:Tokenizer*' --gtest_brief=1
fi
