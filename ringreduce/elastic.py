"""Elastic training, under Horovod's names: a training function decorated with `run` takes a
State; it calls `state.commit()` now and then (every few steps, at each epoch's end). When rrun
tells the ranks of new or lost hosts, the next commit raises HostsUpdatedInterrupt on every rank;
when a rank or host fails, rrun ends the generation. Either way rrun starts the next generation
on the hosts usable then, and `run` resumes it from the newest commit (ringreduce.resilience.commit_store keeps
them on every host), then calls the state's reset callbacks.

Unlike Horovod on Gloo, the processes start anew at each resize (MPI cannot shrink a running job
here: docs/elastic.md), so everything the function needs must be in the state or rebuilt by the
script: process sets, load balancers and compression residuals are rebuilt from scratch.

    @rr.elastic.run
    def train(state):
        for epoch in range(state.epoch, epochs):
            state.epoch = epoch
            ...
            state.commit()

    train(rr.elastic.TorchState(model, optimizer, epoch=0))
"""

import copy
import functools
import os
import pickle
import sys
import typing
from collections.abc import Callable, Iterable

import numpy as np

from ringreduce import collectives, runtime
from ringreduce.errors import HostsUpdatedInterrupt
from ringreduce.launcher import protocol
from ringreduce.objects import broadcast_object
from ringreduce.ops import Max
from ringreduce.resilience import commit_store, rrun_link

T = typing.TypeVar("T")


class State:
    """What a training function keeps across failures and resizes. Subclasses say what the state is
    (`_state()`, a picklable object the same on every rank) and how to load it (`_load`)."""

    def __init__(self) -> None:
        self._reset_callbacks: list[Callable[[], object]] = []
        self._saved: bytes | None = None  # the last save(), pickled
        self._key: tuple[int, int] | None = None  # the last commit's (generation, sequence)
        self._store = commit_store.CommitStore()

    def _state(self):
        raise NotImplementedError

    def _load(self, state):
        raise NotImplementedError

    def _pickle(self, state):
        """The state as bytes (subclasses pickle their framework's tensors faster)."""
        return pickle.dumps(state, protocol=pickle.HIGHEST_PROTOCOL)

    def register_reset_callbacks(self, callbacks: Iterable[Callable[[], object]]) -> None:
        """Functions called (without arguments) after the job was resized or restarted and the state
        restored, e.g. to scale the learning rate with the new size()."""
        self._reset_callbacks.extend(callbacks)

    def on_reset(self) -> None:
        for callback in self._reset_callbacks:
            callback()

    def save(self) -> None:
        """Keep the state in this process's memory (what restore() goes back to)."""
        self._saved = self._pickle(self._state())

    def restore(self) -> None:
        """Go back to the last save() or commit."""
        if self._saved is not None:
            self._load(pickle.loads(self._saved))

    def sync(self) -> None:
        """Make every rank's state rank 0's (where no commit exists yet), and save it: restore()
        goes back to it, as Horovod's."""
        self._load(broadcast_object(self._state(), root_rank=0, name="elastic.sync"))
        self.save()

    def commit(self) -> None:
        """Save the state, keep it on every host, and then check for host updates: raises
        HostsUpdatedInterrupt on every rank when rrun reported new or lost hosts, after the commit
        is kept, so the next generation resumes from it. Collective: call it on every rank at the
        same step."""
        self.save()
        sequence = 1 if self._key is None else self._key[1] + 1
        key = (commit_store.generation(), sequence)
        problem = self._store.write(key, self._saved)
        link = rrun_link.current()
        updated = self._store.confirm(key, problem, flag=link is not None and link.hosts_updated.is_set())
        self._key = key
        if link is not None and runtime.active().topology.rank == 0:  # its failures so far were not its hosts'
            link.send("committed")
        if updated:
            raise HostsUpdatedInterrupt(skip_sync=False)

    def check_host_updates(self) -> None:
        """Raise HostsUpdatedInterrupt on every rank if rrun reported new or lost hosts (collective).
        commit() does this itself; without a commit since, a resize loses the steps since the last."""
        link = rrun_link.current()
        flag = np.array([link is not None and link.hosts_updated.is_set()], dtype=np.uint8)
        if collectives.allreduce(flag, op=Max, name="elastic.hosts")[0]:
            raise HostsUpdatedInterrupt(skip_sync=False)

    def _resume(self):
        """Collective, at the start of a generation: load the newest commit, or make every rank's
        state rank 0's where there is none. Returns the commit's key (None: none)."""
        key, state = self._store.newest()
        if key is None:
            self.sync()
        else:
            self._load(state)
            self._key = key
        self.save()
        return key


class ObjectState(State):
    """Plain Python values as attributes (`state.epoch`, `state.batch`), kept by copy."""

    def __init__(self, **kwargs) -> None:
        self._names = tuple(kwargs)
        self.__dict__.update(kwargs)
        super().__init__()

    def _state(self):
        return {name: copy.deepcopy(getattr(self, name)) for name in self._names}

    def _load(self, state):
        self.__dict__.update(state)


def run(func: Callable[..., T]) -> Callable[..., T]:
    """Decorate the training function `func(state, ...)`: it starts from the newest commit (or rank
    0's state), and on HostsUpdatedInterrupt the process leaves for rrun to start the next
    generation on the new hosts. When `func` returns, the job's commits are removed from the hosts
    (unless they are in a directory given with --commit-dir)."""

    @functools.wraps(func)
    def wrapper(state, *args, **kwargs):
        link = rrun_link.current()
        in_place = os.environ.get(protocol.IN_PLACE_VARIABLE) == "1"
        reset, shrunk = commit_store.generation() > 0, False
        while True:
            key = state._resume()
            if link is not None:
                link.send("resumed", commit=None if key is None else key[1], size=runtime.size(), in_place=shrunk)
            if reset:
                state.on_reset()
            try:
                result = func(state, *args, **kwargs)
            except HostsUpdatedInterrupt:
                if link is None:
                    raise  # not under rrun: nobody would start the next generation
                link.send("resizing")
                link.flush()
                runtime.shutdown()
                if shrunk:  # MPI's finalize would wait on the communicators the dead rank was in
                    sys.stdout.flush()
                    sys.stderr.flush()
                    os._exit(0)
                sys.exit(0)
            except Exception as error:
                if not (in_place and runtime.peer_failed(error)):
                    raise
                runtime.shrink()  # the survivors go on in their processes, from the last commit
                link.rejoin(runtime.rank())
                reset = shrunk = True
                continue
            if link is not None:
                link.send("done")
            state._store.discard()
            return result

    return wrapper
