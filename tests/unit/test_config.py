"""The RINGREDUCE_* knobs: defaults, and clear errors for values that make no sense."""

import pytest

from ringreduce.config import Config


def test_defaults_follow_horovod():
    config = Config.from_env({})
    assert config.algorithm == "auto" and config.hierarchical is None and config.simulated_hosts is None
    assert config.gpu_transport == "auto"
    assert config.cycle_time_ms == 1.0
    assert config.cache_capacity == 1024
    assert config.fusion_threshold_bytes == 128 * 1024 * 1024
    assert config.stall_check_seconds == 60.0 and config.stall_shutdown_seconds is None
    assert config.timeline is None and not config.straggler_report


def test_values_are_read():
    env = {"RINGREDUCE_ALGORITHM": " MPI ", "RINGREDUCE_PIPELINE_CHUNK_BYTES": "4096",
           "RINGREDUCE_CYCLE_TIME": "2.5", "RINGREDUCE_CACHE_CAPACITY": "0", "RINGREDUCE_FUSION_THRESHOLD": "0",
           "RINGREDUCE_TIMELINE": "/tmp/t.json", "RINGREDUCE_STALL_CHECK_TIME": "5",
           "RINGREDUCE_STALL_SHUTDOWN_TIME": "30", "RINGREDUCE_STRAGGLER_REPORT": "1",
           "RINGREDUCE_SHM_PIECE_BYTES": "65536", "RINGREDUCE_HIERARCHICAL": "off", "RINGREDUCE_SIMULATED_HOSTS": "2",
           "RINGREDUCE_GPU_TRANSPORT": "NCCL"}
    assert Config.from_env(env) == Config(gpu_transport="nccl",
        algorithm="mpi", pipeline_chunk_bytes=4096, cycle_time_ms=2.5, cache_capacity=0, fusion_threshold_bytes=0,
        timeline="/tmp/t.json", stall_check_seconds=5.0, stall_shutdown_seconds=30.0, straggler_report=True,
        shared_memory_piece_bytes=65536, hierarchical=False, simulated_hosts=2)


@pytest.mark.parametrize("env, message", [
    ({"RINGREDUCE_ALGORITHM": "butterfly"},
     "RINGREDUCE_ALGORITHM='butterfly' is not one of auto, ring, shm, mpi, halving_doubling, tree"),
    ({"RINGREDUCE_GPU_TRANSPORT": "gloo"}, "RINGREDUCE_GPU_TRANSPORT='gloo' is not one of auto, nccl, mpi, staged"),
    ({"RINGREDUCE_HIERARCHICAL": "maybe"}, "RINGREDUCE_HIERARCHICAL='maybe' must be 1 or 0"),
    ({"RINGREDUCE_HIERARCHICAL": "1", "RINGREDUCE_ALGORITHM": "ring"},
     "RINGREDUCE_HIERARCHICAL=1 needs RINGREDUCE_ALGORITHM auto or shm, not ring"),
    ({"RINGREDUCE_SHM_PIECE_BYTES": "8"}, "RINGREDUCE_SHM_PIECE_BYTES='8' must be a whole number of at least 64"),
    ({"RINGREDUCE_SIMULATED_HOSTS": "0"}, "RINGREDUCE_SIMULATED_HOSTS='0' must be a whole number of at least 1"),
    ({"RINGREDUCE_PIPELINE_CHUNK_BYTES": "0"}, "RINGREDUCE_PIPELINE_CHUNK_BYTES='0' must be a whole number of "
                                               "at least 1"),
    ({"RINGREDUCE_FUSION_THRESHOLD": "4k"}, "RINGREDUCE_FUSION_THRESHOLD='4k' must be a whole number"),
    ({"RINGREDUCE_CYCLE_TIME": "-1"}, "RINGREDUCE_CYCLE_TIME='-1' must be a number of at least 0"),
    ({"RINGREDUCE_CACHE_CAPACITY": "1.5"}, "RINGREDUCE_CACHE_CAPACITY='1.5' must be a whole number"),
])
def test_bad_values_are_named(env, message):
    with pytest.raises(ValueError) as caught:
        Config.from_env(env)
    assert str(caught.value).startswith(message)


def test_every_setting_is_one_knob_and_every_flag_shows_the_default_the_core_uses():
    import dataclasses

    from click.testing import CliRunner

    from ringreduce.config import KNOBS
    from ringreduce.launcher import cli

    assert {k.field for k in KNOBS if k.field} == {f.name for f in dataclasses.fields(Config)}
    assert len({k.variable for k in KNOBS}) == len(KNOBS)
    shown = " ".join(CliRunner().invoke(cli.main, ["--help"]).output.split())
    for knob in KNOBS:
        if knob.flag and not (knob.kind == "switch" and "/" not in knob.flag):
            assert f"[default: {knob.default_text}]" in shown, knob.flag
    fusion = next(k for k in KNOBS if k.field == "fusion_threshold_bytes")
    assert fusion.default_text == str(Config.fusion_threshold_bytes >> 20)
    assert cli.environment((), {}, {"fusion_threshold_mb": 2.5}) == {"RINGREDUCE_FUSION_THRESHOLD": str(5 << 19)}
