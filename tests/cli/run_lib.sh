# Shared by the shell tests that start strata processes (runs_test.sh, mpirun_test.sh); sourced after `work` is
# set to the test's scratch folder. Every process a test records in `started` is killed when it exits (mpirun's
# ranks first), the scratch folder removed (KEEP=1 keeps it), and the working directory is the source tree.
started=()
cleanup() {
  local p
  for p in "${started[@]}"; do
    pkill -9 -P "$p" 2>/dev/null
    kill -9 "$p" 2>/dev/null
  done
  [ "${KEEP:-}" ] || rm -rf "$work"
}
trap cleanup EXIT
cd "$(dirname "$0")/../.."
failures=0
fail() {
  echo "FAIL: $*" >&2
  failures=$((failures + 1))
}

# Whether FILE (a metrics.jsonl) is one run's continuous curve, steps 1, 2, ... past STEP + 1.
one_curve() {
  python3 - "$1" "$2" <<'EOF'
import json, sys
records = [json.loads(line) for line in open(sys.argv[1])]
steps = [r["step"] for r in records]
assert steps == list(range(1, len(steps) + 1)), steps
assert len(steps) > int(sys.argv[2]) + 1, steps
assert len({r["run_id"] for r in records}) == 1
EOF
}
