"""torchrun's conventions as rrun sets them (launcher/torchrun.py), and what the torch.distributed
backend refuses, without ranks."""

import socket

import pytest

import ringreduce
from ringreduce.launcher import torchrun


def test_a_ranks_host_and_place_come_from_rrun_s_placement():
    environ = {torchrun.HOST_SLOTS_VARIABLE: "3,2"}
    got = [torchrun.rank_environment(environ, 5, rank) for rank in range(5)]
    assert [(g["GROUP_RANK"], g["LOCAL_RANK"], g["LOCAL_WORLD_SIZE"]) for g in got] == [
        ("0", "0", "3"), ("0", "1", "3"), ("0", "2", "3"), ("1", "0", "2"), ("1", "1", "2")]
    assert {(g["WORLD_SIZE"], g["GROUP_WORLD_SIZE"]) for g in got} == {("5", "2")}
    assert [g["RANK"] for g in got] == ["0", "1", "2", "3", "4"]


def test_without_a_placement_slurm_s_node_and_the_mpi_s_local_rank_decide():
    environ = {"SLURM_NODEID": "1", "SLURM_JOB_NUM_NODES": "2", "MPI_LOCALRANKID": "3", "MPI_LOCALNRANKS": "4"}
    got = torchrun.rank_environment(environ, 8, 7)
    assert (got["GROUP_RANK"], got["GROUP_WORLD_SIZE"], got["LOCAL_RANK"], got["LOCAL_WORLD_SIZE"]) == (
        "1", "2", "3", "4")


def test_master_port_is_free_and_below_the_ports_the_kernel_hands_out(tmp_path, monkeypatch):
    port = torchrun.free_master_port()
    ephemeral_start = int(open(torchrun.EPHEMERAL_PORTS).read().split()[0])
    assert torchrun.LOWEST_MASTER_PORT <= port < ephemeral_start
    with socket.socket() as listener:
        listener.bind(("", port))  # free: rank 0's store can listen there

    ranges = tmp_path / "ip_local_port_range"
    ranges.write_text(f"{torchrun.LOWEST_MASTER_PORT + 1}\t60999\n")
    monkeypatch.setattr(torchrun, "EPHEMERAL_PORTS", str(ranges))
    with socket.socket() as taken:
        taken.bind(("", torchrun.LOWEST_MASTER_PORT))  # the only candidate is taken: the kernel chooses
        assert torchrun.free_master_port() != torchrun.LOWEST_MASTER_PORT


def test_the_rendezvous_is_rank_0_s_host_and_what_the_user_set_stays():
    local = torchrun.rendezvous(None, {})
    assert local["MASTER_ADDR"] == "127.0.0.1" and 0 < int(local["MASTER_PORT"]) < 65536
    remote = torchrun.rendezvous([("node7", 4), ("node8", 4)], {})
    assert remote["MASTER_ADDR"] == "node7" and remote[torchrun.HOST_SLOTS_VARIABLE] == "4,4"
    assert torchrun.rendezvous(None, {"MASTER_ADDR": "head", "MASTER_PORT": "29500"}) == {}


def test_the_backend_names_the_reductions_it_does_not_serve():
    dist = pytest.importorskip("torch.distributed")
    from ringreduce.torch import process_group

    options = dist.AllreduceOptions()
    options.reduceOp = dist.ReduceOp.BAND
    with pytest.raises(NotImplementedError, match="all_reduce with BAND on the ringreduce backend"):
        process_group._reduction(options, "all_reduce")
    options.reduceOp = dist._make_nccl_premul_sum(0.5)  # NCCL's: a sum of each rank's tensor times 0.5
    assert process_group._reduction(options, "all_reduce") == (ringreduce.Sum, 0.5)
