"""Which options of the distributed optimizers go together: one set of rules for torch's
DistributedOptimizer, TensorFlow's tape and optimizer and Keras's, checked when they are built.

Horovod's own rules where Horovod has the option (gradient_predivide_factor needs Average,
backward_passes_per_step is at least 1, `num_groups` is the old name of `groups`), and
ringreduce's for its extensions:

- PowerSGD averages: op=Average, no gradient_predivide_factor, no staleness (its averaging
  waits for the whole backward, so there is nothing to overlap).
- staleness=1 takes any op and any compression but PowerSGD and top-k (whose sparse rows are
  gathered, not combined in place where the next step finds them).
- load balancing weights each rank's mean gradient: op=Average, backward_passes_per_step=1, the
  balancer's own process set.
"""

import warnings
from collections.abc import Callable

from ringreduce import ops
from ringreduce.process_sets import ProcessSet
from ringreduce.training.powersgd import PowerSGD


def check(op: ops.ReduceOp, compression: object, gradient_predivide_factor: float = 1.0,
          backward_passes_per_step: int = 1, staleness: int = 0, load_balancer: object = None,
          process_set: ProcessSet | None = None) -> None:
    """Raise ValueError, naming the options, where they do not go together."""
    if not isinstance(backward_passes_per_step, int) or backward_passes_per_step < 1:
        raise ValueError(f"backward_passes_per_step must be at least 1, got {backward_passes_per_step!r}")
    if gradient_predivide_factor != 1.0 and op != ops.Average:
        raise ValueError("gradient_predivide_factor needs op=Average")
    powersgd = isinstance(compression, PowerSGD)
    if powersgd and (op != ops.Average or gradient_predivide_factor != 1.0):
        raise ValueError("PowerSGD averages: it takes op=Average and no gradient_predivide_factor")
    if staleness not in (0, 1):
        raise ValueError(f"staleness must be 0 (synchronous) or 1 (one step stale), got {staleness!r}")
    if staleness and powersgd:
        raise ValueError("staleness=1 does not combine with PowerSGD, whose averaging waits for the whole backward")
    if staleness and getattr(compression, "gathers", False):
        raise ValueError("staleness=1 does not combine with top-k compression, whose rows are gathered, not "
                         "combined in place")
    if load_balancer is not None:
        load_balancer.check_optimizer(process_set, backward_passes_per_step, op)


def groups(num_groups: int, groups: object, is_member: Callable[[object], bool], member: str) -> object:
    """Horovod's explicit gradient groups, checked as Horovod checks them: `num_groups` is the old
    name of `groups` (a warning says so; `groups` wins where both are given), a number of groups
    or a list of lists of `member`s (each at most once). The engine fuses every gradient ready in
    a cycle anyway, so they change nothing more."""
    if not isinstance(num_groups, int) or num_groups < 0:
        raise ValueError(f"num_groups must be a whole number of at least 0, got {num_groups!r}")
    if num_groups:
        warnings.warn("num_groups has been replaced by groups and will be removed", DeprecationWarning, stacklevel=3)
        groups = num_groups if groups is None else groups
    if groups is None:
        return None
    if isinstance(groups, list):
        seen = set()
        for group in groups:
            if not isinstance(group, (list, tuple)) or not all(is_member(m) for m in group):
                raise ValueError(f"groups must be a number of groups or a list of lists of {member}")
            if seen & {id(m) for m in group}:
                raise ValueError(f"a {member} can only appear once in groups")
            seen |= {id(m) for m in group}
        return groups
    if isinstance(groups, int) and not isinstance(groups, bool) and groups > 0:
        return groups
    raise ValueError(f"groups must be a number of groups or a list of lists of {member}, got {groups!r}")
