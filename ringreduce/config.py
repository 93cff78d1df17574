"""Every tuning knob in one place, read from RINGREDUCE_* environment variables.

rrun's flags set the same variables, so a job can be tuned either way.
"""

import dataclasses
import os

ALGORITHMS = ("ring", "mpi")


@dataclasses.dataclass(frozen=True)
class Config:
    # "ring": ringreduce's own algorithms; "mpi": the MPI library's collectives (the baseline).
    algorithm: str = "ring"
    # Large transfers are split into pieces of this many bytes so that the reduction of one
    # piece overlaps the transfer of the next.
    pipeline_chunk_bytes: int = 4 << 20

    @classmethod
    def from_env(cls, environ=os.environ):
        algorithm = environ.get("RINGREDUCE_ALGORITHM", cls.algorithm).strip().lower()
        if algorithm not in ALGORITHMS:
            raise ValueError(
                f"RINGREDUCE_ALGORITHM={algorithm!r} is not one of {', '.join(ALGORITHMS)}"
            )
        chunk = _positive_int(environ, "RINGREDUCE_PIPELINE_CHUNK_BYTES", cls.pipeline_chunk_bytes)
        return cls(algorithm=algorithm, pipeline_chunk_bytes=chunk)


def _positive_int(environ, name, default):
    text = environ.get(name)
    if text is None:
        return default
    try:
        value = int(text)
    except ValueError:
        value = 0
    if value <= 0:
        raise ValueError(f"{name}={text!r} must be a positive whole number")
    return value
