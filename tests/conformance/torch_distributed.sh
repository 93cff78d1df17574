#!/usr/bin/env bash
# torch's own torch.distributed suite against the ringreduce backend: tests/conformance/torch_distributed.sh [NP] [-- PYTEST_ARGS]
#
# The suite ships with the torch wheel (torch.testing._internal.distributed.distributed_test);
# tests/conformance/shim/torch_distributed_suite.py runs its tests under rrun at NP ranks (3, as
# torch's own CI runs it on gloo), every rank in one ringreduce process group, with a per-test
# timeout; the score comes last. Results go to $RESULTS.
set -uo pipefail
here="$(cd "$(dirname "$0")" && pwd)"
np=3
if [[ $# -gt 0 && $1 =~ ^[0-9]+$ ]]; then np=$1; shift; fi
[[ $# -gt 0 && $1 == -- ]] && shift
python="${PYTHON:-python3}"
results="${RESULTS:-/tmp/ringreduce-torch-conformance}"
per_test_timeout="${PER_TEST_TIMEOUT:-180}"
suite_timeout="${SUITE_TIMEOUT:-3600}"
suite=torch_distributed_suite.py
mkdir -p "$results"
rm -f "$results/$suite"-rank*.xml
export PYTHONPATH="$here/shim${PYTHONPATH:+:$PYTHONPATH}"
started=$(date +%s)
(cd "$here/shim" && timeout "$suite_timeout" "$python" -m ringreduce.launcher -np "$np" \
    "$python" -m pytest -p conformance_results -p no:cacheprovider -q -rN --timeout="$per_test_timeout" \
    --junitxml="$results/$suite-rank{rank}.xml" "$suite" "$@") > "$results/$suite.log" 2>&1
echo "== $suite: $(($(date +%s) - started)) s under rrun -np $np (log: $results/$suite.log)"
"$python" -m conformance_results score "$results" "$suite" "$np"
