#!/usr/bin/env bash
# Horovod's own test suites against ringreduce: tests/conformance/horovod.sh HOROVOD_CHECKOUT [NP] [SUITE...] [-- PYTEST_ARGS]
#
# HOROVOD_CHECKOUT is a work tree of github.com/horovod/horovod (tag v0.28.1). Each suite of its
# test/parallel runs under rrun at NP ranks (2), with the shim package `horovod` (whose modules
# are ringreduce's) first on the path, and a per-test timeout; the score per suite comes last.
# Nothing of the checkout is copied into this repository: results go to $RESULTS.
set -uo pipefail
here="$(cd "$(dirname "$0")" && pwd)"
checkout="${1:?usage: $0 HOROVOD_CHECKOUT [NP] [SUITE...] [-- PYTEST_ARGS]}"; shift
np=2
if [[ $# -gt 0 && $1 =~ ^[0-9]+$ ]]; then np=$1; shift; fi
suites=()
while [[ $# -gt 0 && $1 != -- ]]; do suites+=("$1"); shift; done
[[ $# -gt 0 ]] && shift
[[ ${#suites[@]} -eq 0 ]] && suites=(test_torch.py test_tensorflow.py test_tensorflow2_keras.py)
python="${PYTHON:-python3}"
results="${RESULTS:-/tmp/ringreduce-horovod-conformance}"
per_test_timeout="${PER_TEST_TIMEOUT:-120}"
suite_timeout="${SUITE_TIMEOUT:-1200}"
mkdir -p "$results"
test -d "$checkout/test/parallel" || { echo "$checkout/test/parallel: no such folder (a horovod work tree?)" >&2; exit 2; }
export PYTHONPATH="$here/shim${PYTHONPATH:+:$PYTHONPATH}"
status=0
for suite in "${suites[@]}"; do
    rm -f "$results/$suite"-rank*.xml
    started=$(date +%s)
    (cd "$checkout/test/parallel" && timeout "$suite_timeout" "$python" -m ringreduce.launcher -np "$np" \
        "$python" -m pytest -p horovod_conformance -p no:cacheprovider -q -rN --timeout="$per_test_timeout" \
        --junitxml="$results/$suite-rank{rank}.xml" "$suite" "$@") > "$results/$suite.log" 2>&1
    echo "== $suite: $(($(date +%s) - started)) s under rrun -np $np (log: $results/$suite.log)"
    "$python" -m conformance_results score "$results" "$suite" "$np" || status=1
done
exit "$status"
