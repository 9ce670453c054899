#!/usr/bin/env bash
# On the GPU machine: build Release for sm_90, run the [cuda] tests, then the benches. Logs go to $OUT (or out/).
set -uo pipefail
cd "$(dirname "$0")/.."
out=${OUT:-out}
mkdir -p "$out"
nvidia-smi --query-gpu=name,memory.total,driver_version --format=csv,noheader | tee "$out/gpu.txt"
# cuDNN's fused attention where the frontend's headers were carried (../shared/device/cudnn-frontend-*).
frontend=$(ls -d .device/cudnn-frontend-*/include 2>/dev/null | head -1)
cmake -S . -B build -G Ninja -DCMAKE_BUILD_TYPE=Release -DCMAKE_CUDA_ARCHITECTURES=90 \
  ${frontend:+-DSTRATA_CUDNN_FRONTEND_DIR=$PWD/$frontend} >"$out/configure.log" 2>&1 ||
  { tail -30 "$out/configure.log"; exit 1; }
cmake --build build -j 16 >"$out/build.log" 2>&1 || { grep -E "error" "$out/build.log" | head -30; exit 1; }
echo "== build ok"
if [ "${SKIP_TESTS:-0}" != 1 ]; then
  ./build/tests/strata_tests "[cuda]" >"$out/cuda_tests.log" 2>&1
  echo "== [cuda] tests exit $?"; tail -4 "$out/cuda_tests.log"
  grep -B5 -A15 "FAILED" "$out/cuda_tests.log" | head -80
  (cd build && ctest -j 16 >"$out/ctest.log" 2>&1); echo "== ctest exit $?"; tail -3 "$out/ctest.log"
fi
# BENCH=all (default), gemm, mem, attn or none.
case "${BENCH:-all}" in all | gemm) python3 tools/bench_gemm.py --binary build/bench/bench_gemm | tee "$out/gemm.md" ;; esac
case "${BENCH:-all}" in all | mem) ./build/bench/bench_memory | tee "$out/memory.txt" ;; esac
case "${BENCH:-all}" in all | attn) python3 tools/bench_attention.py | tee "$out/attention.md" ;; esac
if [ "${GPT:-0}" = 1 ]; then
  ./build/strata train configs/gpt-nano.yaml --set train.out_dir=/tmp/nano >"$out/nano.log" 2>&1
  echo "== gpt-nano on the GPU exit $?"; grep -E "iteration +(500|1000|1500)/|val loss|finished" "$out/nano.log"
  python3 tools/bench_gpt.py --sizes "${GPT_SIZES:-124m}" ${GPT_FLAGS:-} | tee "$out/gpt.md"
fi
if [ "${PARITY:-0}" = 1 ]; then
  python3 tools/hf_parity.py | tee "$out/parity.txt"
fi
