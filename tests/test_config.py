"""The RINGREDUCE_* knobs: defaults, and clear errors for values that make no sense."""

import pytest

from ringreduce.config import Config


def test_defaults():
    assert Config.from_env({}) == Config(algorithm="ring", pipeline_chunk_bytes=4 << 20)


def test_values_are_read():
    env = {"RINGREDUCE_ALGORITHM": " MPI ", "RINGREDUCE_PIPELINE_CHUNK_BYTES": "4096"}
    assert Config.from_env(env) == Config(algorithm="mpi", pipeline_chunk_bytes=4096)


@pytest.mark.parametrize("env, message", [
    ({"RINGREDUCE_ALGORITHM": "tree"}, "RINGREDUCE_ALGORITHM='tree' is not one of ring, mpi"),
    ({"RINGREDUCE_PIPELINE_CHUNK_BYTES": "0"}, "RINGREDUCE_PIPELINE_CHUNK_BYTES='0' must be a whole number of at least 1"),
    ({"RINGREDUCE_PIPELINE_CHUNK_BYTES": "4k"}, "RINGREDUCE_PIPELINE_CHUNK_BYTES='4k' must be a positive"),
])
def test_bad_values_are_named(env, message):
    with pytest.raises(ValueError, match=message.replace("(", r"\(")):
        Config.from_env(env)
