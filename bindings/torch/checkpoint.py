"""Checkpoints of a PyTorch training run: model, optimizer and where the data loader was.

    step = rr.checkpoint.restore("checkpoints/run1", model, optimizer)  # None: start afresh
    ...
    rr.checkpoint.save("checkpoints/run1", step, model, optimizer, sampler_epoch=epoch)

Written by rank 0 only, atomically, the newest `keep` kept; read by rank 0 and broadcast, a
truncated or corrupt file skipped with a warning (see ringreduce.checkpoint).
"""

from ringreduce import checkpoint


def save(directory, step, model, optimizer=None, sampler_epoch=None, extra=None, keep=3):
    """Commit the training state after `step` (call it on every rank; rank 0 writes)."""
    state = {"step": step, "model": model.state_dict(), "sampler_epoch": sampler_epoch, "extra": extra,
             "optimizer": optimizer.state_dict() if optimizer is not None else None}
    return checkpoint.save(state=state, directory=directory, step=step, keep=keep)


def restore(directory, model, optimizer=None):
    """Load the newest intact checkpoint into `model` and `optimizer` on every rank; returns its
    {"step", "sampler_epoch", "extra"}, or None when there is none (nothing is changed then)."""
    _, state = checkpoint.load_latest(directory=directory)
    if state is None:
        return None
    model.load_state_dict(state["model"])
    if optimizer is not None and state["optimizer"] is not None:
        optimizer.load_state_dict(state["optimizer"])
    return {key: state[key] for key in ("step", "sampler_epoch", "extra")}
