"""pytest plugin for Horovod's suites under rrun: one JUnit file per rank, the deselection
(paths ringreduce does not offer); the score is conformance_results'.
"""

import os
import re

import pytest
from conformance_results import name_junit_file_by_rank

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
    name_junit_file_by_rank(config)


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
