"""pytest plugin for Horovod's suites under rrun: one JUnit file per rank, the deselection
(paths ringreduce does not offer), and the score of a run across its ranks.

    python -m horovod_conformance score RESULTS_DIR SUITE   # after the suite ran
"""

import os
import re
import sys
import xml.etree.ElementTree as ET

import pytest

# Horovod's GPU, NCCL, CCL, XLA, Adasum and sparse paths: not run, not scored.
NOT_SCORED = re.compile(r"gpu|cuda|nccl|ccl|xla|adasum|sparse", re.IGNORECASE)

# Tests written for Keras 2 (tf_keras), whose own code fails on the Keras 3 that TensorFlow 2.16+
# brings: not scored (docs/horovod.md lists them).
KERAS_2_ONLY = {
    "test_legacy_optimizer": "keras.optimizers.legacy is gone from Keras 3",
    "test_train_model_lr_schedule": "keras.losses.mean_squared_error, ThresholdedReLU and optimizer.lr are gone",
    "test_gradient_aggregation": "its optimizer subclasses Keras 2's OptimizerV2 (no learning_rate argument)",
    "test_gradient_aggregation_with_local_vars": "its optimizer subclasses Keras 2's OptimizerV2",
    "test_partial_distributed_optimizer": "it calls Variable.ref(), which Keras 3's variables lack",
    "test_broadcast_global_variables_callback_with_local_vars": "it calls Variable.ref() on Keras 3's variables",
    "test_partial_distributed_gradient_tape": "it calls Variable.ref() on Keras 3's variables",
    "test_horovod_syncbn_cpu": "BatchNormalization(fused=...) is gone from Keras 3",
}

# Tests that cannot pass here, each with its reason (docs/horovod.md lists them): scored as failures.
SKIPPED: dict[str, str] = {}


def _rank() -> str:
    for name in ("PMI_RANK", "OMPI_COMM_WORLD_RANK", "RINGREDUCE_RANK"):
        if name in os.environ:
            return os.environ[name]
    return "0"


def _keras_3() -> bool:
    """Whether tf.keras is Keras 3 (TF_USE_LEGACY_KERAS=1 with tf_keras installed makes it Keras 2)."""
    if os.environ.get("TF_USE_LEGACY_KERAS", "").lower() in ("1", "true"):
        return False
    try:
        import keras
    except ImportError:
        return False
    return int(keras.__version__.split(".")[0]) >= 3


def pytest_configure(config):
    if config.option.xmlpath:
        config.option.xmlpath = config.option.xmlpath.replace("{rank}", _rank())


def pytest_collection_modifyitems(config, items):
    deselected = [item for item in items if NOT_SCORED.search(item.name)]
    if deselected:
        config.hook.pytest_deselected(items=deselected)
        items[:] = [item for item in items if item not in deselected]
    for item in items:
        name = item.name.split("[")[0]
        unparameterized = re.sub(r"_\d+$", "", name)  # parameterized.expand's name_0, name_1
        keras_2_only = KERAS_2_ONLY.get(name) or KERAS_2_ONLY.get(unparameterized)
        if keras_2_only and _keras_3():
            item.add_marker(pytest.mark.skip(reason=f"Keras 2 only: {keras_2_only}"))
        elif name in SKIPPED:
            item.add_marker(pytest.mark.skip(reason=f"ringreduce: {SKIPPED[name]}"))


def _outcomes(path: str) -> dict[str, str]:
    outcomes = {}
    for case in ET.parse(path).getroot().iter("testcase"):
        kinds = {child.tag for child in case}
        outcome = "failed" if kinds & {"failure", "error"} else "skipped" if "skipped" in kinds else "passed"
        key = f"{case.get('classname')}::{case.get('name')}"
        if outcomes.get(key) != "failed":  # a teardown error is a second entry of the same test
            outcomes[key] = outcome
    return outcomes


def score(results: str, suite: str, ranks: int) -> int:
    """Prints the suite's score: a test passes when it passed on every rank that ran it and
    no rank failed it; a rank that never reported it (it died, or hung) fails it."""
    per_rank = []
    for rank in range(ranks):
        path = os.path.join(results, f"{suite}-rank{rank}.xml")
        per_rank.append(_outcomes(path) if os.path.exists(path) else {})
    names = sorted(set().union(*per_rank))
    combined = {}
    for name in names:
        seen = [outcomes.get(name, "failed") for outcomes in per_rank]
        combined[name] = "failed" if "failed" in seen else "skipped" if set(seen) == {"skipped"} else "passed"
    counts = {kind: sum(1 for outcome in combined.values() if outcome == kind)
              for kind in ("passed", "failed", "skipped")}
    for name, outcome in combined.items():
        if outcome != "passed":
            print(f"  {outcome:7s} {name.split('::')[-1]}")
    print(f"{suite} at {ranks} ranks: {counts['passed']} of {len(combined)} passed, "
          f"{counts['failed']} failed, {counts['skipped']} skipped")
    return 0 if counts["failed"] == 0 else 1


if __name__ == "__main__":
    if len(sys.argv) != 5 or sys.argv[1] != "score":
        sys.exit("usage: python -m horovod_conformance score RESULTS_DIR SUITE RANKS")
    sys.exit(score(sys.argv[2], sys.argv[3], int(sys.argv[4])))
