#!/usr/bin/env bash
# `strata train` on 2 ranks under a real mpirun, stopped the ways users stop it: Ctrl-C to mpirun (SIGINT to
# it) saves one complete checkpoint of the step every rank stopped after, before Open MPI's kill, and says so
# once; the printed resume command, pasted, resumes the run under mpirun; a rank killed with -9 is reported
# lost with the last good checkpoint, and nothing claims to save; SIGINT to one rank stops every rank after the
# same step; a config error prints once; `parallel: auto` takes rank 0's layout on every rank. Usage:
# mpirun_test.sh MPIEXEC STRATA_BINARY
set -uo pipefail
mpiexec=$1
strata=$(realpath "$2")
work=$(mktemp -d /tmp/strata-mpirun-XXXXXX)
source "$(dirname "${BASH_SOURCE[0]}")/run_lib.sh"
check() {
  local name=$1 pattern=$2 log=$3
  grep -Eq -- "$pattern" "$log" || fail "$name: output lacks /$pattern/: $(tail -5 "$log")"
}
# The number of lines of $2 matching /$1/.
count() { grep -Ec -- "$1" "$2"; }
# Waits until /$1/ appears in $2 (60 s at most).
await() {
  for _ in $(seq 1 600); do grep -Eq -- "$1" "$2" 2>/dev/null && return 0; sleep 0.1; done
  fail "waited in vain for /$1/ in $2: $(tail -3 "$2")"
}
# The pid of rank $1 of the job now running: the process whose environment has this test's mark and
# OMPI_COMM_WORLD_RANK=$1, wherever it sits under mpirun; tries for 10 s, since a rank's process can be between
# fork and exec when asked.
export STRATA_MPIRUN_TEST_MARK=$work
rankPid() {
  local pid env
  for _ in $(seq 1 100); do
    for pid in $(pgrep -f -- "$strata"); do
      env=$(tr '\0' '\n' <"/proc/$pid/environ" 2>/dev/null)
      if grep -qx "STRATA_MPIRUN_TEST_MARK=$work" <<<"$env" && grep -qx "OMPI_COMM_WORLD_RANK=$1" <<<"$env"; then
        echo "$pid"
        return
      fi
    done
    sleep 0.1
  done
}
# Waits for mpirun $1 to end; past 60 s it fails the check and kills the job, so a missed stop fails the test
# with its name instead of running into ctest's limit.
finish() {
  (sleep 60 && touch "$work/overdue.$1" && pkill -9 -P "$1" && kill -9 "$1") >/dev/null 2>&1 &
  local dog=$!
  wait "$1"
  pkill -P "$dog" 2>/dev/null
  kill "$dog" 2>/dev/null
  [ ! -e "$work/overdue.$1" ] || fail "mpirun $1 did not end within 60 s"
}

for i in $(seq 1 300); do echo "the quick brown fox jumps over the lazy dog $((i % 7))"; done >"$work/corpus.txt"
# Open MPI's kill timeout as Strata's launch line sets it (docs/checkpoints.md), short for a test: a stop has
# 2 x 3 s after mpirun's notice.
mpirun=("$mpiexec" --oversubscribe --mca odls_base_sigkill_timeout 3 -np 2)
long=(train configs/gpt-nano.yaml --set "data.path=$work/corpus.txt" --set train.device=cpu --set model.num_layers=2
  --set model.hidden_size=64 --set model.num_attention_heads=2 --set model.seq_length=64 --set train.micro_batch_size=4
  --set train.train_iters=100000 --set train.log_interval=1 --set train.eval_interval=0 --set train.sample_length=0
  --set lr_schedule.warmup_iters=2 --set train.threads=1 --set "train.out_dir=$work/run"
  --set "checkpoint.save=$work/run/ckpt")

# A config error prints once for the job, not once per rank.
"$mpiexec" --oversubscribe -np 2 "$strata" train configs/gpt-nano.yaml --set model.hiden_size=3 >"$work/config.log" 2>&1
[ "$(count "^error: .*unknown config key 'model.hiden_size'" "$work/config.log")" -eq 1 ] ||
  fail "a config error printed $(count "^error:" "$work/config.log") times: $(cat "$work/config.log")"
echo "ok: a config error prints once"

# parallel: auto on 2 ranks: every rank takes rank 0's layout, logged once, and trains.
"$mpiexec" --oversubscribe -np 2 "$strata" "${long[@]}" --set parallel=auto --set train.train_iters=2 \
  --set "train.out_dir=$work/auto" --set "checkpoint.save=" >"$work/auto.log" 2>&1 ||
  fail "parallel: auto on 2 ranks failed: $(tail -3 "$work/auto.log")"
