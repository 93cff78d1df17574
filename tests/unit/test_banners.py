"""rrun's filter of mpiexec's own lines: the cleanup banners it recognises are held, every other
line passes at once and in order."""

from ringreduce.launcher.banners import BannerFilter

MPICH_BANNER = b"""
===================================================================================
=   BAD TERMINATION OF ONE OF YOUR APPLICATION PROCESSES
=   PID 16911 RUNNING AT vm
=   EXIT CODE: 15
=   CLEANING UP REMAINING PROCESSES
=   YOU CAN IGNORE THE BELOW CLEANUP MESSAGES
===================================================================================
YOUR APPLICATION TERMINATED WITH THE EXIT STRING: Terminated (signal 15)
This typically refers to a problem with your application.
Please see the FAQ page for debugging suggestions
"""
OPEN_MPI_NOTICE = b"""--------------------------------------------------------------------------
prterun noticed that process rank 1 with PID 0 on node vm exited on
signal 9 (Killed).
--------------------------------------------------------------------------
"""
OPEN_MPI_ERROR = b"""--------------------------------------------------------------------------
There are not enough slots available in the system to satisfy the 4
slots that were requested by the application:
--------------------------------------------------------------------------
"""
HYDRA_PROXY = b"[proxy:0@hostb] HYD_sock_write: write error (Broken pipe)\n"


def shown(text):
    banners = BannerFilter()
    lines = [out for line in text.splitlines(keepends=True) for out in banners.feed(line)] + banners.flush()
    return b"".join(lines), b"".join(banners.held)


def test_the_cleanup_banners_are_held_whole():
    assert shown(MPICH_BANNER) == (b"", MPICH_BANNER)
    assert shown(OPEN_MPI_NOTICE) == (b"", OPEN_MPI_NOTICE)


def test_every_other_line_passes_in_order():
    text = b"\n" + OPEN_MPI_ERROR + HYDRA_PROXY + b"plain\n\n"
    assert shown(text) == (text, b"")
    assert shown(MPICH_BANNER + HYDRA_PROXY) == (HYDRA_PROXY, MPICH_BANNER)


def test_a_frame_that_never_closes_is_shown():
    text = b"=" * 30 + b"\n" + b"".join(b"line %d\n" % i for i in range(50))
    assert shown(text) == (text, b"")
