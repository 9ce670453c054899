#!/usr/bin/env bash
# Runs across restarts through the `strata` command, with real processes and signals: a run's files belong
# to it (a fresh run never touches another's), the printed resume command resumes when pasted, a resume
# refuses changed settings, --resume continues a job or starts it, a complete run trains nothing, and a write
# past `ulimit -f` is a named error. Usage: runs_test.sh STRATA_BINARY
set -uo pipefail
strata=$(realpath "$1")
work=$(mktemp -d /tmp/strata-runs-XXXXXX)
source "$(dirname "${BASH_SOURCE[0]}")/run_lib.sh"
# expect NAME EXPECTED_RC PATTERN FILE: the exit status and an extended regex in the output file.
expect() {
  local name=$1 want=$2 rc=$3 pattern=$4 log=$5
  [ "$rc" -eq "$want" ] || fail "$name: exit status $rc, expected $want: $(tail -3 "$log")"
  grep -Eq -- "$pattern" "$log" || fail "$name: output lacks /$pattern/: $(tail -3 "$log")"
  if grep -q "terminate called" "$log"; then fail "$name: terminate called"; fi
  echo "ok: $name"
}
# Starts `strata ARGS...` in the background, logging to $1; waits for its first logged iteration.
start() {
  local log=$1
  shift
  "$@" >"$log" 2>&1 &
  pid=$!
  started+=("$pid")
  for _ in $(seq 1 600); do grep -q "iteration " "$log" 2>/dev/null && break; sleep 0.1; done
}

for i in $(seq 1 300); do echo "the quick brown fox jumps over the lazy dog $((i % 7))"; done >"$work/corpus.txt"
cfg=configs/gpt-nano.yaml
tiny=(--set "data.path=$work/corpus.txt" --set train.device=cpu --set model.num_layers=1 --set model.hidden_size=32
  --set model.num_attention_heads=2 --set model.seq_length=32 --set train.micro_batch_size=4 --set train.log_interval=1
  --set train.eval_interval=0 --set train.sample_length=0 --set lr_schedule.warmup_iters=2 --set train.threads=1)
a=(train "$cfg" "${tiny[@]}" --set "train.out_dir=$work/a" --set "checkpoint.save=$work/a/ckpt")

# A run, then a fresh run into its directories: stopped before any work, the first run's files untouched.
"$strata" "${a[@]}" --set train.train_iters=6 --set checkpoint.save_interval=3 >"$work/a1.log" 2>&1
expect "a run saves" 0 $? "saved checkpoint .*step-6" "$work/a1.log"
lines=$(wc -l <"$work/a/metrics.jsonl")
"$strata" "${a[@]}" --set train.train_iters=6 >"$work/a2.log" 2>&1
expect "a fresh run into another run's directories stops" 1 $? \
  "^error: train.out_dir .* hold another run's files" "$work/a2.log"
grep -q -- "--resume" "$work/a2.log" && grep -q -- "--overwrite" "$work/a2.log" || fail "the refusal offers no --resume/--overwrite"
[ "$(wc -l <"$work/a/metrics.jsonl")" -eq "$lines" ] || fail "the refused run changed metrics.jsonl"
"$strata" train "$cfg" "${tiny[@]}" --set "train.out_dir=$work/b" --set "checkpoint.save=$work/a/ckpt" \
  --set train.train_iters=2 --set checkpoint.keep_last=1 >"$work/b.log" 2>&1
expect "a fresh run into another run's save directory stops" 1 $? "checkpoints step-3, step-6 in $work/a/ckpt" "$work/b.log"
[ -d "$work/a/ckpt/step-3" ] && [ "$(cat "$work/a/ckpt/latest")" = step-6 ] || fail "the refused run pruned or re-pointed"
"$strata" "${a[@]}" --resume --set train.train_iters=6 --overwrite >"$work/a3.log" 2>&1
expect "--resume and --overwrite exclude each other" 2 $? "excludes" "$work/a3.log"

# A complete run: --resume says so and trains nothing, samples nothing.
"$strata" "${a[@]}" --set train.train_iters=6 --set train.sample_length=100 --resume >"$work/done.log" 2>&1
expect "resuming a complete run trains nothing" 0 $? "the run is complete \(checkpoint .*step-6, iteration 6\)" \
  "$work/done.log"
grep -q "^sample:" "$work/done.log" && fail "a complete run sampled"

