"""Property-based tests (hypothesis) of the collectives' input handling on real ranks: shapes,
dtypes, layouts (non-contiguous, read-only, empty), Python lists and scalars, roots and names
each give the numpy reference or a clear error of the documented type."""

import pytest

from launch import run_job

pytest.importorskip("hypothesis")


def test_every_drawn_input_gives_the_reference_or_a_clear_error():
    job = run_job(2, "core/properties.py", 150, timeout=110)
    assert job.returncode == 0, job.stderr[-4000:]
    for rank in range(2):
        assert job.lines_of(rank) == ["passed allreduce_matches_numpy_or_fails_clearly",
                                      "passed gathers_and_broadcasts_match_numpy_or_fail_clearly",
                                      "passed any_name_works"]
