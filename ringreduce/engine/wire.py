"""The wire protocol of a cycle: what each rank tells the others, and how it travels.

A rank's state is a few flags, how long it waited in the last negotiation, and one bit per
cache slot it has pending. In the steady state of a training loop every rank has the same
cached requests pending and nothing else to say, so one small bitwise-or allreduce carries
everything: each rank's flags and wait in fields of their own, the union of the cache bits and
the union of their complements (whose complement is the intersection). Only when ranks differ
(a name not yet everywhere, an announcement, a join, a shutdown, a stall) do the full rows
follow, in an allgather, for the negotiation to see who has what. Requests that are not in the
cache are announced: their messages, pickled, in one more allgather, only in cycles where some
rank has any.
"""

import functools
import pickle
import struct
import typing

import numpy as np
from mpi4py import MPI

from ringreduce.machine.layout import offsets_of
from ringreduce.machine.transport import PersistentAllreduce, wait_all

ANNOUNCES, JOINED, SHUTTING_DOWN, STALLED, WAITING, DEADLOCKED, GPU_TAKEN = 1, 2, 4, 8, 16, 32, 64
FLAG_BITS = GPU_TAKEN.bit_length()


def _flag(bit, doc):
    """A RankState property: is this flag set?"""
    return property(lambda state: bool(state.flags & bit), doc=doc)


class RankState(typing.NamedTuple):
    """What one rank's row says this cycle (a tuple: one is made per rank and cycle)."""

    flags: int
    slots: tuple  # the cache slots of the requests it has pending
    waited: float = 0.0  # seconds it waited for the others in the previous cycle's negotiation

    @classmethod
    def of(cls, slots, waited, *, announces, joined, shutting_down, stalled, waiting, deadlocked=False,
           gpu_taken=False):
        flags = ((ANNOUNCES if announces else 0) | (JOINED if joined else 0)
                 | (SHUTTING_DOWN if shutting_down else 0) | (STALLED if stalled else 0)
                 | (WAITING if waiting else 0) | (DEADLOCKED if deadlocked else 0) | (GPU_TAKEN if gpu_taken else 0))
        return cls(flags, tuple(slots), waited)

    announces = _flag(ANNOUNCES, "It announces new messages this cycle.")
    joined = _flag(JOINED, "It has called join().")
    shutting_down = _flag(SHUTTING_DOWN, "It is shutting down.")
    stalled = _flag(STALLED, "Its stall shutdown time has passed.")
    waiting = _flag(WAITING, "It has requests (or a join or shutdown) in flight.")
    deadlocked = _flag(DEADLOCKED, "Its caller is blocked in a wait, and by its clock nothing new has been "
                                   "submitted anywhere for the deadlock time.")
    gpu_taken = _flag(GPU_TAKEN, "It has device work, and another process set's cycle holds its GPU (gpu_turn.py).")

    @property
    def only_slots(self):
        """Nothing to say but its cache bits: no announcement, join, shutdown, stall or taken GPU."""
        return self.flags & ~WAITING == 0


