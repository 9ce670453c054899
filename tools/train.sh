#!/usr/bin/env bash
# The main job: installs what is missing, builds the `strata` command, and trains.
#   tools/train.sh                                   # gpt-nano on tiny Shakespeare, GPU if present, else CPU
#   tools/train.sh configs/gpt2-124m.yaml --set train.train_iters=100
set -euo pipefail
cd "$(dirname "$0")/.."

config=configs/gpt-nano.yaml
if [ $# -gt 0 ] && [ "${1#--}" = "$1" ]; then
  config=$1
  shift
fi

tools/setup.sh
if [ -d /usr/local/cuda/bin ]; then export PATH="/usr/local/cuda/bin:$PATH"; fi
jobs=$(nproc 2>/dev/null || echo 2)
cmake -S . -B build -G Ninja -DCMAKE_BUILD_TYPE=Release >/dev/null
cmake --build build -j "$jobs" --target strata_cli
exec build/strata train "$config" "$@"
