"""Checkpoints of a PyTorch training run: model, optimizer and where the data loader was.

    step = rr.checkpoint.restore("checkpoints/run1", model, optimizer)  # None: start afresh
    ...
    rr.checkpoint.save("checkpoints/run1", step, model, optimizer, sampler_epoch=epoch)

Written by rank 0 only, atomically, the newest `keep` kept; read by rank 0 and broadcast, a
truncated or corrupt file skipped with a warning (see ringreduce.checkpoint). A DistributedOptimizer's
compressor state (error-feedback residuals, PowerSGD's) differs per rank: every rank keeps its own
beside the checkpoint, and a job of the same size continues with it; one of another size starts it
afresh (PowerSGD: from its plain steps again).
"""

from ringreduce import checkpoint


def save(directory, step, model, optimizer=None, sampler_epoch=None, extra=None, keep=3):
    """Commit the training state after `step` (call it on every rank; rank 0 writes)."""
    state = {"step": step, "model": model.state_dict(), "sampler_epoch": sampler_epoch, "extra": extra,
             "optimizer": optimizer.state_dict() if optimizer is not None else None}
    rank_state = _compression_state(optimizer)
    return checkpoint.save(state=state, directory=directory, step=step, keep=keep, rank_state=rank_state)


def restore(directory, model, optimizer=None):
    """Load the newest intact checkpoint into `model` and `optimizer` on every rank; returns its
    {"step", "sampler_epoch", "extra"}, or None when there is none (nothing is changed then)."""
    _, state = checkpoint.load_latest(directory=directory)
    if state is None:
        return None
    model.load_state_dict(state["model"])
    if optimizer is not None and state["optimizer"] is not None:
        optimizer.load_state_dict(state["optimizer"])
    if _compression_state(optimizer) is not None:
        mine = checkpoint.load_rank_state(directory, state["step"])
        optimizer.load_compression_state_dict(mine)
    return {key: state[key] for key in ("step", "sampler_epoch", "extra")}


def _compression_state(optimizer):
    """The optimizer's compressor state, where it is a DistributedOptimizer whose compressor has one."""
    return getattr(optimizer, "compression_state_dict", lambda: None)()
