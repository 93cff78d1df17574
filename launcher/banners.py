"""mpiexec's own cleanup banners after a rank failed, held back so that the last lines a user
reads are rrun's, which name the rank that failed and how (the banners name rrun's SIGTERM, or a
code that is not the rank's). Only banners recognised here are held; every other line of
mpiexec's (a Hydra proxy naming a lost host, say) passes at once.

MPICH's Hydra frames its banner in lines of '=' and follows it with three lines of its own;
Open MPI frames its notices in lines of '-'.
"""

import re

_FRAME = re.compile(rb"^(=|-){20,}\s*$")
_CLEANUP_WORDS = (
    b"BAD TERMINATION OF ONE OF YOUR APPLICATION PROCESSES",  # MPICH (Hydra)
    b"Primary job  terminated normally, but",  # Open MPI
    b"noticed that process rank",
    b"detected that one or more processes exited with non-zero status",
)
MAX_BANNER_LINES = 40  # a frame never closed within this many lines was no banner
_MPICH_AFTERWORD = (
    b"YOUR APPLICATION TERMINATED WITH THE EXIT STRING:",
    b"This typically refers to a problem with your application.",
    b"Please see the FAQ page for debugging suggestions",
)


class BannerFilter:
    """Fed mpiexec's lines one at a time: `feed` returns the lines to show now; the recognised
    banners collect in `held`, for the caller to show at the end if rrun named no rank."""

    def __init__(self):
        self.held = []
        self._block = []  # a framed block being read (and a blank line before it)

    def feed(self, line):
        if self._block and self._opening() is None:  # a blank line, kept in case a banner follows
            if _FRAME.match(line):
                self._block.append(line)
                return []
            blank, self._block = self._block, []
            return blank + self.feed(line)
        if self._block:
            self._block.append(line)
            if line.strip() == self._opening() or len(self._block) > MAX_BANNER_LINES:
                return self._close()
            return []
        if not line.strip() or _FRAME.match(line):
            self._block = [line]
            return []
        if line.startswith(_MPICH_AFTERWORD) and self.held:
            self.held.append(line)
            return []
        return [line]

    def flush(self):
        """What is left at the end of mpiexec's output: an unfinished block is shown as it is."""
        block, self._block = self._block, []
        return block

    def _opening(self):
        """The frame line that opened the block being read, or None before one has come."""
        return next((line.strip() for line in self._block if _FRAME.match(line)), None)

    def _close(self):
        block, self._block = self._block, []
        if any(word in line for line in block for word in _CLEANUP_WORDS):
            self.held.extend(block)
            return []
        return block
