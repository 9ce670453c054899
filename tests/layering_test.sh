#!/usr/bin/env bash
# The layering rule: a folder of the library never includes one above it. The order, lowest first:
#   core < ops < autograd < nn < models < distributed < zero < optim < config < data < plan < train < interop
# (kernels/ is device code of ops; the strata command in tools/strata sits above them all).
# Checks every #include "strata/<folder>/...", "src/<folder>/...", "<folder>/...", "models/..." and
# "kernels/..." in src/, include/strata/, models/ (but custom_example, a user's model) and kernels/. First it
# plants a violation in a scratch tree and checks that it is caught, so a check that finds nothing is not
# mistaken for a clean tree.
# Usage: layering_test.sh SOURCE_DIR
set -uo pipefail

layers="core ops autograd nn models distributed zero optim config data plan train interop"

# Prints each violation under root $1; returns 1 when there is one.
check() {
  (cd "$1" && grep -rnE '^[[:space:]]*#[[:space:]]*include[[:space:]]+"[^"]+"' src include/strata models kernels 2>/dev/null) |
    grep -v '^models/custom_example/' |
    awk -v layers="$layers" '
      BEGIN { n = split(layers, l, " "); for (i = 1; i <= n; i++) rank[l[i]] = i; rank["kernels"] = rank["ops"] }
      {
        split($0, f, ":"); file = f[1]; line = f[2]
        match($0, /#[[:space:]]*include[[:space:]]+"[^"]+"/); inc = substr($0, RSTART, RLENGTH)
        sub(/^[^"]*"/, "", inc); sub(/"$/, "", inc)
        np = split(file, p, "/")
        from = (p[1] == "src") ? p[2] : (p[1] == "include") ? p[3] : p[1]
        nt = split(inc, t, "/")
        if (nt < 2) next
        to = (t[1] == "strata" || t[1] == "src") ? t[2] : t[1]
        if (!(from in rank) || !(to in rank)) next
        if (rank[to] > rank[from]) {
          printf "%s:%s: %s includes %s, but %s is above %s in the layering\n", file, line, from, inc, to, from
          bad = 1
        }
      }
      END { exit bad }' >&2
}

root=${1:?usage: layering_test.sh SOURCE_DIR}

scratch=$(mktemp -d "${TMPDIR:-/tmp}/strata-layering.XXXXXX")
trap 'rm -rf "$scratch"' EXIT
mkdir -p "$scratch/src/plan" "$scratch/include/strata/data"
printf '#include "strata/config/Config.h"\n#include "strata/train/Trainer.h"\n' > "$scratch/src/plan/Plan.cpp"
printf '#include "plan/Private.h"\n' > "$scratch/include/strata/data/Data.h"
planted=$(check "$scratch" 2>&1)
if [ $? -eq 0 ] || ! grep -q 'src/plan/Plan.cpp:2: plan includes strata/train/Trainer.h' <<<"$planted" ||
   ! grep -q 'include/strata/data/Data.h:1: data includes plan/Private.h' <<<"$planted" ||
   grep -q 'Config.h' <<<"$planted"; then
  echo "layering check: the planted violations were not reported as expected:" >&2
  echo "$planted" >&2
  exit 2
fi

if check "$root"; then
  echo "layering: no folder includes one above it ($layers)"
else
  echo "layering: fix the includes above (move what is needed down, or the code up)" >&2
  exit 1
fi
