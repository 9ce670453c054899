#!/usr/bin/env bash
# Installs what is missing, configures build/ (Release; CUDA when nvcc is found), builds, and runs ctest.
# Extra arguments go to cmake's configure step, e.g. tools/test.sh -DSTRATA_CUDA=OFF
set -euo pipefail
cd "$(dirname "$0")/.."

tools/setup.sh
if [ -d /usr/local/cuda/bin ]; then export PATH="/usr/local/cuda/bin:$PATH"; fi

jobs=$(nproc 2>/dev/null || echo 2)
cmake -S . -B build -G Ninja -DCMAKE_BUILD_TYPE=Release "$@"
cmake --build build -j "$jobs"
ctest --test-dir build --output-on-failure -j "$jobs"
