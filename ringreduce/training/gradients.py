"""The gradients of the collectives, as Horovod defines them; ringreduce.torch and
ringreduce.tensorflow both follow these rules, so a model trains as it does under Horovod.

- allreduce: the gradient allreduced with the same op and scale factors.
- allgather: the gradient averaged over the ranks; each rank keeps its own rows.
- broadcast: the gradient averaged over the ranks on the root, times zero on the others (a
  value computed from it: in a graph the allreduce must run on every rank).
- reducescatter: the gradient allgathered, times reducescatter_scale(...).
- alltoall: the gradient sent back by the rows each rank received (its splits, even where the
  forward call split equally: alltoall(..., return_splits=True) reports them).

Horovod's rules take each rank's loss as one term of an average over the ranks, which is why
allgather and broadcast average, and a Sum reducescatter scales by the size.
"""

from ringreduce import ops

# The op that combines the gradients of an allgather's or a broadcast's output.
GATHERED_GRADIENT_OP = ops.Average


def check_differentiable(op: ops.ReduceOp, what: str) -> None:
    """Only Sum and Average have a gradient (Horovod's rule too)."""
    if op not in (ops.Sum, ops.Average):
        raise NotImplementedError(f"the gradient of {what} with op {ops.ReduceOp(op).name.capitalize()} is not "
                                  "defined; only Sum and Average are differentiable")


def reducescatter_scale(op: ops.ReduceOp, prescale_factor: float, postscale_factor: float, size: int) -> float:
    """The factor on the allgathered gradient of a reducescatter."""
    check_differentiable(op, "reducescatter")
    return (size if op == ops.Sum else 1) * prescale_factor * postscale_factor

