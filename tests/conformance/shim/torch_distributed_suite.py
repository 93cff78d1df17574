"""torch's own torch.distributed suite against the ringreduce backend, under rrun.

The suite is `DistributedTest._DistTestBase` of torch/testing/_internal/distributed/distributed_test.py,
which the torch wheel ships; torch runs it on gloo with a fresh set of processes per test. Here
every rank of one rrun job runs the same tests in the same order on one `ringreduce` process group,
in the place of gloo, or of torch's MPI backend (RINGREDUCE_TORCH_SUITE_AS=gloo or mpi): the suite
is told that is its backend (BACKEND), so it picks that backend's tests and expects its results
and errors, while the default group every test uses is ringreduce's. The few tests that make gloo
groups of their own, or check the backend's name, are skipped with the reason (NOT_RINGREDUCE_S).

    rrun -np 3 python -m pytest -p conformance_results tests/conformance/shim/torch_distributed_suite.py
"""

import os
import tempfile
import unittest
from datetime import timedelta

# What the suite chooses its tests and expectations by.
os.environ["BACKEND"] = os.environ.get("RINGREDUCE_TORCH_SUITE_AS", "gloo")

import torch.distributed as dist  # noqa: E402
from torch.testing._internal import common_distributed  # noqa: E402
from torch.testing._internal.common_utils import TestCase  # noqa: E402
from torch.testing._internal.distributed import distributed_test  # noqa: E402

import ringreduce.torch  # noqa: E402  (registers the backend)

BACKEND = ringreduce.torch.process_group.BACKEND

# The suite's tests that would not test ringreduce's backend, and why.
NOT_RINGREDUCE_S = {
    "test_get_backend": "it checks the default group's backend by name",
    "test_monitored_barrier_gloo": "monitored_barrier runs on a gloo group the test makes",
    "test_monitored_barrier_gloo_subgroup": "monitored_barrier runs on a gloo group the test makes",
    "test_monitored_barrier_gloo_rank_0_timeout": "monitored_barrier runs on a gloo group the test makes",
    "test_monitored_barrier_failure_order": "monitored_barrier runs on a gloo group the test makes",
    "test_monitored_barrier_wait_all_ranks": "monitored_barrier runs on a gloo group the test makes",
    "test_monitored_barrier_allreduce_hang": "monitored_barrier runs on a gloo group the test makes",
    "test_monitored_barrier_allreduce_hang_wait_all_ranks": "monitored_barrier runs on a gloo group the test makes",
    "test_barrier_timeout_global": "it makes a new default group, of gloo, from a file",
}

# The suite's skips inside a test body end the test's process with one of these codes.
SKIP_EXIT_CODES = {skip.exit_code: skip.message for skip in common_distributed.TEST_SKIPS.values()}

# torch's harness gives each test a group with this timeout; its longer ones are per test.
GROUP_TIMEOUT = timedelta(seconds=distributed_test.default_pg_timeout)


class TestRingreduceBackend(distributed_test.DistributedTest._DistTestBase, TestCase):
    """The suite's tests, each run by every rank in one process group (the attributes below are
    those torch's per-test harness gives a test)."""

    @classmethod
    def setUpClass(cls) -> None:
        super().setUpClass()
        if not dist.is_initialized():
            dist.init_process_group(BACKEND, timeout=GROUP_TIMEOUT)
        shared = [tempfile.mkdtemp(prefix="ringreduce-torch-suite-") if dist.get_rank() == 0 else None]
        dist.broadcast_object_list(shared)
        cls.shared_dir = shared[0]
        if dist.get_rank() == 0:
            for folder in ("barrier", "test_dir", "init_dir"):
                os.mkdir(os.path.join(cls.shared_dir, folder))
        dist.barrier()
        os.environ["TEMP_DIR"] = cls.shared_dir
        os.environ["INIT_METHOD"] = "env://"

    @property
    def rank(self) -> int:
        return dist.get_rank()

    @property
    def world_size(self) -> str:
        return os.environ["WORLD_SIZE"]

    @property
    def file_name(self) -> str:
        return os.path.join(self.shared_dir, "init_dir", "shared_init_file")

    @property
    def skip_return_code_checks(self) -> list:
        return []

    def setUp(self) -> None:
        """Every rank starts the test together, with the suite's file barrier counting from zero."""
        super().setUp()
        dist.barrier()
        own_file = os.path.join(self.shared_dir, "barrier", str(os.getpid()))
        if os.path.exists(own_file):
            os.unlink(own_file)
        distributed_test.Barrier.barrier_id = 0
        dist.barrier()

    def _callTestMethod(self, method) -> None:
        try:
            method()
        except SystemExit as stop:
            if stop.code in SKIP_EXIT_CODES:
                raise unittest.SkipTest(SKIP_EXIT_CODES[stop.code]) from None
            raise


for _name, _reason in NOT_RINGREDUCE_S.items():
    setattr(TestRingreduceBackend, _name, unittest.skip(f"not ringreduce's: {_reason}")(
        getattr(distributed_test.DistributedTest._DistTestBase, _name)))
