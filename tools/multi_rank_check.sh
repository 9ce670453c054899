#!/usr/bin/env bash
# On the GPU machine, after tools/device_check.sh has built build/: the distributed GPU paths on one GPU.
# - the dist suite (ZeRO stages 0-3, host and SSD tiers, expert parallelism, BERT and T5, sharded checkpoints,
#   the start-up broadcast) on 2 and 4 ranks that share the GPU: CUDA tensors through MPI with host staging
#   (NOTE [GPU collectives] in distributed/ParallelContext.h), with the comm delay on (NOTE [Comm delay]);
# - a rank killed in a collective, and mismatched collectives, on CUDA tensors: every rank stops with the
#   timeout error;
# - a sharded checkpoint of 4 ranks sharing the GPU, resumed on 2 ranks and on 1;
# - what the shared-GPU mode costs against one rank, and NCCL at one rank against the local path (logs only;
#   BENCHMARKS.md has the figures).
# NCCL at one rank (collectives, the comm delay, a timeout) is in the [cuda] tests: build/tests/strata_tests
# "[cuda][dist]". Logs go to $OUT (or out/). STEPS=tests,faults,resume,cost picks parts (default all).
set -uo pipefail
cd "$(dirname "$0")/.."
out=${OUT:-out}
mkdir -p "$out"
steps=${STEPS:-tests,faults,resume,cost}
has() { [[ ",$steps," == *",$1,"* ]]; }
export OMPI_ALLOW_RUN_AS_ROOT=1 OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1 OMPI_MCA_rmaps_base_oversubscribe=1
export NCCL_NVLS_ENABLE=0
mpi="mpirun --oversubscribe --bind-to none"
status=0

if has tests; then
  for np in 2 4; do
    STRATA_DIST_TEST_DEVICE=cuda STRATA_COMM_DELAY_US=${COMM_DELAY_US:-300} \
      timeout 300 $mpi -np "$np" build/tests/strata_dist_tests >"$out/dist_gpu_$np.log" 2>&1
    rc=$?
    echo "== dist suite on $np ranks sharing the GPU (staged, comm delay ${COMM_DELAY_US:-300} us): exit $rc"
    grep -E "test cases|assertions|FAILED|a test failed" "$out/dist_gpu_$np.log" | sort | uniq -c | head -8
    [ $rc -eq 0 ] || status=1
  done
fi

if has faults; then
  for np in 2 4; do
    for mode in killed mismatch; do
      flags=()
      [ "$mode" = killed ] && flags=(--enable-recovery)
      STRATA_DIST_TEST_DEVICE=cuda tests/distributed/mpi/fault_test.sh mpirun "$np" build/tests/strata_dist_faults \
        "$mode" --bind-to none "${flags[@]}" >"$out/fault_${mode}_$np.log" 2>&1
      rc=$?
      echo "== $mode collective on $np ranks, CUDA tensors: exit $rc: $(tail -1 "$out/fault_${mode}_$np.log")"
      [ $rc -eq 0 ] || status=1
    done
  done
fi

if has faults; then
  # Two ranks on one GPU with NCCL asked for: refused on every rank at once, naming the GPU and the counts.
  start=$(date +%s)
  timeout 120 $mpi -np 2 build/strata train configs/gpt-nano.yaml --set train.device=cuda \
    --set dist.gpu_collectives=nccl --set train.train_iters=2 --set train.out_dir=/tmp/strata-refused \
    >"$out/nccl_shared.log" 2>&1
  rc=$? took=$(($(date +%s) - start))
  n=$(grep -c "dist.gpu_collectives is nccl, but 2 ranks share one GPU" "$out/nccl_shared.log")
  echo "== NCCL asked for with 2 ranks on one GPU: exit $rc after $took s, the error printed $n time(s)"
  [ $rc -ne 0 ] && [ $rc -ne 124 ] && [ "$n" -ge 1 ] || status=1
fi

