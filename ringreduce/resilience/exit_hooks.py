"""How a rank's end reaches the others: an uncaught exception aborts the whole MPI job (after
telling rrun which rank failed, and why), so the other ranks do not wait for this one forever; a
normal exit shuts ringreduce down cleanly."""

import atexit
import signal
import sys
from collections.abc import Callable

from mpi4py.run import set_abort_status

from ringreduce.launcher import protocol
from ringreduce.resilience import rrun_link

_installed = False


def install(active: Callable[[], object], shutdown: Callable[[], None]) -> None:
    """Once per process. `active()` gives the running Runtime or None; `shutdown` ends it."""
    global _installed
    if _installed:
        return
    _installed = True
    previous = sys.excepthook

    def abort_job_on_uncaught(exc_type, exc, traceback):
        previous(exc_type, exc, traceback)
        runtime = active()
        if runtime is None or runtime.topology.size == 1:
            return
        code = 128 + signal.SIGINT if isinstance(exc, KeyboardInterrupt) else 1
        error = f"{exc_type.__module__}.{exc_type.__qualname__}: {exc}".removeprefix("builtins.")
        end_job_at_exit(runtime, code, error)

    def shutdown_at_exit():
        runtime = active()
        if runtime is not None and not runtime.failing:
            shutdown()

    sys.excepthook = abort_job_on_uncaught
    atexit.register(shutdown_at_exit)


def end_job_at_exit(runtime, code: int, error: str) -> None:
    """This rank's exit ends the whole MPI job with `code` (rrun hears `error` as its reason)
    instead of shutting down cleanly, which would wait for the other ranks."""
    runtime.failing = True
    if protocol.under_rrun():
        tell_rrun(protocol.status_line(runtime.topology.rank, code, error))
    link = rrun_link.current()
    if link is not None:  # this rank's last collectives, for rrun to show beside the others'
        link.report()
        link.flush(seconds=1.0)
    set_abort_status(code)


def tell_rrun(line):
    """To the process's own stderr, which rrun reads, even where sys.stderr has been replaced."""
    sys.stderr.flush()
    sys.__stderr__.buffer.write(line)
    sys.__stderr__.flush()
