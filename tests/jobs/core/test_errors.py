"""Wrong calls raise the same clear error on every rank, naming the ranks and what differed;
the job goes on working after a caught error, and an uncaught one ends it with rrun naming
the rank."""

import signal
import time

import pytest

from launch import run_job

# case -> (exception type, text every rank's message contains), at 3 ranks with rank 1 odd.
EXPECTED = {
    "shape": ("MismatchError", "allreduce 'grad' does not match across ranks: shape (3,) on ranks 0, 2 "
                               "but (4,) on rank 1"),
    "sites": ("MismatchError", "allreduce 'placed' does not match across ranks: shape (3,) on ranks 0, 2 but (4,) on "
                               "rank 1 (called at mismatch.py:23 on ranks 0, 2 but mismatch.py:21 on rank 1)"),
    "dtype": ("MismatchError", "dtype float32 on ranks 0, 2 but float64 on rank 1"),
    "op": ("MismatchError", "op Sum on ranks 0, 2 but Max on rank 1"),
    "root": ("MismatchError", "root_rank 0 on ranks 0, 2 but 1 on rank 1"),
    "kind": ("MismatchError", "does not match across ranks: collective allreduce on ranks 0, 2 but "
                              "broadcast on rank 1"),
    "scaling": ("MismatchError", "prescale_factor 1.0 on ranks 0, 2 but 2.0 on rank 1"),
    "compression": ("MismatchError", "compression none on ranks 0, 2 but fp16 on rank 1"),
    "scaling-type": ("TypeError", "failed on rank 1: float() argument must be a string or a real number, not 'list'"),
    "unsupported": ("UnsupportedDtypeError", "failed on rank 1: dtype complex64 is not supported"),
    "allgather-trailing": ("MismatchError", "shape after the first dimension (3,) on ranks 0, 2 but (4,) "
                                            "on rank 1"),
    "splits": ("ValueError", "failed on rank 1: alltoall splits [5, 5, 5] must be non-negative "
                             "and add up to the first dimension (4)"),
    "bool-sum": ("UnsupportedDtypeError", "failed on ranks 0, 1, 2: Sum is not defined for bool"),
    "root-out-of-range": ("ValueError", "root_rank 3 is not a rank of this job (0 to 2)"),
    "duplicate": ("ValueError", "while a request of that name is still in flight there"),
    "length": ("MismatchError", "allreduce 'grad' does not match across ranks: shape (3,) on ranks 0, 2 but (2000,) "
                                "on rank 1"),
    "name": ("MismatchError", "plain calls pair up in program order, and here their names differ: allreduce 'even' "
                              "on ranks 0, 2 but allreduce 'odd' on rank 1"),
}


def test_every_mismatch_raises_on_every_rank_and_the_job_recovers(mpi_python):
    job = run_job(3, "core/mismatch.py", "--catch", *EXPECTED, python=mpi_python)
    assert job.returncode == 0, job.stderr[-3000:]
    for rank in range(3):
        lines = job.lines_of(rank)
        for case, (error_type, text) in EXPECTED.items():
            caught = [line for line in lines if line.startswith(f"{case}: caught ")]
            assert len(caught) == 1, (rank, case, lines)
            assert caught[0].startswith(f"{case}: caught {error_type}: "), caught[0]
            assert text in caught[0], caught[0]
            assert f"{case}: afterwards sum = [3.0, 3.0]" in lines


def test_collective_before_init_is_a_clear_error():
    job = run_job(2, "core/mismatch.py", "--catch", "before-init")
    assert job.returncode == 0, job.stderr[-3000:]
    for rank in range(2):
        assert ("before-init: caught NotInitializedError: ringreduce has not been initialized; "
                "call ringreduce.init() first") in job.lines_of(rank)


def test_an_mpi_without_calls_from_other_threads_is_a_clear_error_at_init(tmp_path):
    job = run_job(2, "core/collectives.py", str(tmp_path), env={"MPI4PY_RC_THREAD_LEVEL": "funneled"}, timeout=60)
    assert job.returncode != 0
    assert "MPI was started with MPI_THREAD_FUNNELED, but ringreduce calls MPI from its engine thread" in job.stderr


