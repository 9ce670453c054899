#!/usr/bin/env bash
# `strata plan` on every config in configs/ and configs/zoo/, for the reference H200 (--machine h200): each one
# either plans (exit 0, the tier table and a predicted step) or is refused with one clear error that names the
# largest model of its family that fits (exit 1). Then plans of the CPU run on a small machine.
# Usage: plan_test.sh STRATA_BINARY CONFIGS_DIR
set -uo pipefail
strata=$1
configs=$2
export STRATA_CALIBRATION=/nonexistent/strata-calibration.json
failures=0
for config in "$configs"/*.yaml "$configs"/zoo/*.yaml; do
  out=$("$strata" plan "$config" --machine h200 2>&1)
  rc=$?
  if [ "$rc" -eq 0 ]; then
    grep -q "model state per rank, by tier" <<<"$out" && grep -q "activations" <<<"$out" &&
      grep -Eq "^  step " <<<"$out" || { echo "FAIL: $config: plan lacks its tables" >&2; failures=$((failures + 1)); }
    echo "ok: $config plans"
  elif [ "$rc" -eq 1 ]; then
    grep -q "^error: .*does not fit" <<<"$out" && grep -q "a smaller model: the largest of its family" <<<"$out" ||
      { echo "FAIL: $config: refused without the largest model: $(echo "$out" | tail -2)" >&2; failures=$((failures + 1)); }
    echo "ok: $config refused"
  else
    echo "FAIL: $config: exit status $rc: $(echo "$out" | tail -3)" >&2
    failures=$((failures + 1))
  fi
  if grep -q "terminate called" <<<"$out"; then echo "FAIL: $config: terminate called" >&2; failures=$((failures + 1)); fi
done
# A config that fits only with the SSD tier plans its SSD term; --ranks plans collectives.
out=$("$strata" plan "$configs/gpt3-13b.yaml" --machine h200 --set model.seq_length=512 --set train.global_batch_size=4 \
  --set zero_optimization.nvme_path=/tmp --set store.host_budget_gb=40 2>&1)
grep -Eq "^  SSD " <<<"$out" || { echo "FAIL: no SSD term: $(echo "$out" | tail -3)" >&2; failures=$((failures + 1)); }
# Adafactor's state goes to the SSD as AdamW's does: chunks in the table's SSD column, and the SSD term.
out=$("$strata" plan "$configs/gpt3-13b.yaml" --machine h200 --set model.seq_length=512 --set train.global_batch_size=4 \
  --set optimizer.type=adafactor --set optimizer.adafactor_beta1=0.9 --set zero_optimization.nvme_path=/tmp \
  --set store.host_budget_gb=10 2>&1)
grep -Eq "^  SSD " <<<"$out" && grep -Eq "^  optimizer chunks +[0-9]+ +[0-9]+ +[1-9][0-9]*$" <<<"$out" ||
  { echo "FAIL: Adafactor's plan puts no state on the SSD: $(echo "$out" | sed -n 7,16p)" >&2; failures=$((failures + 1)); }
out=$("$strata" plan "$configs/gpt3-1.3b.yaml" --machine h200 --ranks 2 --set zero_optimization.stage=2 2>&1)
grep -Eq "^  collectives " <<<"$out" ||
  { echo "FAIL: no collectives term at 2 ranks: $(echo "$out" | tail -3)" >&2; failures=$((failures + 1)); }
# Tensor parallelism: a split the ranks cannot take is refused; --layouts weighs every split and marks the best.
out=$("$strata" plan "$configs/gpt3-1.3b.yaml" --machine h200 --ranks 3 --set parallel.tensor=2 2>&1)
[ $? -eq 1 ] && grep -q "parallel.tensor (2) must divide the number of ranks (3)" <<<"$out" ||
  { echo "FAIL: parallel.tensor 2 on 3 ranks was planned: $(echo "$out" | tail -2)" >&2; failures=$((failures + 1)); }
out=$("$strata" plan "$configs/gpt3-13b.yaml" --machine h200x8 --ranks 8 --layouts --set model.seq_length=512 \
  --set train.global_batch_size=64 2>&1)
[ $? -eq 0 ] && grep -Eq "^  #1 +[0-9]+ +[0-9]+ " <<<"$out" && grep -q "TP collectives" <<<"$out" ||
  { echo "FAIL: no best layout: $(echo "$out" | tail -6)" >&2; failures=$((failures + 1)); }
# Layouts across machines (NOTE [Layouts] in plan/Plan.h): 16 ranks on two nodes of the H200 cluster weigh
# pipeline layouts too, with the predicted MFU; a rank count that is not whole machines is
# refused; a machine without a network figure is planned at 50 GB/s a GPU and says so.
out=$("$strata" plan "$configs/gpt3-13b.yaml" --machine h200x8-ib --ranks 16 --layouts --set model.seq_length=512 \
  --set train.global_batch_size=64 2>&1)
[ $? -eq 0 ] && grep -Eq "^  #1 +[0-9]+ +[0-9]+ +[0-9]+ +[0-9]+ " <<<"$out" && grep -Eq "^  .{4} +[0-9]+ +[0-9]+ +[248] +[0-9]+ " <<<"$out" &&
  grep -q "8 ranks on one machine, 2 machines" <<<"$out" && grep -q "MFU" <<<"$out" ||
  { echo "FAIL: layouts over two machines: $(echo "$out" | tail -8)" >&2; failures=$((failures + 1)); }
out=$("$strata" plan "$configs/gpt3-1.3b.yaml" --machine h200x8 --ranks 16 --gpus-per-node 8 --set train.micro_batch_size=1 \
  --set train.global_batch_size=16 2>&1)
[ $? -eq 0 ] && grep -q "over the network at 50 GB/s a GPU across 2 machines" <<<"$out" &&
  grep -q "network between machines: not in" <<<"$out" ||
  { echo "FAIL: --gpus-per-node 8 of 16 ranks: $(echo "$out" | grep -E "collectives|network")" >&2; failures=$((failures + 1)); }
out=$("$strata" plan "$configs/gpt3-1.3b.yaml" --machine h200 --ranks 16 --gpus-per-node 3 2>&1)
[ $? -eq 1 ] && grep -q "not a whole number of machines of 3 (--gpus-per-node)" <<<"$out" ||
  { echo "FAIL: 16 ranks, 3 a machine: $(echo "$out" | tail -2)" >&2; failures=$((failures + 1)); }
# The paper-scale plans (BENCHMARKS.md, "Paper-scale plans"): GPT-175B fits 16 H200 nodes only with a pipeline;
# the 1T model does not fit 20 A100-40GB nodes, and says why.
out=$("$strata" plan "$configs/gpt3-175b.yaml" --machine h200x8-ib --ranks 128 --layouts 2>&1)
[ $? -eq 0 ] && grep -Eq "^  #1 +[0-9]+ +[0-9]+ +([2-9]|[1-9][0-9]+) " <<<"$out" ||
  { echo "FAIL: GPT-175B on 16 H200 nodes: $(echo "$out" | grep -A4 "^layouts")" >&2; failures=$((failures + 1)); }
out=$("$strata" plan "$configs/gpt-1t.yaml" --machine a100x8-ib --ranks 160 --layouts --set train.global_batch_size=3200 2>&1)
[ $? -eq 1 ] && grep -q "does not fit (peak" <<<"$out" && grep -q "^error: .*does not fit" <<<"$out" ||
  { echo "FAIL: the 1T model on 20 A100 nodes: $(echo "$out" | tail -3)" >&2; failures=$((failures + 1)); }
# parallel: auto (NOTE [Parallel auto]): plan prints the layout it takes, and a CPU training run applies it.
out=$("$strata" plan "$configs/gpt3-13b.yaml" --machine h200x8 --ranks 8 --set parallel=auto --set model.seq_length=512 \
  --set train.global_batch_size=64 2>&1)
[ $? -eq 0 ] && grep -Eq "^parallel: auto chose data [0-9]+ x tensor [0-9]+.* \(parallel.tensor [0-9]+, parallel.pipeline [0-9]+" <<<"$out" &&
  grep -Eq "^run .*8 ranks" <<<"$out" ||
  { echo "FAIL: plan of parallel: auto: $(echo "$out" | tail -3)" >&2; failures=$((failures + 1)); }
work=$(mktemp -d /tmp/strata-plan-auto-XXXXXX)
out=$(timeout 120 "$strata" train "$configs/gpt-nano.yaml" --set parallel=auto --set train.device=cpu \
  --set data.format=random --set train.train_iters=2 --set train.micro_batch_size=2 --set train.eval_interval=0 \
  --set train.sample_length=0 --set train.log_interval=1 --set "train.out_dir=$work" --set checkpoint.save= 2>&1)
[ $? -eq 0 ] && grep -q "parallel: auto chose data 1 x tensor 1" <<<"$out" && grep -Eq "iter(ation)? +2" <<<"$out" ||
  { echo "FAIL: train with parallel: auto: $(echo "$out" | tail -4)" >&2; failures=$((failures + 1)); }
rm -rf "$work"
# The CPU run on a machine of 23.5 GiB: gpt-nano plans in fp32 on the CPU; the 1.3B model (14.7 GiB of state and
# about 100 GiB of activations) is refused before any allocation, naming the memory.
export STRATA_HOST_MEMORY_GB=23.5
out=$("$strata" plan "$configs/gpt-nano.yaml" --set train.device=cpu 2>&1)
[ $? -eq 0 ] && grep -q "f32 on the CPU" <<<"$out" && grep -q "23.50 GiB host memory" <<<"$out" ||
  { echo "FAIL: gpt-nano's CPU plan: $(echo "$out" | head -4)" >&2; failures=$((failures + 1)); }
out=$(timeout 60 "$strata" plan "$configs/gpt3-1.3b.yaml" --set train.device=cpu 2>&1)
rc=$?
[ $rc -eq 1 ] && grep -q "error: .*does not fit: the CPU run needs .* of host memory" <<<"$out" ||
  { echo "FAIL: the 1.3B CPU plan was not refused (exit $rc): $(echo "$out" | tail -3)" >&2; failures=$((failures + 1)); }
# train and bench run the same plan before they allocate: on that machine the 1.3B bench, a 1T-parameter model
# and an absurd sequence length are refused with the plan's message and what would fit, in seconds and in a few
# hundred MiB (the model is never built).
refuse() {
  local what=$1
  shift
  out=$( (ulimit -v 2000000; timeout 60 "$strata" "$@" 2>&1) )
  rc=$?
  if [ $rc -ne 1 ] || ! grep -q "does not fit" <<<"$out" || ! grep -q "^What would fit:" <<<"$out"; then
    echo "FAIL: $what was not refused by the plan (exit $rc): $(echo "$out" | tail -3)" >&2
    failures=$((failures + 1))
  else
    echo "ok: $what refused: $(grep -m1 -A1 '^What would fit:' <<<"$out" | tail -1)"
  fi
}
refuse "the 1.3B CPU bench" bench "$configs/gpt3-1.3b.yaml" --set train.device=cpu
refuse "a 1T CPU bench" bench "$configs/gpt3-13b.yaml" --set train.device=cpu --set model.hidden_size=25600 \
  --set model.num_layers=128 --set model.num_attention_heads=160
refuse "seq_length 100000000" bench "$configs/gpt-nano.yaml" --set model.seq_length=100000000
exit $((failures > 0))
