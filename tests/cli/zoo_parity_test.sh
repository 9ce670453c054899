#!/usr/bin/env bash
# bench/zoo_parity's command line: an option without its value, or with a bad number, stops with exit status 2
# and one line naming the option, before any work (a parity run that writes no trace must not look like a
# pass). Usage: zoo_parity_test.sh ZOO_PARITY_BINARY
set -uo pipefail
parity=$1
failures=0
expect() {  # expect NAME STATUS REGEX ARGS...
  local name=$1 status=$2 regex=$3
  shift 3
  local out rc
  out=$("$parity" "$@" 2>&1)
  rc=$?
  if [ "$rc" -ne "$status" ] || ! grep -Eq "$regex" <<<"$out"; then
    echo "FAIL: $name: exit status $rc (expected $status), output: $out" >&2
    failures=$((failures + 1))
  else
    echo "ok: $name"
  fi
}
expect "--trace at the end" 2 "^zoo_parity: --trace needs a value$" --config c.yaml --trace
expect "--trace before another option" 2 "^zoo_parity: --trace needs a value$" --config c.yaml --trace --compute bf16
expect "--config at the end" 2 "^zoo_parity: --config needs a value$" --trace t.safetensors --config
expect "a bad number" 2 "^zoo_parity: --steps takes a number, got 'many'$" --config c.yaml --steps many
expect "an unknown option" 2 "^zoo_parity: unknown argument --tracer$" --tracer t.safetensors
expect "the flags take no value" 1 "zoo_parity: --config is required" --engine --fp32-norms
[ "$failures" -eq 0 ] || exit 1
