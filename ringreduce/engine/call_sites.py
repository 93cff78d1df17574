"""Where in the user's code a collective was called (file:line), for the errors that explain a
disagreement between ranks: a rank that raised alone and skipped a call shows at once as ranks
waiting in calls made from different lines."""

import os
import sys

# Frames of these modules are ringreduce's own (the bindings included) or the frameworks' glue
# between the user's code and ours (autograd's and Keras's callers).
_OWN = ("ringreduce", "torch", "tensorflow", "keras", "tf_keras", "contextlib", "functools")


# Code object -> its file's name for the user's code, None for ringreduce's and the frameworks'.
# Looked up once per function: every collective walks these frames (benchmarks/call_sites.py).
_FILES: dict = {}


def user_call_site(depth: int = 2) -> str:
    """'file.py:123' of the innermost caller outside ringreduce and the frameworks ('' if none)."""
    frame = sys._getframe(depth)
    while frame is not None:
        code = frame.f_code
        try:
            file = _FILES[code]
        except KeyError:
            own = frame.f_globals.get("__name__", "").split(".")[0] in _OWN
            file = _FILES[code] = None if own else os.path.basename(code.co_filename)
        if file is not None:
            return f"{file}:{frame.f_lineno}"
        frame = frame.f_back
    return ""


def site_of(code, line: int) -> str | None:
    """'file.py:123' for a frame's code and line that user_call_site has seen as the user's; None
    for ringreduce's, a framework's, or code it has not met."""
    file = _FILES.get(code)
    return f"{file}:{line}" if file else None