# A small GPT on the GPU in fp32 (so that other world sizes agree to rounding), 20 steps, saving at 10.
nano=(configs/gpt-nano.yaml --set train.device=cuda --set precision.dtype=fp32 --set model.num_layers=2
  --set train.micro_batch_size=4 --set train.global_batch_size=16 --set train.train_iters=20
  --set train.log_interval=1 --set train.eval_interval=0 --set train.sample_length=0
  --set lr_schedule.warmup_iters=2 --set zero_optimization.stage=3 --set zero_optimization.chunk_size_mb=0.05)

if has resume; then
  d=/tmp/strata-resume-gpu
  rm -rf "$d"
  $mpi -np 4 build/strata train "${nano[@]}" --set train.out_dir=$d/four --set checkpoint.save=$d/four/ckpt \
    --set checkpoint.save_interval=10 >"$out/resume_four.log" 2>&1
  echo "== 4 ranks, stage 3, saving at 10: exit $?"
  for np in 2 1; do
    $mpi -np "$np" build/strata train "${nano[@]}" --set train.out_dir=$d/again$np \
      --set checkpoint.save=$d/again$np/ckpt --set checkpoint.load=$d/four/ckpt/step-10 >"$out/resume_$np.log" 2>&1
    echo "== resumed on $np rank(s): exit $?"
  done
  python3 - "$d" <<'EOF' | tee "$out/resume.txt"
import json, sys
def losses(path):
    out = {}
    for line in open(path):
        r = json.loads(line)
        if "loss" in r:
            out[r["step"]] = r["loss"]
    return out
d = sys.argv[1]
four = losses(f"{d}/four/metrics.jsonl")
ok = True
for np in (2, 1):
    again = losses(f"{d}/again{np}/metrics.jsonl")
    steps = sorted(s for s in again if s > 10)
    worst = max(abs(again[s] - four[s]) / abs(four[s]) for s in steps) if steps else float("inf")
    good = len(steps) == 10 and worst < 1e-5
    ok &= good
    print(f"resumed on {np} rank(s): steps {steps[0] if steps else '-'}..{steps[-1] if steps else '-'}, "
          f"worst relative difference from the 4-rank run {worst:.2e}: {'PASS' if good else 'FAIL'}")
sys.exit(0 if ok else 1)
EOF
  [ "${PIPESTATUS[0]}" -eq 0 ] || status=1
fi

if has cost; then
  # GPT-2 124M, bf16, random tokens, the same global batch: one rank; NCCL at one rank; 2 ranks sharing the
  # GPU (staged). ms/iter from the last log interval of 20 steps.
  gpt=(configs/gpt2-124m.yaml --set data.format=random --set train.device=cuda --set train.train_iters=20
    --set train.log_interval=10 --set train.eval_interval=0 --set train.sample_length=0
    --set lr_schedule.warmup_iters=0 --set train.micro_batch_size=8 --set train.global_batch_size=16
    --set checkpoint.save= --set checkpoint.save_interval=0)
  for stage in 0 3; do
    build/strata train "${gpt[@]}" --set zero_optimization.stage=$stage --set train.out_dir=/tmp/cost-local-$stage \
      >"$out/cost_local_$stage.log" 2>&1
    build/strata train "${gpt[@]}" --set zero_optimization.stage=$stage --set dist.gpu_collectives=nccl \
      --set train.out_dir=/tmp/cost-nccl-$stage >"$out/cost_nccl_$stage.log" 2>&1
    $mpi -np 2 build/strata train "${gpt[@]}" --set zero_optimization.stage=$stage \
      --set train.out_dir=/tmp/cost-staged-$stage >"$out/cost_staged_$stage.log" 2>&1
    for kind in local nccl staged; do
      echo "== cost, stage $stage, $kind: $(grep -E "iteration +20/" "$out/cost_${kind}_$stage.log" | tail -1)"
    done
  done
fi
exit $status
