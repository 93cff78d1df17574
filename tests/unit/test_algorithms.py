"""The algorithms as pure logic, at 1 to 8 ranks, over an in-memory transport of threads and
queues: many more rank counts and lengths than real processes on two cores can afford."""

import inspect
import itertools
import queue

import numpy as np
import pytest
from threads import QueueTransport, ThreadSegment, data, run_ranks, shared_host

from ringreduce.algorithms import halving, pairwise, ring, tree
from ringreduce.algorithms.choice import plan
from ringreduce.algorithms.contract import DeviceFamily, HostFamily
from ringreduce.algorithms.device import CudaAwareMpi, Nccl, Staged
from ringreduce.algorithms.families import HalvingDoublingFamily, RingFamily, TreeFamily
from ringreduce.algorithms.mpi_native import MPIAlgorithms
from ringreduce.algorithms.rank_order import RankOrderFamily
from ringreduce.algorithms.shared_memory import SharedMemory
from ringreduce.config import Config
from ringreduce.errors import RingReduceError
from ringreduce.machine import layout
from ringreduce.machine.layout import Concatenation, disjoint
from ringreduce.machine.topology import Topology
from ringreduce.ops import ReduceOp

SIZES = range(1, 9)


@pytest.mark.parametrize("size", SIZES)
@pytest.mark.parametrize("chunk", [1, 3, 1 << 20])
def test_ring_allreduce(size, chunk):
    for length in sorted({0, 1, size - 1, size, size + 1, 97}):
        def work(t, length=length):
            buf = data(t.rank, length)
            ring.allreduce(t, buf, np.add, np.empty(length // size + 1, np.int64), chunk)
            return buf

        expected = np.sum([data(r, length) for r in range(size)], axis=0, dtype=np.int64)
        for got in run_ranks(size, work):
            np.testing.assert_array_equal(got, expected)


@pytest.mark.parametrize("size", SIZES)
@pytest.mark.parametrize("chunk", [1, 3, 1 << 20])
@pytest.mark.parametrize("algorithm", ["halving_doubling", "tree"])
def test_logarithmic_allreduces(size, chunk, algorithm):
    """Recursive halving and doubling (with the fold at rank counts that are not powers of two)
    and the binomial tree, at every length that leaves a rank's segment empty or uneven."""
    for length in sorted({0, 1, size - 1, size, size + 1, 97}):
        def work(t, length=length):
            buf = data(t.rank, length)
            if algorithm == "tree":
                scratch = np.empty(max(1, length * tree.children_of(t.rank, size)), np.int64)
                tree.allreduce(t, buf, np.add, scratch, chunk)
            else:
                halving.allreduce(t, buf, np.add, np.empty(max(1, length), np.int64), chunk)
            return buf

        expected = np.sum([data(r, length) for r in range(size)], axis=0, dtype=np.int64)
        for got in run_ranks(size, work):
            np.testing.assert_array_equal(got, expected)


def test_the_fold_pairs_the_first_ranks_and_numbers_the_rest():
    folds = [halving.Fold(rank, 6) for rank in range(6)]  # 6 = 4 + 2: ranks 0-3 fold in pairs
    assert [f.sits_out for f in folds] == [True, False, True, False, False, False]
    assert [f.number for f in folds if not f.sits_out] == [0, 1, 2, 3]
    assert [folds[0].real(n) for n in range(4)] == [1, 3, 4, 5]
    assert halving.Fold(3, 4).partner is None and halving.Fold(0, 1).width == 1


def _finish_test(size, allreduce, place=None):
    """`allreduce(context, buf, finish)` (context: the rank's transport or segment) with a finish
    that multiplies by 10 and counts the elements it saw: every rank must get 10 times the sum
    (each stretch was finished before it was passed on), and the ranks together must have
    finished every element exactly once."""
    length = 97
    seen = [0] * size

    def work(context):
        rank = context.rank
        buf = data(rank, length)

        def finish(stretch):
            seen[rank] += len(stretch)
            np.multiply(stretch, 10, out=stretch)

        allreduce(context, buf, finish)
        return buf

    expected = 10 * np.sum([data(r, length) for r in range(size)], axis=0, dtype=np.int64)
    for got in run_ranks(size, work, place):
        np.testing.assert_array_equal(got, expected)
    assert sum(seen) == length, seen


@pytest.mark.parametrize("size", SIZES)
def test_ring_allreduce_finishes_each_segment_once_before_passing_it_on(size):
    _finish_test(size, lambda t, buf, finish: ring.allreduce(t, buf, np.add, np.empty(98, np.int64), 5, finish))


@pytest.mark.parametrize("size", SIZES)
def test_logarithmic_allreduces_finish_each_element_once(size):
    _finish_test(size, lambda t, buf, finish: halving.allreduce(t, buf, np.add, np.empty(97, np.int64), 5, finish))
    _finish_test(size, lambda t, buf, finish: tree.allreduce(
        t, buf, np.add, np.empty(97 * max(1, tree.children_of(t.rank, size)), np.int64), 5, finish))


@pytest.mark.parametrize("size", [1, 2, 3, 4])
def test_shared_memory_allreduce_finishes_each_slice_once_before_passing_it_on(size):
    host = shared_host(size, 24)
    _finish_test(size, lambda segment, buf, finish: SharedMemory(segment).allreduce(buf, ReduceOp.SUM, None, finish),
                 lambda rank, _: ThreadSegment(rank, host))


@pytest.mark.parametrize("size", SIZES)
def test_ring_reduce_scatter_with_uneven_and_empty_segments(size):
    counts = [(3 * r) % 4 for r in range(size)]  # includes empty segments
    offsets = layout.offsets_of(counts)

    def work(t):
        buf = data(t.rank, offsets[-1])
        ring.reduce_scatter(t, buf, offsets, np.maximum, np.empty(4, np.int64), 2)
        return buf[offsets[t.rank]:offsets[t.rank + 1]]

    expected = np.max([data(r, offsets[-1]) for r in range(size)], axis=0)
    for rank, got in enumerate(run_ranks(size, work)):
        np.testing.assert_array_equal(got, expected[offsets[rank]:offsets[rank + 1]])


@pytest.mark.parametrize("size", SIZES)
@pytest.mark.parametrize("allgather", [ring.allgather, halving.allgather], ids=["ring", "halving_doubling"])
def test_allgather_ragged(size, allgather):
    counts = [r % 3 for r in range(size)]  # empty segments among them
    offsets = layout.offsets_of(counts)

    def work(t):
        buf = np.zeros(offsets[-1], np.int64)
        buf[offsets[t.rank]:offsets[t.rank + 1]] = data(t.rank, counts[t.rank])
        allgather(t, buf, offsets)
        return buf

    expected = np.concatenate([data(r, counts[r]) for r in range(size)])
    for got in run_ranks(size, work):
        np.testing.assert_array_equal(got, expected)


@pytest.mark.parametrize("size", SIZES)
@pytest.mark.parametrize("chunk", [1, 5, 1 << 20])
def test_tree_broadcast_from_every_root(size, chunk):
    for root in range(size):
        def work(t, root=root):
            buf = data(t.rank, 23, np.float32)
            tree.broadcast(t, buf, root, chunk)
            return buf

        for got in run_ranks(size, work):
            np.testing.assert_array_equal(got, data(root, 23, np.float32))


@pytest.mark.parametrize("size", SIZES)
def test_pairwise_alltoallv(size):
    splits = [[(s + 2 * d) % 3 for d in range(size)] for s in range(size)]

    def work(t):
        send = data(t.rank, sum(splits[t.rank]))
        received = [splits[s][t.rank] for s in range(size)]
        recv = np.empty(sum(received), np.int64)
        pairwise.alltoallv(t, send, layout.offsets_of(splits[t.rank]), recv, layout.offsets_of(received))
        return recv

    for rank, got in enumerate(run_ranks(size, work)):
        blocks = [data(s, sum(splits[s]))[sum(splits[s][:rank]):sum(splits[s][:rank + 1])] for s in range(size)]
        np.testing.assert_array_equal(got, np.concatenate(blocks))


def test_even_counts():
    assert layout.even_counts(7, 3) == [3, 2, 2]
    assert layout.even_counts(2, 4) == [1, 1, 0, 0]
    assert layout.offsets_of([3, 0, 2]) == [0, 3, 3, 5]


# The shared-memory algorithms, with pieces far smaller than the arrays so that every boundary
# case of the piece loop runs (piece_bytes 24: 3 int64 elements per rank and piece).
@pytest.mark.parametrize("size", SIZES)
@pytest.mark.parametrize("piece_bytes", [24, 1 << 16])
def test_shared_memory_allreduce(size, piece_bytes):
    host = shared_host(size, piece_bytes)
    for length in sorted({0, 1, size - 1, size + 1, 97}):
        def work(segment, length=length):
            buf = data(segment.rank, length)
            SharedMemory(segment).allreduce(buf, ReduceOp.SUM)
            return buf

        expected = np.sum([data(r, length) for r in range(size)], axis=0, dtype=np.int64)
        for got in run_ranks(size, work, lambda rank, _: ThreadSegment(rank, host)):
            np.testing.assert_array_equal(got, expected)


def test_disjoint_tells_arrays_that_share_memory():
    block = np.zeros(10)
    assert disjoint([block[:5], block[5:], np.zeros(3), block[:0]])
    assert not disjoint([block[:6], block[5:]])
    assert not disjoint([block, block])
    assert not disjoint([np.zeros(4), block, block[9:]])


@pytest.mark.parametrize("size", [1, 2, 3])
def test_shared_memory_allreduce_writes_a_concatenation_that_is_also_its_source(size):
    """Fused gradients reduced in place: each result lands in the array it came from, pieces of
    3 elements per rank crossing the arrays' boundaries everywhere, and Average's division runs
    on the way."""
    lengths = [5, 0, 1, 7, 2, 0, 11, 3]
    host = shared_host(size, 24)

    def work(segment):
        parts = [data(segment.rank + 7 * i, n) for i, n in enumerate(lengths)]
        fused = Concatenation(parts)
        SharedMemory(segment).allreduce(fused, ReduceOp.SUM, fused, lambda s: np.floor_divide(s, size, out=s))
        return np.concatenate(parts)

    expected = np.sum([np.concatenate([data(r + 7 * i, n) for i, n in enumerate(lengths)])
                       for r in range(size)], axis=0, dtype=np.int64) // size
    for got in run_ranks(size, work, lambda rank, _: ThreadSegment(rank, host)):
        np.testing.assert_array_equal(got, expected)


@pytest.mark.parametrize("size", [1, 2, 3])
def test_shared_memory_allreduce_reads_a_concatenation_in_place(size):
    """Fused tensors of ragged lengths (empty ones too), read where they lie: pieces of 3 elements
    per rank cross their boundaries everywhere; the result lands in a separate buffer."""
    lengths = [5, 0, 1, 7, 2, 0, 11, 3]
    host = shared_host(size, 24)

    def work(segment):
        parts = [data(segment.rank + 7 * i, n) for i, n in enumerate(lengths)]
        out = np.empty(sum(lengths), np.int64)
        SharedMemory(segment).allreduce(out, ReduceOp.SUM, Concatenation(parts))
        return out

    expected = np.sum([np.concatenate([data(r + 7 * i, n) for i, n in enumerate(lengths)])
                       for r in range(size)], axis=0, dtype=np.int64)
    for got in run_ranks(size, work, lambda rank, _: ThreadSegment(rank, host)):
        np.testing.assert_array_equal(got, expected)


def test_concatenation_spans_are_views_that_cover_the_range_exactly():
    parts = [np.arange(4), np.arange(0), np.arange(10, 13), np.arange(20, 22)]
    joined = Concatenation(parts)
    for start, stop in [(0, 9), (3, 6), (4, 7), (5, 5), (8, 9), (0, 0)]:
        pieces = list(joined.spans(start, stop))
        assert all(any(np.shares_memory(view, part) for part in parts) for _, view in pieces)
        covered = np.concatenate([view for _, view in pieces]) if pieces else np.empty(0, int)
        np.testing.assert_array_equal(covered, np.concatenate(parts)[start:stop])
        assert [offset for offset, _ in pieces] == list(np.cumsum([0] + [len(v) for _, v in pieces])[:-1])


@pytest.mark.parametrize("size", SIZES)
def test_shared_memory_reducescatter_with_uneven_and_empty_segments(size):
    counts = [(3 * r) % 4 for r in range(size)]
    offsets = layout.offsets_of(counts)
    host = shared_host(size, 16)

    def work(segment):
        return SharedMemory(segment).reducescatter(data(segment.rank, offsets[-1]), offsets, ReduceOp.MAX)

    expected = np.max([data(r, offsets[-1]) for r in range(size)], axis=0)
    for rank, got in enumerate(run_ranks(size, work, lambda rank, _: ThreadSegment(rank, host))):
        np.testing.assert_array_equal(got, expected[offsets[rank]:offsets[rank + 1]])


@pytest.mark.parametrize("size", SIZES)
def test_shared_memory_allgather_ragged_and_broadcast_from_every_root(size):
    counts = [r % 3 + 2 * (r == 1) for r in range(size)]
    offsets = layout.offsets_of(counts)
    host = shared_host(size, 8)  # areas of size * 8 bytes: several windows per call

    def work(segment):
        gathered = np.zeros(offsets[-1], np.int64)
        gathered[offsets[segment.rank]:offsets[segment.rank + 1]] = data(segment.rank, counts[segment.rank])
        SharedMemory(segment).allgather(gathered, offsets)
        broadcasts = []
        for root in range(size):
            buf = data(segment.rank, 29, np.float32)
            SharedMemory(segment).broadcast(buf, root)
            broadcasts.append(buf)
        return gathered, broadcasts

    expected = np.concatenate([data(r, counts[r]) for r in range(size)])
    for gathered, broadcasts in run_ranks(size, work, lambda rank, _: ThreadSegment(rank, host)):
        np.testing.assert_array_equal(gathered, expected)
        for root, got in enumerate(broadcasts):
            np.testing.assert_array_equal(got, data(root, 29, np.float32))


@pytest.mark.parametrize("hosts, per_host", [(2, 1), (2, 2), (3, 2), (2, 3)])
def test_hierarchical_allreduce(hosts, per_host):
    """Shared memory inside each host, a ring among the ranks of the same local rank across hosts."""
    size = hosts * per_host
    segments = [shared_host(per_host, 24) for _ in range(hosts)]
    cross_boxes = [{pair: queue.Queue() for pair in itertools.product(range(hosts), repeat=2)}
                   for _ in range(per_host)]

    def place(rank, _):
        host, local = divmod(rank, per_host)
        cross = QueueTransport(host, hosts, cross_boxes[local])
        return rank, ThreadSegment(local, segments[host]), cross

    def work(placed):
        rank, segment, cross = placed
        buf = data(rank, 101)
        SharedMemory(segment, lambda b, op: ring.allreduce(cross, b, np.add, np.empty(len(b), np.int64), 4)
                     ).allreduce(buf, ReduceOp.SUM)
        return buf

    expected = np.sum([data(r, 101) for r in range(size)], axis=0, dtype=np.int64)
    for got in run_ranks(size, work, place):
        np.testing.assert_array_equal(got, expected)


def _topology(size, hosts, local_size, homogeneous=True):
    return Topology(rank=0, size=size, local_rank=0, local_size=local_size, cross_rank=0,
                    cross_size=hosts, hosts=hosts, homogeneous=homogeneous)


@pytest.mark.parametrize("env, topology, expected", [
    ({}, _topology(1, 1, 1), ("ring", "ring", "ring")),
    ({"RINGREDUCE_ALGORITHM": "shm"}, _topology(4, 1, 4), ("shm", "shm", "ring")),
    ({"RINGREDUCE_ALGORITHM": "shm"}, _topology(8, 2, 4), ("hierarchical", "ring", "ring")),
    ({"RINGREDUCE_ALGORITHM": "shm", "RINGREDUCE_HIERARCHICAL": "0"}, _topology(8, 2, 4), ("ring", "ring", "ring")),
    ({"RINGREDUCE_ALGORITHM": "ring"}, _topology(8, 2, 4), ("ring", "ring", "ring")),
    ({"RINGREDUCE_ALGORITHM": "mpi"}, _topology(4, 1, 4), ("mpi", "mpi", "mpi")),
    ({"RINGREDUCE_ALGORITHM": "halving_doubling"}, _topology(5, 1, 5), ("halving_doubling",) * 3),
    ({"RINGREDUCE_ALGORITHM": "tree"}, _topology(6, 2, 3), ("tree",) * 3),
])
def test_a_forced_family_runs_at_every_size(env, topology, expected):
    chosen = plan(Config.from_env(env), topology)
    assert (chosen["allreduce"], chosen["reducescatter"], chosen["alltoall"]) == tuple([(0, e)] for e in expected)


def test_auto_follows_the_cost_model_of_the_default_profile():
    """On one host: MPI's own for the smallest, shared memory for large reductions; across hosts of
    several ranks each: the hierarchical allreduce for large ones, unless switched off."""
    one_host = plan(Config.from_env({}), _topology(4, 1, 4))
    assert one_host["allreduce"][0] == (0, "mpi") and one_host["allreduce"][-1][1] == "shm"
    assert one_host["alltoall"] == [(0, "ring")]
    hosts = plan(Config.from_env({}), _topology(8, 2, 4))
    assert hosts["allreduce"][-1][1] == "hierarchical"
    assert "hierarchical" not in {f for _, f in plan(Config.from_env({"RINGREDUCE_HIERARCHICAL": "0"}),
                                                     _topology(8, 2, 4))["allreduce"]}
    forced = plan(Config.from_env({"RINGREDUCE_HIERARCHICAL": "1"}), _topology(8, 2, 4))["allreduce"]
    assert {f for _, f in forced} <= {"hierarchical", "mpi"} and forced[-1][1] == "hierarchical"
    # On one host there is nothing to be hierarchical about: shared memory, as without the switch.
    assert plan(Config.from_env({"RINGREDUCE_HIERARCHICAL": "1"}), _topology(4, 1, 4)) == one_host
    for table in (one_host, hosts):
        for rows in table.values():
            assert rows[0][0] == 0 and [start for start, _ in rows] == sorted({start for start, _ in rows})


def test_forced_hierarchical_needs_equal_hosts():
    with pytest.raises(RingReduceError, match="same number of ranks on every host"):
        plan(Config.from_env({"RINGREDUCE_HIERARCHICAL": "1"}), _topology(3, 2, 2, homogeneous=False))


def _contract(protocol):
    """{method name: parameter names} of a contract's methods."""
    return {name: list(inspect.signature(member).parameters) for name, member in vars(protocol).items()
            if inspect.isfunction(member) and not name.startswith("_")}


@pytest.mark.parametrize("family, protocol", [
    (RingFamily, HostFamily), (HalvingDoublingFamily, HostFamily), (TreeFamily, HostFamily),
    (SharedMemory, HostFamily), (MPIAlgorithms, HostFamily),
    (Nccl, DeviceFamily), (CudaAwareMpi, DeviceFamily), (Staged, DeviceFamily),
])
def test_every_family_offers_its_contract_with_its_parameters(family, protocol):
    assert _contract(protocol)
    for name, parameters in _contract(protocol).items():
        if (family, name) != (SharedMemory, "alltoallv"):  # the contract's one exception
            assert list(inspect.signature(getattr(family, name)).parameters) == parameters, (family, name)
    if protocol is HostFamily:
        assert all(isinstance(getattr(family, flag), bool) for flag in HOST_FLAGS)


HOST_FLAGS = ("reads_concatenation", "reduces_any_dtype", "adds_in_rank_order")


def test_the_rank_order_family_offers_the_contract_s_reductions():
    """It runs only the reductions (RINGREDUCE_DETERMINISTIC hands it nothing else)."""
    for name in ("allreduce", "reducescatter"):
        assert list(inspect.signature(getattr(RankOrderFamily, name)).parameters) == _contract(HostFamily)[name]
    assert all(isinstance(getattr(RankOrderFamily, flag), bool) for flag in HOST_FLAGS)


class _CallLog:
    """An MPI communicator that records which of its collectives were called (and does nothing)."""

    rank, size = 0, 2

    def __init__(self):
        self.calls = []

    def __getattr__(self, name):
        def call(*args):
            self.calls.append(name)
            return _Done()
        return call


class _Done:
    def Test(self):  # noqa: N802 - mpi4py's name
        return True


_DeviceArray = type("ndarray", (np.ndarray,), {"__module__": "cupy"})  # what the backends take for CuPy's


@pytest.mark.parametrize("on_gpu, expected", [
    (False, ["Iallreduce", "Ireduce_scatter", "Iallgatherv", "Ibcast", "Ialltoallv"]),
    (True, ["Allreduce", "Reduce_scatter", "Allgatherv", "Bcast", "Alltoallv"]),
])
def test_mpi_s_own_collectives_block_on_device_buffers(on_gpu, expected, monkeypatch):
    """Open MPI's nonblocking collectives are not CUDA-aware although it answers the CUDA query with
    yes: device buffers went to Iallreduce and the rest, which read them as host memory."""
    monkeypatch.setattr("ringreduce.algorithms.mpi_native.wait_all", lambda requests, _: None)
    monkeypatch.setattr("ringreduce.algorithms.mpi_native.new_like", lambda buf, shape: np.empty(shape, buf.dtype))
    comm = _CallLog()
    family = MPIAlgorithms(type("Transport", (), {"comm": comm})())
    buf = np.zeros(8, np.float32)
    buf = buf.view(_DeviceArray) if on_gpu else buf
    family.allreduce(buf, ReduceOp.SUM)
    family.reducescatter(buf, [0, 4, 8], ReduceOp.SUM)
    family.allgather(buf, [0, 4, 8])
    family.broadcast(buf, 0)
    family.alltoallv(buf, [0, 4, 8], buf.copy(), [0, 4, 8])
    assert comm.calls == expected
