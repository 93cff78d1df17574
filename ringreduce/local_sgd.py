"""When local SGD averages (post-local SGD, torch.distributed's schedule): every step of the
warm-up averages (gradients, or for an adapter that only sees the model, the model), then every
`period`-th step from the end of the warm-up on, starting with its first. The adapters
(ringreduce.torch's PeriodicModelAverager, ringreduce.tensorflow.keras's LocalSGDCallback) do the
averaging; this is what they share."""


def check(period, warmup_steps):
    if period < 1:
        raise ValueError(f"period must be at least 1, got {period}")
    if warmup_steps < 0:
        raise ValueError(f"warmup_steps must be at least 0, got {warmup_steps}")


def averages_after(step, period, warmup_steps):
    """Whether the model is averaged after local step `step` (counted from 0) that follows the
    warm-up."""
    return step >= warmup_steps and (step - warmup_steps) % period == 0