[ "$(count "parallel: auto chose data 2 x tensor 1" "$work/auto.log")" -eq 1 ] && grep -Eq "iteration +2/" "$work/auto.log" ||
  fail "parallel: auto on 2 ranks: $(grep -E "auto|error" "$work/auto.log" | head -3)"
echo "ok: parallel: auto on 2 ranks"

# Ctrl-C to mpirun.
"${mpirun[@]}" "$strata" "${long[@]}" >"$work/int.log" 2>&1 &
mpirun_pid=$!
started+=("$mpirun_pid")
await "iteration +3/" "$work/int.log"
kill -INT "$mpirun_pid"
finish "$mpirun_pid"
check "Ctrl-C: mpirun's notice is announced" "mpirun is ending the job .* every rank is finishing iteration [0-9]+ and saving a checkpoint" "$work/int.log"
[ "$(count "is ending the job|interrupt \\(SIG" "$work/int.log")" -eq 1 ] || fail "Ctrl-C: the stop was announced more than once"
step=$(sed -n 's/.*stopped by SIGTERM after iteration \([0-9]*\); checkpoint.*/\1/p' "$work/int.log")
[ -n "$step" ] && [ "$(cat "$work/run/ckpt/latest" 2>/dev/null)" = "step-$step" ] ||
  fail "Ctrl-C: no checkpoint of the step the ranks stopped after: $(tail -5 "$work/int.log")"
for r in 0 1; do
  [ -s "$work/run/ckpt/step-$step/model-rank$r.safetensors" ] && [ -s "$work/run/ckpt/step-$step/optimizer-rank$r.safetensors" ] ||
    fail "Ctrl-C: rank $r's shards of step-$step are missing"
done
resume=$(grep -A1 "resume with:" "$work/int.log" | tail -1 | sed 's/^ *//')
[[ "$resume" == "$mpiexec "*" -np 2 $strata train "*" --resume" ]] || fail "Ctrl-C: the resume command is not complete: $resume"
echo "ok: Ctrl-C to mpirun saves step-$step on both ranks"

# The printed command, pasted: it resumes under mpirun. Then rank 1 is killed with -9: reported lost, with the
# last good checkpoint, and no rank claims to save.
eval "exec $resume" >"$work/pasted.log" 2>&1 &
mpirun_pid=$!
started+=("$mpirun_pid")
await "iteration +$((step + 2))/" "$work/pasted.log"
check "the pasted command resumes" "resumed from .*step-$step at iteration $step" "$work/pasted.log"
rank1=$(rankPid 1)
[ -n "$rank1" ] || fail "no rank 1 found"
kill -9 "$rank1"
finish "$mpirun_pid"
check "kill -9: the rank is reported lost" "rank 1 \(pid $rank1\) lost" "$work/pasted.log"
check "kill -9: the last good checkpoint is named" "The last good checkpoint is .*step-$step \(iteration $step\)" "$work/pasted.log"
grep -q "saving a checkpoint" "$work/pasted.log" && fail "kill -9: a rank claimed to save"
[ "$(cat "$work/run/ckpt/latest")" = "step-$step" ] || fail "kill -9: latest moved"
one_curve "$work/run/metrics.jsonl" "$step" || fail "metrics.jsonl is not one run's curve past step-$step"
echo "ok: the pasted command resumes; a rank killed with -9 is reported lost"

# SIGINT to one rank alone: every rank stops after the same step and saves; mpirun without the kill timeout
# is warned about at the start.
"$mpiexec" --oversubscribe -np 2 "$strata" "${long[@]}" --set "train.out_dir=$work/one" \
  --set "checkpoint.save=$work/one/ckpt" >"$work/one.log" 2>&1 &
mpirun_pid=$!
started+=("$mpirun_pid")
await "iteration +3/" "$work/one.log"
check "an unset kill timeout is warned about" "launch with .mpirun --mca odls_base_sigkill_timeout" "$work/one.log"
rank1=$(rankPid 1)
[ -n "$rank1" ] || fail "no rank 1 found"
kill -INT "$rank1"
finish "$mpirun_pid"
check "SIGINT to rank 1 stops every rank" "SIGINT reached rank 1: every rank stops after iteration [0-9]+" "$work/one.log"
step=$(sed -n 's/.*every rank stops after iteration \([0-9]*\).*/\1/p' "$work/one.log")
[ -n "$step" ] && [ "$(cat "$work/one/ckpt/latest" 2>/dev/null)" = "step-$step" ] &&
  [ -s "$work/one/ckpt/step-$step/model-rank1.safetensors" ] || fail "SIGINT to rank 1: no checkpoint of step $step"
echo "ok: SIGINT to one rank stops every rank after step $step"

if [ "$failures" -gt 0 ]; then
  echo "$failures mpirun check(s) failed" >&2
  exit 1
fi
echo "all mpirun checks passed"
