"""ringreduce as a torch.distributed backend: under rrun, `dist.init_process_group("ringreduce")`
runs torch.distributed's calls, and what is built on them (DDP, the object collectives), on
ringreduce's engine and algorithms, with its checks: a call whose shapes, dtypes or ops differ
across ranks is a MismatchError on every rank that names them, where gloo returns on one rank and
fails or hangs on the other.

Each call is submitted to the engine at once, in the caller's order, under a name every rank gives
it alike (`torch.distributed.0.allreduce.7`: this group's eighth allreduce, counted modulo
_CallNames.SLOTS, so that a loop's calls come back to names the response cache knows), so that
async calls overlap as they do on gloo; a thread of the group completes each call's future when the engine has run
it. What it does not serve (the bitwise ops) raises NotImplementedError naming the call.
Every wait honours the group's timeout (init_process_group's `timeout=`), failing with torch's
DistBackendError as its own backends do.
"""

import concurrent.futures
import datetime
import functools
import queue
import threading
from collections.abc import Callable, Sequence
from typing import Any, NamedTuple

import ringreduce as core
import torch
import torch.distributed as dist
from ringreduce import runtime
from ringreduce.process_sets import ProcessSet, global_process_set, process_set_among
from ringreduce.torch import point_to_point, tensors
from torch.futures import Future

BACKEND = "ringreduce"

_OPS = {
    dist.ReduceOp.SUM: core.Sum, dist.ReduceOp.AVG: core.Average, dist.ReduceOp.MIN: core.Min,
    dist.ReduceOp.MAX: core.Max, dist.ReduceOp.PRODUCT: core.Product,
}


class _Reduction(NamedTuple):
    """A torch reduction as ringreduce's op and the factor each rank's tensor is first scaled by."""
    op: core.ReduceOp
    prescale_factor: float = 1.0


def _reduction(options: Any, call: str) -> _Reduction:
    """NCCL's PREMUL_SUM (`dist._make_nccl_premul_sum(factor)`, a number or a one-element tensor)
    is a sum of every rank's tensor times the factor: ringreduce's prescaled sum."""
    reduce_op = options.reduceOp
    if reduce_op.op == dist.ReduceOp.PREMUL_SUM:
        return _Reduction(core.Sum, float(reduce_op.factor))
    if reduce_op.op not in _OPS:
        raise NotImplementedError(f"{call} with {reduce_op.op.name} on the ringreduce backend: it serves SUM, AVG, "
                                  "MIN, MAX, PRODUCT and PREMUL_SUM")
    return _Reduction(_OPS[reduce_op.op])


class _Work(dist._Work):
    """A call's completion: wait() raises ringreduce's own error (a MismatchError names the ranks),
    and get_future() gives the future DDP chains on, failed with that error."""

    def __init__(self) -> None:
        super().__init__()
        self._finished = threading.Event()
        self._result: object = None
        self._error: BaseException | None = None
        self._source: Future = Future()
        self._future = self._source.then(self._outcome)

    def finish(self, result: object = None, error: BaseException | None = None,
               fire: Callable[[Callable[[], None]], object] = lambda run: run()) -> "_Work":
        """Record the outcome (wait() returns at once) and `fire` the future's callbacks."""
        self._result, self._error = result, error
        self._finished.set()
        fire(lambda: self._source.set_result(None))
        return self

    def _outcome(self, _: Future) -> object:
        if self._error is not None:
            raise self._error
        return self._result

    def wait(self, timeout: datetime.timedelta | float | None = None) -> bool:
        seconds = timeout.total_seconds() if isinstance(timeout, datetime.timedelta) else timeout
        if not self._finished.wait(seconds or None):
            raise TimeoutError(f"a ringreduce collective did not finish within {seconds} s")
        if self._error is not None:
            raise self._error
        return True

    def is_completed(self) -> bool:
        return self._finished.is_set()

    def finished(self, seconds: float) -> bool:
        """Has it finished within `seconds` (raising nothing)?"""
        return self._finished.wait(seconds)

    def is_success(self) -> bool:
        return self._finished.is_set() and self._error is None

    def exception(self) -> BaseException | None:
        return self._error

    def result(self) -> Any:
        return self._result

    def get_future(self) -> Future:
        return self._future

    def _source_rank(self) -> int:  # torch's name: dist.recv(src=None) asks it who sent
        if not isinstance(self._result, _Sender):
            raise RuntimeError("sourceRank() may only be called on work objects that correspond to a recv or "
                               "recv-from-any call.")
        return self._result.group_rank


