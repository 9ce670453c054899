#!/usr/bin/env bash
# fault_test.sh MPIEXEC NP FAULTS_EXE MODE [MPIRUN_FLAGS...]
# Runs strata_dist_faults MODE on NP ranks and checks that the job ends (no hang) with every surviving rank
# reporting the collective timeout error: op, rank, group and sizes.
set -u
mpiexec=$1 np=$2 exe=$3 mode=$4
shift 4
output=$(timeout 60 "$mpiexec" --oversubscribe -np "$np" "$@" "$exe" "$mode" 2>&1)
rc=$?
echo "$output"
fail() {
  echo "FAIL: $*"
  exit 1
}
[ $rc -ne 124 ] || fail "the job hung (killed after 60 s)"
survivors=$np
[ "$mode" = killed ] && survivors=$((np - 1))
for ((r = 0; r < survivors; r++)); do
  grep -Eq "^rank $r caught: dist: [a-zA-Z]+(\([a-z]+\))?( of [0-9]+ [a-z0-9]+ elements \([0-9]+ bytes\))? on rank [0-9]+ of group '[a-z]+' \([0-9]+ ranks\) did not finish within 2 s \(dist.timeout_s\)" <<<"$output" ||
    fail "rank $r did not report the timeout error"
done
grep -q "no error" <<<"$output" && fail "a rank finished without an error"
echo "PASS: $survivors rank(s) reported the timeout"
