"""What each rank tells the others at the start of every cycle, and how it travels.

A rank's state is a few flags, how long it waited in the last negotiation, and one bit per
cache slot it has pending. In the steady state of a training loop every rank has the same
cached requests pending and nothing else to say, so one small bitwise-or allreduce carries
everything: each rank's flags and wait in fields of their own, the union of the cache bits and
the union of their complements (whose complement is the intersection). Only when ranks differ
(a name not yet everywhere, an announcement, a join, a shutdown, a stall) do the full rows
follow, in an allgather, for the negotiation to see who has what.
"""

import numpy as np
from mpi4py import MPI

from ringreduce.negotiation import WAITING, RankState
from ringreduce.transports import wait_all

FLAG_BITS = WAITING.bit_length()  # negotiation's flags are the bits below and including WAITING


class StateExchange:
    def __init__(self, comm, cache_capacity):
        self.comm = comm
        self.rank, self.size = comm.rank, comm.size
        slot_bytes = (cache_capacity + 7) // 8
        rank_bytes = (self.size + 7) // 8
        # Full row: flags, microseconds waited (uint32), cache bits.
        self._row = np.zeros(5 + slot_bytes, dtype=np.uint8)
        self._rows = np.zeros((self.size, len(self._row)), dtype=np.uint8)
        # Summary: one bit per rank for each flag, each rank's wait, cache bits, their complements.
        self._flags_end = FLAG_BITS * rank_bytes
        self._waits_end = self._flags_end + 4 * self.size
        self._summary = np.zeros(self._waits_end + 2 * slot_bytes, dtype=np.uint8)
        self._reduced = np.zeros_like(self._summary)
        self.gathers = 0  # cycles that needed the full rows

    def exchange(self, flags, waited_seconds, slots):
        """Every rank's RankState, this rank's given by `flags`, `waited_seconds` and cache `slots`."""
        micros = min(int(waited_seconds * 1e6), 2**32 - 1)
        bits = np.zeros(len(self._row) - 5, dtype=np.uint8)
        for slot in slots:
            bits[slot // 8] |= 0x80 >> (slot % 8)
        summary = self._summary
        summary[:] = 0
        flag_fields = summary[:self._flags_end].reshape(FLAG_BITS, -1)
        for bit in range(FLAG_BITS):
            if flags & (1 << bit):
                flag_fields[bit, self.rank // 8] |= 0x80 >> (self.rank % 8)
        summary[self._flags_end:self._waits_end].view(np.uint32)[self.rank] = micros
        summary[self._waits_end:self._waits_end + len(bits)] = bits
        summary[self._waits_end + len(bits):] = ~bits
        wait_all([self.comm.Iallreduce(summary, self._reduced, op=MPI.BOR)])
        reduced = self._reduced
        per_flag = np.unpackbits(reduced[:self._flags_end].reshape(FLAG_BITS, -1), axis=1)[:, :self.size]
        some = reduced[self._waits_end:self._waits_end + len(bits)]
        everywhere = ~reduced[self._waits_end + len(bits):]
        others = [bit for bit in range(FLAG_BITS) if 1 << bit != WAITING]
        if not per_flag[others].any() and np.array_equal(some, everywhere):
            rank_flags = (per_flag * (1 << np.arange(FLAG_BITS))[:, None]).sum(axis=0).tolist()
            waits = reduced[self._flags_end:self._waits_end].view(np.uint32).tolist()
            common = tuple(np.flatnonzero(np.unpackbits(everywhere)).tolist())
            return [RankState(f, common, w / 1e6) for f, w in zip(rank_flags, waits, strict=True)]
        return self._gather_rows(flags, micros, bits)

    def _gather_rows(self, flags, micros, bits):
        self.gathers += 1
        row = self._row
        row[0] = flags
        row[1:5].view(np.uint32)[0] = micros
        row[5:] = bits
        wait_all([self.comm.Iallgather(row, self._rows)])
        rows = self._rows
        ranks, slots = np.nonzero(np.unpackbits(rows[:, 5:], axis=1))
        per_rank = [[] for _ in range(self.size)]
        for rank, slot in zip(ranks.tolist(), slots.tolist(), strict=True):
            per_rank[rank].append(slot)
        waits = rows[:, 1:5].copy().view(np.uint32)[:, 0].tolist()
        return [RankState(f, tuple(s), w / 1e6) for f, s, w in zip(rows[:, 0].tolist(), per_rank, waits, strict=True)]
