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
    grep -q "^error: .*does not fit" <<<"$out" && grep -q "largest model of its family" <<<"$out" ||
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
