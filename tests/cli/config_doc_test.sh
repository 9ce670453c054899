#!/usr/bin/env bash
# `strata config`: --list prints the config key table as Markdown, and docs/configuration.md is that output,
# checked in; this fails when the two differ. Usage: config_doc_test.sh STRATA_BINARY DOC_FILE
set -uo pipefail
strata=$1
doc=$2
work=$(mktemp -d /tmp/strata-config-doc-XXXXXX)
trap 'rm -rf "$work"' EXIT
failures=0
fail() {
  echo "FAIL: $*" >&2
  failures=$((failures + 1))
}

"$strata" config --list >"$work/list.md" 2>"$work/stderr"
rc=$?
[ "$rc" -eq 0 ] || fail "strata config --list: exit status $rc: $(tail -3 "$work/stderr")"
[ -s "$work/stderr" ] && fail "strata config --list wrote to stderr: $(tail -3 "$work/stderr")"
if ! diff -u "$doc" "$work/list.md"; then
  fail "docs/configuration.md differs from what strata config --list prints (diff above); regenerate it with:
  build/strata config --list > docs/configuration.md"
fi

# Without --list it says what to give; `strata --help` names the command.
out=$("$strata" config 2>&1)
rc=$?
[ "$rc" -eq 1 ] && grep -q "^error: config: give --list" <<<"$out" ||
  fail "strata config without --list: exit status $rc: $out"
"$strata" --help | grep -Eq "^ +config +the config keys" || fail "strata --help does not list config"

[ "$failures" -eq 0 ] && echo "ok: docs/configuration.md is what strata config --list prints"
exit $((failures > 0))