class Wire:
    """The exchanges of one cycle on the engine's communicator. Every rank makes the same calls
    in the same order."""

    def __init__(self, comm, cache_capacity):
        self.comm = comm
        self.rank, self.size = comm.rank, comm.size
        self._slot_bytes = (cache_capacity + 7) // 8
        # Full row: flags, microseconds waited (uint32), cache bits.
        self._row = np.zeros(5 + self._slot_bytes, dtype=np.uint8)
        self._rows = np.zeros((self.size, len(self._row)), dtype=np.uint8)
        # Summary, built from Python ints (faster than numpy at these sizes): one bit per rank
        # for each flag, each rank's wait, the cache bits, their complements.
        self._flag_bytes = (FLAG_BITS * self.size + 7) // 8
        self._all_slots = (1 << (8 * self._slot_bytes)) - 1
        self._other_flags = sum(((1 << self.size) - 1) << (bit * self.size)
                                for bit in range(FLAG_BITS) if 1 << bit != WAITING)
        self._summary = bytearray(self._flag_bytes + 4 * self.size + 2 * self._slot_bytes)
        self._reduced = bytearray(len(self._summary))
        self._allreduce_summary = PersistentAllreduce(
            comm, [self._summary, MPI.BYTE], [self._reduced, MPI.BYTE], MPI.BOR)
        self._slots_at = self._flag_bytes + 4 * self.size
        self._waits = struct.Struct(f"<{self.size}I")
        self._my_wait = struct.Struct(f"<{4 * self.rank}xI{4 * (self.size - self.rank - 1)}x")
        # A loop repeats the same few flag words and slot sets: each is worked out once.
        self._spread_flags = functools.lru_cache(maxsize=64)(self._spread_flags)
        self._rank_flags = functools.lru_cache(maxsize=256)(self._rank_flags)
        self._slot_words = functools.lru_cache(maxsize=256)(self._slot_words)
        self.gathers = 0  # cycles that needed the full rows

    def states(self, mine):
        """Every rank's RankState, this rank's being `mine`."""
        flags, slots = mine.flags, mine.slots
        micros = min(int(mine.waited * 1e6), 2**32 - 1)
        slot_words, in_order = self._slot_words(tuple(slots))
        self._summary[:] = self._spread_flags(flags) + self._my_wait.pack(micros) + slot_words
        self._allreduce_summary()
        reduced = self._reduced
        flag_word = int.from_bytes(reduced[:self._flag_bytes], "little")
        # The union of every rank's bits and the union of their complements are this rank's own
        # exactly when every rank has the same slots pending.
        if flag_word & self._other_flags or reduced[self._slots_at:] != slot_words:
            return self._gather_rows(flags, micros, slots)
        waited = self._waits.unpack_from(reduced, self._flag_bytes)
        return [RankState(f, in_order, w / 1e6) for f, w in zip(self._rank_flags(flag_word), waited, strict=True)]

    def announcements(self, messages):
        """Every rank's newly announced messages (call it only in cycles where some rank has any)."""
        payload = np.frombuffer(pickle.dumps(messages), dtype=np.uint8)
        lengths = np.empty(self.size, dtype=np.int64)
        wait_all([self.comm.Iallgather(np.array([len(payload)], dtype=np.int64), lengths)])
        offsets = offsets_of(lengths)
        gathered = np.empty(offsets[-1], dtype=np.uint8)
        spec = [gathered, np.diff(offsets).tolist(), offsets[:-1], MPI.BYTE]
        wait_all([self.comm.Iallgatherv([payload, MPI.BYTE], spec)])
        return [pickle.loads(gathered[offsets[r]:offsets[r + 1]].tobytes()) for r in range(self.size)]

    def close(self):
        self._allreduce_summary.free()

    def _slot_words(self, slots):
        """The summary's cache words for these slots (their bits, then the complement), and the
        slots in the order every rank lists them (lowest first)."""
        bits = 0
        for slot in slots:
            bits |= 1 << slot
        words = bits.to_bytes(self._slot_bytes, "little") + (self._all_slots ^ bits).to_bytes(
            self._slot_bytes, "little")
        return words, tuple(sorted(slots))

    def _spread_flags(self, flags):
        """This rank's flags as the summary carries them: bit b of rank r at b * size + r."""
        word = 0
        for bit in range(FLAG_BITS):
            if flags & (1 << bit):
                word |= 1 << (bit * self.size + self.rank)
        return word.to_bytes(self._flag_bytes, "little")

    def _rank_flags(self, flag_word):
        """Every rank's flags, back out of the summary's flag word."""
        return [sum(((flag_word >> (bit * self.size + r)) & 1) << bit for bit in range(FLAG_BITS))
                for r in range(self.size)]

    def _gather_rows(self, flags, micros, slots):
        self.gathers += 1
        row = self._row
        row[:] = 0
        row[0] = flags
        row[1:5].view(np.uint32)[0] = micros
        for slot in slots:
            row[5 + slot // 8] |= 0x80 >> (slot % 8)
        wait_all([self.comm.Iallgather(row, self._rows)])
        rows = self._rows
        ranks, found = np.nonzero(np.unpackbits(rows[:, 5:], axis=1))
        per_rank = [[] for _ in range(self.size)]
        for rank, slot in zip(ranks.tolist(), found.tolist(), strict=True):
            per_rank[rank].append(slot)
        waits = rows[:, 1:5].copy().view(np.uint32)[:, 0].tolist()
        return [RankState(f, tuple(s), w / 1e6) for f, s, w in zip(rows[:, 0].tolist(), per_rank, waits, strict=True)]

