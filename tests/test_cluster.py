"""Two hosts for real: network namespaces with a veth pair and an sshd each (tests/cluster/up.sh),
reached by the MPI launcher over ssh. The collectives run there too (test_collectives'
two-hosts-4). These tests skip, saying why, where the cluster cannot be made."""

import json
import time
import uuid

import psutil
import pytest

from launch import cluster_missing, require_cluster, run_job

pytestmark = pytest.mark.mpi


@pytest.fixture(autouse=True)
def cluster():
    if cluster_missing():
        require_cluster(cluster_missing())


def test_killing_a_rank_on_the_other_host_ends_the_job_fast_and_names_it():
    marker = f"marker-{uuid.uuid4().hex}"
    started = time.monotonic()
    job = run_job(4, "misbehave.py", "sigkill", marker, rrun_args=("-H", "hosta:1,hostb:3"), on_cluster=True,
                  timeout=60)
    assert time.monotonic() - started < 25
    assert job.returncode == 128 + 9, job.stderr[-2000:]
    assert job.last_line == "rrun: rank 1 (on hostb) failed first: killed by signal 9 (SIGKILL)", job.last_line
    time.sleep(1)
    assert [p.info["cmdline"] for p in psutil.process_iter(["cmdline"]) if marker in (p.info["cmdline"] or [])] == []



def test_other_hosts_get_only_the_variables_rrun_forwards():
    job = run_job(2, "environment.py", "PRIVATE_TOKEN", "FORWARDED", "RINGREDUCE_CYCLE_TIME", "PATH",
                  env={"PRIVATE_TOKEN": "do-not-send", "FORWARDED": "yes", "RINGREDUCE_CYCLE_TIME": "2"},
                  rrun_args=("-H", "hosta:1,hostb:1", "-x", "FORWARDED"), on_cluster=True, timeout=60)
    assert job.returncode == 0, job.stderr[-2000:]
    remote = json.loads(job.lines_of(1)[0])
    assert remote["host"] == "hostb"
    assert remote["PRIVATE_TOKEN"] is None
    assert remote["FORWARDED"] == "yes" and remote["RINGREDUCE_CYCLE_TIME"] == "2" and remote["PATH"]