# Ctrl-C: the step finishes, a checkpoint is saved, and the printed command resumes when pasted.
long=(train "$cfg" "${tiny[@]}" --set model.num_layers=2 --set model.hidden_size=64 --set model.seq_length=64
  --set train.train_iters=100000 --set "train.out_dir=$work/long dir" --set "checkpoint.save=$work/long dir/ckpt")
start "$work/int.log" "$strata" "${long[@]}"
sleep 0.3
kill -INT "$pid"
wait "$pid"
expect "SIGINT finishes the step and saves" 130 $? "interrupt \(SIGINT\): finishing iteration [0-9]+ and saving a checkpoint" \
  "$work/int.log"
step=$(sed -n 's/.*stopped by SIGINT after iteration \([0-9]*\).*/\1/p' "$work/int.log")
[ -n "$step" ] && [ "$(cat "$work/long dir/ckpt/latest")" = "step-$step" ] || fail "no checkpoint of the iteration it stopped after"
resume=$(grep -A1 "resume with:" "$work/int.log" | tail -1)
case "$resume" in
*"--resume"*"") ;;
*) fail "the resume command lacks --resume: $resume" ;;
esac
# Pasted with a changed learning rate it is refused, the setting named; as printed it continues the run.
eval "$resume --set optimizer.lr=0.5" >"$work/changed.log" 2>&1
expect "a resume with a changed setting is refused" 1 $? "optimizer.lr: 0.002 in the checkpoint, 0.5 now" "$work/changed.log"
eval "exec $resume" >"$work/pasted.log" 2>&1 &
pid=$!
started+=("$pid")
for _ in $(seq 1 600); do grep -q "iteration  *$((step + 2))/" "$work/pasted.log" 2>/dev/null && break; sleep 0.1; done
kill -TERM "$pid"
wait "$pid"
expect "the pasted command resumes the run" 143 $? "resumed from .*step-$step at iteration $step" "$work/pasted.log"
one_curve "$work/long dir/metrics.jsonl" "$step" || fail "metrics.jsonl after the resume is not one run's continuous curve"

# A job script rerun with --resume: the first start trains, each rerun continues.
job=(train "$cfg" "${tiny[@]}" --set train.train_iters=4 --set train.exit_interval=2 --set "train.out_dir=$work/job"
  --set "checkpoint.save=$work/job/ckpt" --resume)
"$strata" "${job[@]}" >"$work/job1.log" 2>&1
expect "--resume starts a job that has no checkpoint" 0 $? "no checkpoint in .* yet: starting the run" "$work/job1.log"
"$strata" "${job[@]}" >"$work/job2.log" 2>&1
expect "--resume continues it" 0 $? "resumed from .*step-2 at iteration 2" "$work/job2.log"
grep -q "finished 4 iterations" "$work/job2.log" || fail "the rerun did not finish the job"

# No save directory: the interrupt says it will not save, and nothing is saved.
start "$work/nosave.log" "$strata" train "$cfg" "${tiny[@]}" --set model.num_layers=2 --set model.hidden_size=64 \
  --set train.train_iters=100000 --set "train.out_dir=$work/nosave" --set checkpoint.save=
kill -TERM "$pid"
wait "$pid"
expect "an interrupt without a save directory says so" 143 $? "then stopping without a checkpoint" "$work/nosave.log"
grep -q "saving a checkpoint" "$work/nosave.log" && fail "it said 'saving' without a save directory"

# The SSD tier's file past `ulimit -f`: a named error, not SIGXFSZ (exit 153).
mkdir -p "$work/ssd"
(
  ulimit -f 2048
  exec "$strata" train "$cfg" "${tiny[@]}" --set model.num_layers=4 --set model.hidden_size=128 \
    --set model.num_attention_heads=4 --set train.train_iters=2 --set "train.out_dir=$work/ssd-run" \
    --set checkpoint.save= --set zero_optimization.offload_optimizer.device=nvme \
    --set "zero_optimization.nvme_path=$work/ssd" --set store.host_budget_gb=0
) >"$work/xfsz.log" 2>&1
expect "a file-size limit on the SSD tier is a named error" 1 $? \
  "^error: .*SSD tier.*File too large \(the file-size limit of this process, .ulimit -f., is 2097152 bytes" "$work/xfsz.log"

if [ "$failures" -gt 0 ]; then
  echo "$failures run check(s) failed" >&2
  exit 1
fi
echo "all run checks passed"