class _Sender(NamedTuple):
    """What a receive from any rank finishes with: the sender's rank in the group."""
    group_rank: int


# Where futures' callbacks run: DDP's hooks chain calls in them and may wait for those (PowerSGD's
# does), so they must not run on the thread that completes the calls, nor all on one thread.
_CALLBACKS = concurrent.futures.ThreadPoolExecutor(max_workers=8, thread_name_prefix="ringreduce-future")


class _Completions:
    """The group's thread that waits for each submitted call, in the order they were submitted
    (the order every rank runs them in), and finishes its work with the result or the error."""

    def __init__(self) -> None:
        self._pending: queue.SimpleQueue = queue.SimpleQueue()
        threading.Thread(target=self._run, name="ringreduce-process-group", daemon=True).start()

    def work(self, wait: Callable[[], object]) -> _Work:
        work = _Work()
        self._pending.put((wait, work))
        return work

    def _run(self) -> None:
        while True:
            wait, work = self._pending.get()
            try:
                result = wait()
            except BaseException as error:  # noqa: BLE001 - the caller's wait() raises it
                work.finish(error=error, fire=_CALLBACKS.submit)
            else:
                work.finish(result, fire=_CALLBACKS.submit)


class _CallNames:
    """The names of a group's calls: `<group>.<kind>.<n mod SLOTS>` for its n-th call of that kind.
    Every rank counts its calls in program order, so the names agree; and they come back, so the
    response cache knows a training loop's calls (each then travels as one bit) wherever the loop
    makes a number of calls of a kind that divides SLOTS (DDP: one call per bucket). A name still
    held by an unfinished call is waited for first: the engine takes one request of a name at a time."""

    SLOTS = 24

    def __init__(self, prefix: str, timeout: float) -> None:
        self._prefix, self._timeout = prefix, timeout
        self._counts: dict[str, int] = {}
        self._holders: dict[str, _Work] = {}
        self._lock = threading.Lock()
        self._taken = threading.local()  # the names this thread took for the call it is making

    def take(self, kind: str) -> str:
        with self._lock:
            number = self._counts.get(kind, 0)
            self._counts[kind] = number + 1
            name = f"{self._prefix}.{kind}.{number % self.SLOTS}"
            holder = self._holders.get(name)
        if holder is not None and not holder.finished(self._timeout):
            raise dist.DistBackendError(f"ringreduce: rank {core.rank()}: {name} is still held by the call made "
                                        f"{self.SLOTS} calls before it, unfinished after the group's timeout")
        self._taken_here().append(name)
        return name

    def hold(self, work: "_Work") -> None:
        """`work` holds the names this thread took for its call, until it finishes."""
        taken = self._taken_here()
        with self._lock:
            self._holders.update(dict.fromkeys(taken, work))
        taken.clear()

    def _taken_here(self) -> list[str]:
        if not hasattr(self._taken, "names"):
            self._taken.names = []
        return self._taken.names


