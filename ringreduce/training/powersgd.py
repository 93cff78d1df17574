"""PowerSGD (Vogels et al., 2019): each gradient matrix M (its first dimension by the rest) is
averaged as a low-rank product P Q^T, by two allreduces of its factors instead of one of M, with
torch.distributed's PowerSGD hook's names and meanings:

- one step of power iteration per training step: P = M Q, averaged over the ranks and
  orthonormalised, then Q = M^T P, averaged; every tensor's P in one grouped allreduce, every Q
  in another, so the factors of a whole step travel fused;
- `warm_start`: Q starts from the last step's (else afresh, from `random_seed`, the same on every
  rank); `use_error_feedback`: what the approximation missed of a rank's M is added to its next
  one; `start_powerSGD_iter`: the steps before that are plain averages; tensors that would shrink
  by less than `min_compression_rate` (and vectors) are averaged as they are, fused.

Framework-neutral: it works on the arrays it is given, in place (numpy, or CuPy where the array
module is CuPy's), so a binding hands it views of its gradients.
"""

from collections.abc import Mapping, Sequence
from typing import Any

import numpy as np

from ringreduce import collectives, ops
from ringreduce.machine.backends import module_of
from ringreduce.process_sets import ProcessSet, global_process_set


class PowerSGD:
    """The state of PowerSGD's averaging (torch.distributed's PowerSGDState's arguments and
    defaults): each rank's error feedback and the last step's Q of every matrix it compresses."""

    def __init__(self, matrix_approximation_rank: int = 1, start_powerSGD_iter: int = 1_000,  # noqa: N803
                 min_compression_rate: float = 2, use_error_feedback: bool = True, warm_start: bool = True,
                 random_seed: int = 0) -> None:
        if matrix_approximation_rank < 1:
            raise ValueError(f"matrix_approximation_rank must be at least 1, got {matrix_approximation_rank}")
        if start_powerSGD_iter < 0:
            raise ValueError(f"start_powerSGD_iter must be at least 0, got {start_powerSGD_iter}")
        self.rank = matrix_approximation_rank
        self.start_iter = start_powerSGD_iter
        self.min_compression_rate = min_compression_rate
        self.use_error_feedback = use_error_feedback
        self.warm_start = warm_start
        self.random_seed = random_seed
        self.iteration = 0
        # name -> what the approximation missed of this rank's last M (differs per rank)
        self.errors: dict[str, np.ndarray] = {}
        self.qs: dict[str, np.ndarray] = {}  # name -> the last step's Q (the same on every rank)
        self._approximations: dict[str, np.ndarray] = {}  # name -> the buffer each step's P Q^T is written into

    def compresses(self, shape: Sequence[int]) -> bool:
        """Is a gradient of this shape sent as factors (a matrix that shrinks enough)?"""
        if len(shape) < 2:
            return False
        n, m = shape[0], int(np.prod(shape[1:]))
        return n * m >= self.min_compression_rate * (n + m) * self.rank

    def average(self, named: Mapping[str, np.ndarray], process_set: ProcessSet = global_process_set) -> None:
        """Average the arrays of `named` ({name: array}, the same names in the same order on every
        rank) over the ranks, in place: plainly for the first start_powerSGD_iter calls, then as
        low-rank products where that pays."""
        self.iteration += 1
        names = list(named)
        if self.iteration <= self.start_iter:
            collectives.grouped_allreduce_([named[n] for n in names], op=ops.Average, name="powersgd.plain",
                                           process_set=process_set)
            return
        matrices = [n for n in names if self.compresses(named[n].shape)]
        vectors = [named[n] for n in names if n not in matrices]
        pending = collectives.grouped_allreduce_async_(vectors, op=ops.Average, name="powersgd.uncompressed",
                                                       process_set=process_set) if vectors else None
        if matrices:
            self._low_rank({n: named[n] for n in matrices}, process_set)
        if pending is not None:
            collectives.synchronize(pending)

    def _low_rank(self, named, process_set):
        xp = module_of(next(iter(named.values())))
        ms, ps, qs = {}, {}, {}
        for name, array in named.items():
            m = ms[name] = array.reshape(array.shape[0], -1)
            if self.use_error_feedback and name in self.errors:
                m += self.errors[name]
            qs[name] = self.qs[name] if self.warm_start and name in self.qs else self._fresh_q(xp, name, m)
            ps[name] = m @ qs[name]
        collectives.grouped_allreduce_(list(ps.values()), op=ops.Average, name="powersgd.p", process_set=process_set)
        for name in named:
            ps[name] = xp.linalg.qr(ps[name])[0]  # the same input everywhere: the same basis everywhere
            qs[name] = ms[name].T @ ps[name]
        collectives.grouped_allreduce_(list(qs.values()), op=ops.Average, name="powersgd.q", process_set=process_set)
        for name, m in ms.items():
            # Into buffers kept from step to step: fresh pages cost more here than the arithmetic.
            approximation = self._approximations.get(name)
            if approximation is None or approximation.shape != m.shape:
                approximation = self._approximations[name] = xp.empty_like(m)
            xp.matmul(ps[name], qs[name].T, out=approximation)
            if self.use_error_feedback:
                if name not in self.errors:
                    self.errors[name] = xp.empty_like(m)
                xp.subtract(m, approximation, out=self.errors[name])
            named[name][...] = approximation.reshape(named[name].shape)
            self.qs[name] = qs[name]

    def _fresh_q(self, xp, name, m):
        """A random start, the same on every rank: drawn from the seed, the step and the name."""
        seed = [self.random_seed, self.iteration, *name.encode()]
        q = np.random.default_rng(seed).standard_normal((m.shape[1], self.rank)).astype(m.dtype)
        return xp.asarray(q)

    def state_dict(self) -> dict[str, Any]:
        return {"iteration": self.iteration, "errors": dict(self.errors), "qs": dict(self.qs)}

    def load_state_dict(self, state: Mapping[str, Any]) -> None:
        self.iteration, self.errors, self.qs = state["iteration"], dict(state["errors"]), dict(state["qs"])
