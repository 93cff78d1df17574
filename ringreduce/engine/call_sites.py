"""Where in the user's code a collective was called (file:line), for the errors that explain a
disagreement between ranks: a rank that raised alone and skipped a call shows at once as ranks
waiting in calls made from different lines."""

import os
import sys

# Frames of these modules are ringreduce's own (the bindings included) or the frameworks' glue
# between the user's code and ours (autograd's and Keras's callers).
_OWN = ("ringreduce", "torch", "tensorflow", "keras", "tf_keras", "contextlib", "functools")


def user_call_site(depth: int = 2) -> str:
    """'file.py:123' of the innermost caller outside ringreduce and the frameworks ('' if none)."""
    frame = sys._getframe(depth)
    while frame is not None:
        module = frame.f_globals.get("__name__", "")
        if module.split(".")[0] not in _OWN:
            return f"{os.path.basename(frame.f_code.co_filename)}:{frame.f_lineno}"
        frame = frame.f_back
    return ""
