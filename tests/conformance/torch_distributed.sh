#!/usr/bin/env bash
# torch's own torch.distributed suite against the ringreduce backend: tests/conformance/torch_distributed.sh [NP] [-- PYTEST_ARGS]
#
# The suite ships with the torch wheel (torch.testing._internal.distributed.distributed_test);
# tests/conformance/shim/torch_distributed_suite.py runs its tests under rrun at NP ranks (3),
# every rank in one ringreduce process group standing in for gloo, or for torch's MPI backend
# with AS=mpi, with a per-test timeout; the score comes last. Results go to $RESULTS. Its group
# tests need 8 ranks with AS=gloo (the suite's own rule), and 4 for a few others.
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
export RINGREDUCE_TORCH_SUITE_AS="${AS:-gloo}"
mkdir -p "$results"
rm -f "$results/$suite"-rank*.xml
export PYTHONPATH="$here/shim${PYTHONPATH:+:$PYTHONPATH}"
started=$(date +%s)
(cd "$here/shim" && timeout "$suite_timeout" "$python" -m ringreduce.launcher -np "$np" \
    "$python" -m pytest -p conformance_results -p no:cacheprovider -q -rN --timeout="$per_test_timeout" \
    --junitxml="$results/$suite-rank{rank}.xml" "$suite" "$@") > "$results/$suite.log" 2>&1
echo "== $suite in $RINGREDUCE_TORCH_SUITE_AS's place: $(($(date +%s) - started)) s under rrun -np $np (log: $results/$suite.log)"
"$python" -m conformance_results score "$results" "$suite" "$np"