@pytest.mark.parametrize("case", sorted(EXPECTED))
def test_uncaught_mismatch_ends_the_job_with_the_error(case):
    job = run_job(2, "core/mismatch.py", case, timeout=60)
    assert job.returncode != 0
    error_type, _ = EXPECTED[case]
    assert "failed first" in job.last_line and error_type in job.last_line, job.last_line
    # The first rank to abort ends the others, possibly before they print their own copy.
    assert any(error_type in line for rank in range(2) for line in job.lines_of(rank, "stderr"))


@pytest.mark.parametrize("thread", ["caller", "engine"])
def test_a_broken_engine_fails_every_call_and_still_shuts_down(thread):
    """A cycle that raises leaves the ranks out of step: that call and every later one fail with
    the cause, and shutdown() (and the exit after it) neither hangs nor raises."""
    job = run_job(2, "core/broken.py", thread, timeout=60)
    assert job.returncode == 0, job.stderr[-3000:]
    for rank in range(2):
        lines = job.lines_of(rank)
        cause = f"the ringreduce engine on rank {rank} failed: RuntimeError('injected fault')"
        assert f"caught: {cause}" in lines and f"later: {cause}" in lines and "shut down" in lines, lines
        assert "chained: RuntimeError('injected fault')" in lines, lines
    assert "Exception ignored" not in job.stderr and "AttributeError" not in job.stderr, job.stderr[-3000:]


def test_a_rank_that_raises_is_named(mpi_python):
    job = run_job(3, "launcher/misbehave.py", "raise", python=mpi_python, timeout=60)
    assert job.returncode == 1
    assert job.last_line.startswith("rrun: rank 1 ")
    assert "ValueError: rank 1 fails on purpose" in job.last_line
    assert "finished" not in job.stdout


@pytest.mark.parametrize("mode", ["exit0", "exit3"])
def test_a_rank_that_leaves_early_is_named(mode, mpi_python):
    job = run_job(2, "launcher/misbehave.py", mode, python=mpi_python, timeout=60)
    assert job.returncode != 0
    # Rank 0 fails because rank 1 left; rrun blames rank 1, on its host.
    assert "PeerExitedError: rank 1 shut down while rank 0 waited in plain allreduce 'after'" in job.stderr
    assert job.last_line.startswith("rrun: rank 1 (on "), job.last_line
    assert job.last_line.endswith(") failed first: left the job while others waited for it (its script ended or "
                                  "called sys.exit): rank 1 shut down while rank 0 waited in plain allreduce 'after'; "
                                  "every rank must make the same collective calls"), job.last_line


@pytest.mark.parametrize("mode, signum", [("sigkill", signal.SIGKILL), ("segfault", signal.SIGSEGV)])
def test_a_killed_rank_is_named_with_its_signal_and_the_job_ends_fast(mode, signum, mpi_python):
    started = time.monotonic()
    job = run_job(3, "launcher/misbehave.py", mode, python=mpi_python, timeout=60)
    # Start-up and the failure's notice together; the ranks waiting in the allreduce do not hang.
    assert time.monotonic() - started < 20
    assert job.returncode == 128 + signum
    assert job.last_line.startswith("rrun: rank 1 (on ")
    assert f"killed by signal {int(signum)} ({signal.Signals(signum).name})" in job.last_line


@pytest.mark.parametrize("verbose", [False, True])
def test_mpiexecs_cleanup_banner_shows_only_with_verbose_once_the_rank_is_named(verbose):
    """MPICH's Hydra prints a banner with rrun's own SIGTERM as the exit code after rank 1 was
    killed; rrun's line, which names the rank and its signal, is what the user reads last. Without
    --verbose the banner never shows; with it, it shows when Hydra got to print it before it ended
    (not every time: it is ended too), which tests/unit/test_banners.py covers line by line."""
    job = run_job(2, "launcher/misbehave.py", "sigkill", rrun_args=("--verbose",) if verbose else (), timeout=60)
    assert job.returncode == 128 + signal.SIGKILL
    assert job.last_line.startswith("rrun: rank 1 (on ") and "killed by signal 9 (SIGKILL)" in job.last_line
    if not verbose:
        assert "BAD TERMINATION OF ONE OF YOUR APPLICATION PROCESSES" not in job.stdout + job.stderr