class RingreduceProcessGroup(dist.ProcessGroup):
    """The job's ranks as a torch.distributed process group on ringreduce's collectives."""

    def __init__(self, rank: int, size: int, timeout: datetime.timedelta, process_set: ProcessSet,
                 group_id: str) -> None:
        super().__init__(rank, size)
        self.timeout, self.process_set = timeout, process_set
        self._seconds = timeout.total_seconds()
        self._names = _CallNames(f"torch.distributed.{group_id}", self._seconds)
        self._torch_name = self._torch_description = group_id
        self._global_ranks = process_set.ranks or []
        self._completions = _Completions()

    def getBackendName(self) -> str:  # noqa: N802 - torch's name
        return BACKEND

    # torch names each group after making it and reads the name back (DeviceMesh does): a Python
    # group keeps them itself.
    def setGroupName(self, name: str) -> None:  # noqa: N802 - torch's name
        self._torch_name = name

    def getGroupName(self) -> str:  # noqa: N802 - torch's name
        return self._torch_name

    def setGroupDesc(self, description: str) -> None:  # noqa: N802 - torch's name
        self._torch_description = description

    def getGroupDesc(self) -> str:  # noqa: N802 - torch's name
        return self._torch_description

    def _name(self, kind: str) -> str:
        return self._names.take(kind)

    def _global(self, group_rank: int) -> int:
        """torch names ranks within the group; ringreduce by their rank in the job."""
        return self._global_ranks[group_rank]

    def _work(self, wait: Callable[[], object], opts: Any) -> dist.Work:
        """The call's work: waited for here when the caller waits at once (c10d's sync calls say
        so, `asyncOp` False), else by the group's completion thread. `wait` passes the group's
        timeout on to what it waits for."""
        def within_timeout() -> object:
            try:
                return wait()
            except TimeoutError as error:
                ranks = self._global_ranks or list(range(core.size()))
                timed_out = dist.DistBackendError(
                    f"ringreduce: rank {core.rank()}: {error}, the timeout of this process group "
                    f"(init_process_group or new_group's timeout=): a rank of {ranks} has not made the same call")
                runtime.end_job_at_exit(str(timed_out))  # the group is broken, as on torch's backends
                raise timed_out from None

        if opts is None or getattr(opts, "asyncOp", True):
            work = self._completions.work(within_timeout)
        else:
            try:
                work = _Work().finish(within_timeout())
            except BaseException as error:  # noqa: BLE001 - the caller's wait() raises it
                work = _Work().finish(error=error)
        self._names.hold(work)
        return work

    def _submit(self, handle: Any, opts: Any, after: Callable[[Any], object] = lambda result: result) -> dist.Work:
        return self._work(lambda: after(handle.wait(self._seconds)), opts)

    def allreduce(self, tensor_list: list[torch.Tensor], opts: Any = None) -> dist.Work:
        reduction = _reduction(opts or dist.AllreduceOptions(), "all_reduce")
        if any(t.is_sparse for t in tensor_list):
            return self._sparse_allreduce(tensor_list, reduction, opts)
        handle = tensors.grouped_allreduce_async_(tensor_list, name=self._name("allreduce"), op=reduction.op,
                                                  prescale_factor=reduction.prescale_factor,
                                                  process_set=self.process_set)
        return self._submit(handle, opts, lambda _: tensor_list)

    def _sparse_allreduce(self, tensor_list: list[torch.Tensor], reduction: _Reduction, opts: Any) -> dist.Work:
        """As gloo: each sparse tensor becomes the coalesced sum of every rank's (SUM only)."""
        if reduction != _Reduction(core.Sum) or not all(t.is_sparse for t in tensor_list):
            raise ValueError("all_reduce of sparse tensors: every tensor sparse, and the op SUM (as gloo)")
        handles = [tensors.SparseAllreduce(t, self._name("sparse_allreduce"), core.Sum, self.process_set, t.copy_)
                   for t in tensor_list]
        return self._work(lambda: [h.wait(self._seconds) for h in handles], opts)

    def allreduce_coalesced(self, tensor_list: list[torch.Tensor], opts: Any = None) -> dist.Work:
        return self.allreduce(tensor_list, opts or dist.AllreduceCoalescedOptions())

    def broadcast(self, tensor_list: list[torch.Tensor], opts: Any = None) -> dist.Work:
        root = (opts or dist.BroadcastOptions()).rootRank
        handles = [tensors.broadcast_async_(t, self._global(root), name=self._name("broadcast"),
                                            process_set=self.process_set) for t in tensor_list]
        return self._work(lambda: [h.wait(self._seconds) for h in handles], opts)

    def allgather(self, output_lists: list[list[torch.Tensor]], input_list: list[torch.Tensor],
                  opts: Any = None) -> dist.Work:
        for outputs, tensor in zip(output_lists, input_list, strict=True):
            _same_shapes(outputs, tensor, self.size(), "all_gather")
        handle = tensors.grouped_allgather_async(input_list, name=self._name("allgather"), process_set=self.process_set)

        def scatter_into(gathered: list[torch.Tensor]) -> list[list[torch.Tensor]]:
            for outputs, whole in zip(output_lists, gathered, strict=True):
                for output, part in zip(outputs, whole.chunk(self.size()), strict=True):
                    output.copy_(part.view_as(output))
            return output_lists
        return self._submit(handle, opts, scatter_into)

    def allgather_coalesced(self, output_lists: list[list[torch.Tensor]], input_list: list[torch.Tensor],
                            opts: Any = None) -> dist.Work:
        """all_gather_coalesced's outputs are per rank (output_lists[rank][i]), allgather's per input."""
        if len(output_lists) != self.size() or any(len(outputs) != len(input_list) for outputs in output_lists):
            raise ValueError(f"all_gather_coalesced: the output must hold {self.size()} lists (one per rank) of "
                             f"{len(input_list)} tensors, got {[len(outputs) for outputs in output_lists]}")
        per_input = [list(outputs) for outputs in zip(*output_lists, strict=True)]
        return self.allgather(per_input, input_list, opts)

    def all_gather_single(self, output: torch.Tensor, input: torch.Tensor, opts: Any = None) -> dist.Work:
        if output.numel() != input.numel() * self.size():
            raise ValueError(f"all_gather_into_tensor: the output holds {output.numel()} elements, not "
                             f"{self.size()} x the input's {input.numel()}")
        handle = tensors.allgather_async(input.reshape(1, -1), name=self._name("allgather"),
                                         process_set=self.process_set)
        return self._submit(handle, opts, lambda gathered: output.copy_(gathered.view_as(output)))

    def all_gather_single_coalesced(self, outputs: list[torch.Tensor], inputs: list[torch.Tensor],
                                        opts: Any = None) -> dist.Work:
        works = [self.all_gather_single(o, i) for o, i in zip(outputs, inputs, strict=True)]
        return self._work(lambda: [w.wait(self.timeout) for w in works], opts)

    def reduce_scatter_single(self, output: torch.Tensor, input: torch.Tensor, opts: Any = None) -> dist.Work:
        reduction = _reduction(opts or dist.ReduceScatterOptions(), "reduce_scatter_tensor")
        if input.numel() != output.numel() * self.size():
            raise ValueError(f"reduce_scatter_tensor: the input holds {input.numel()} elements, not "
                             f"{self.size()} x the output's {output.numel()}")
        handle = tensors.reducescatter_async(input.reshape(self.size(), -1), name=self._name("reducescatter"),
                                             op=reduction.op, prescale_factor=reduction.prescale_factor,
                                             process_set=self.process_set)
        return self._submit(handle, opts, lambda part: output.copy_(part.view_as(output)))

    def reduce_scatter_single_coalesced(self, outputs: list[torch.Tensor], inputs: list[torch.Tensor],
                                        opts: Any = None) -> dist.Work:
        works = [self.reduce_scatter_single(o, i, opts) for o, i in zip(outputs, inputs, strict=True)]
        return self._work(lambda: [w.wait(self.timeout) for w in works], opts)

    def reduce_scatter(self, output_list: list[torch.Tensor], input_lists: list[list[torch.Tensor]],
                       opts: Any = None) -> dist.Work:
        works = [self.reduce_scatter_single(output, torch.stack([t.reshape(output.shape) for t in inputs]), opts)
                 for output, inputs in zip(output_list, input_lists, strict=True)]
        return self._work(lambda: [w.wait(self.timeout) for w in works], opts)

    def all_to_all_single(self, output: torch.Tensor, input: torch.Tensor, output_split_sizes: list[int],
                      input_split_sizes: list[int], opts: Any = None) -> dist.Work:
        splits = input_split_sizes or [input.shape[0] // self.size()] * self.size()
        handle = tensors.alltoall_pair_async(input, splits, self._name("alltoall"), self.process_set, pair=False)
        return self._submit(handle, opts, lambda received: output.copy_(received.view_as(output)))

    def alltoall(self, output_list: list[torch.Tensor], input_list: list[torch.Tensor],
                 opts: Any = None) -> dist.Work:
        flat = torch.cat([t.reshape(-1) for t in input_list])
        handle = tensors.alltoall_pair_async(flat, [t.numel() for t in input_list], self._name("alltoall"),
                                             self.process_set, pair=False)

        def split_into(received: torch.Tensor) -> list[torch.Tensor]:
            for output, part in zip(output_list, received.split([t.numel() for t in output_list]), strict=True):
                output.copy_(part.view_as(output))
            return output_list
        return self._submit(handle, opts, split_into)

    def reduce(self, tensor_list: list[torch.Tensor], opts: Any = None) -> dist.Work:
        options = opts or dist.ReduceOptions()
        reduction, root = _reduction(options, "reduce"), options.rootRank
        copies = [t.clone() for t in tensor_list]
        handle = tensors.grouped_allreduce_async_(copies, name=self._name("reduce"), op=reduction.op,
                                                  prescale_factor=reduction.prescale_factor,
                                                  process_set=self.process_set)

        def keep_on_root(_: object) -> list[torch.Tensor]:
            if self.rank() == root:
                for tensor, reduced in zip(tensor_list, copies, strict=True):
                    tensor.copy_(reduced)
            return tensor_list
        return self._submit(handle, opts, keep_on_root)

    def gather(self, output_lists: list[list[torch.Tensor]], input_list: list[torch.Tensor],
               opts: Any = None) -> dist.Work:
        root = (opts or dist.GatherOptions()).rootRank
        handle = tensors.grouped_allgather_async([t.reshape(1, *t.shape) for t in input_list],
                                                 name=self._name("gather"), process_set=self.process_set)

        def keep_on_root(gathered: list[torch.Tensor]) -> list[list[torch.Tensor]]:
            if self.rank() == root:
                for outputs, whole in zip(output_lists, gathered, strict=True):
                    for output, part in zip(outputs, whole, strict=True):
                        output.copy_(part)
            return output_lists
        return self._submit(handle, opts, keep_on_root)

    def scatter(self, output_list: list[torch.Tensor], input_lists: list[list[torch.Tensor]],
                opts: Any = None) -> dist.Work:
        root = (opts or dist.ScatterOptions()).rootRank
        works = []
        for index, output in enumerate(output_list):
            whole = (torch.stack([t.reshape(output.shape) for t in input_lists[index]]) if self.rank() == root
                     else output.new_empty((self.size(), *output.shape)))
            handle = tensors.broadcast_async_(whole, self._global(root), name=self._name("scatter"),
                                              process_set=self.process_set)
            works.append(self._submit(handle, opts, functools.partial(self._take_mine, output)))
        return self._work(lambda: [w.wait(self.timeout) for w in works], opts)

    def _take_mine(self, output: torch.Tensor, whole: torch.Tensor) -> torch.Tensor:
        """This rank's row of a broadcast scatter, into `output`."""
        return output.copy_(whole[self.rank()])

    def barrier(self, opts: Any = None) -> dist.Work:
        """An allreduce of one element, as gloo's barrier: it keeps the group's order and timeout."""
        handle = tensors.allreduce_async(torch.zeros(1), name=self._name("barrier"), op=core.Sum,
                                         process_set=self.process_set)
        return self._submit(handle, opts)

    def send(self, tensor_list: list[torch.Tensor], dst: int, tag: int = 0) -> dist.Work:
        works = [point_to_point.isend(t, self._global(dst), self.process_set, tag) for t in tensor_list]
        return self._work(lambda: [w.wait(self._seconds) for w in works], None)

    def recv(self, tensor_list: list[torch.Tensor], src: int, tag: int = 0) -> dist.Work:
        works = [point_to_point.irecv(t, self._global(src), self.process_set, tag) for t in tensor_list]
        return self._work(lambda: [w.wait(self._seconds) for w in works], None)

    def recv_anysource(self, tensor_list: list[torch.Tensor], tag: int = 0) -> dist.Work:
        works = [point_to_point.irecv(t, None, self.process_set, tag) for t in tensor_list]

        def sender() -> _Sender:
            senders = [w.wait(self._seconds) for w in works]
            return _Sender(self._global_ranks.index(senders[0]) if self._global_ranks else senders[0])
        return self._work(sender, None)


def _same_shapes(outputs: Sequence[torch.Tensor], tensor: torch.Tensor, size: int, call: str) -> None:
    if len(outputs) != size or any(o.shape != tensor.shape for o in outputs):
        raise ValueError(f"{call}: the output list must hold {size} tensors of the input's shape "
                         f"{tuple(tensor.shape)}, got {[tuple(o.shape) for o in outputs]}")


def _create(options: Any, _backend_options: Any) -> RingreduceProcessGroup:
    """The backend's constructor, called by init_process_group and new_group on the group's ranks
    (only those: a subgroup's set is made by its members alone)."""
    if not core.is_initialized():
        core.init()
    ranks = list(options.global_ranks_in_group) or list(range(options.group_size))
    if ranks == list(range(core.size())):
        if options.group_size != core.size() or options.group_rank != core.rank():
            raise RuntimeError(f"init_process_group('ringreduce') saw rank {options.group_rank} of "
                               f"{options.group_size}, but rrun started rank {core.rank()} of {core.size()}: start the "
                               "job with rrun, whose RANK and WORLD_SIZE are the ranks' own")
        process_set = global_process_set
    else:
        process_set = process_set_among(ranks, f"torch.{options.group_id}")
    return RingreduceProcessGroup(options.group_rank, options.group_size, options.timeout, process_set,
                                  str(options.group_id))


def register() -> None:
    """Make "ringreduce" a torch.distributed backend for CPU tensors (once)."""
    if BACKEND.upper() not in dist.Backend._plugins:
        dist.Backend.register_backend(BACKEND, _create, extended_api=True, devices=["cpu"])
