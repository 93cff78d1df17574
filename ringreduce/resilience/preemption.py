"""Preemption notices: the signal a scheduler sends before it ends a job (Slurm's `--signal=USR1@N`,
or SIGTERM at the time limit, KillWait seconds before SIGKILL), which rrun passes on to every rank.

From init on, SIGUSR1 only sets this process's flag, which collectives.stop_requested() combines
over the ranks so that every rank stops at the same step. SIGTERM does the same once the program
has asked stop_requested() at least once; until then it ends the process as it always did.
Signals the program handles itself are left alone.
"""

import os
import signal
import threading
import time

STOP_SIGNALS = (signal.SIGUSR1, signal.SIGTERM)
_received = None  # the stop signal this process got, if any
_asked = False  # has the program asked stop_requested()?


def install():
    """Take the stop signals that are still at their default action (signal handlers can only be
    set from the main thread; elsewhere nothing changes)."""
    if threading.current_thread() is not threading.main_thread():
        return
    for signum in STOP_SIGNALS:
        if signal.getsignal(signum) == signal.SIG_DFL:
            signal.signal(signum, _on_signal)


def requested_here():
    """Has this process been told to stop? (Asking makes SIGTERM a notice too.)"""
    global _asked
    _asked = True
    return _received is not None


def seconds_left(environ=os.environ, now=None):
    """Seconds until the scheduler ends this job at its time limit (Slurm's projected end,
    SLURM_JOB_END_TIME, a Unix time), or None where no limit is known."""
    end = environ.get("SLURM_JOB_END_TIME", "")
    if not end.isdigit() or int(end) == 0:
        return None
    return int(end) - (time.time() if now is None else now)


def near_end(within, environ=os.environ, now=None):
    """Is this process told to stop, or (`within` seconds given) is the job's end that close?"""
    if requested_here():
        return True
    left = None if within is None else seconds_left(environ, now)
    return left is not None and left <= within


def _on_signal(signum, _frame):
    global _received
    if signum == signal.SIGTERM and not _asked:  # a program that never asks ends, as it always did
        signal.signal(signum, signal.SIG_DFL)
        os.kill(os.getpid(), signum)
        return
    _received = signum
