"""The error class of a collective that fails inside a graph (tf.function, tf.compat.v1).

TensorFlow's kernel for Python ops reports every Python exception as InvalidArgumentError or
UnknownError, whatever its class, so a mismatch inside a graph could not be the
FailedPreconditionError that Horovod's compiled ops raise. A graph collective's Python node
therefore returns its error as a status code and a message, and a small compiled op
(graph_errors.cc) passes the results on or fails with that code.

The op is compiled once per TensorFlow version, on first use, with the compiler and flags
TensorFlow reports (tf.sysconfig), into a directory only this user can write: a shared library
is code, and a file someone else could have placed there is never loaded. Where it cannot be
built (no compiler, no headers), a second Python node raises instead, as InvalidArgumentError or
UnknownError.
"""

import contextlib
import fcntl
import functools
import hashlib
import os
import pathlib
import shutil
import stat
import subprocess
import sys
import tempfile

import ringreduce as core
import tensorflow as tf

_SOURCE = pathlib.Path(__file__).with_name("graph_errors.cc")


def op_error_class(error: BaseException) -> type:
    """The TensorFlow op error Horovod's ops raise for this error."""
    if isinstance(error, core.MismatchError):
        return tf.errors.FailedPreconditionError
    if isinstance(error, (ValueError, TypeError)):
        return tf.errors.InvalidArgumentError
    return tf.errors.UnknownError


def status_code(error: BaseException) -> int:
    return _CODES[op_error_class(error)]


_CODES = {tf.errors.FailedPreconditionError: tf.errors.FAILED_PRECONDITION,
          tf.errors.InvalidArgumentError: tf.errors.INVALID_ARGUMENT, tf.errors.UnknownError: tf.errors.UNKNOWN}


def raise_if(values: list, code, message) -> list:
    """`values` passed on, or the node fails with status `code` and `message`."""
    compiled = _compiled_op()
    if compiled is not None:
        return compiled(values, code, message)

    def check(code, message, *arrays):  # TensorFlow reports this as InvalidArgumentError or UnknownError
        if code:
            raise (ValueError if code == tf.errors.INVALID_ARGUMENT else RuntimeError)(message.decode())
        return list(arrays)

    return tf.numpy_function(check, [code, message, *values], [v.dtype for v in values], stateful=True)


@functools.cache
def _compiled_op():
    try:
        return tf.load_op_library(str(_built_library())).ringreduce_raise_if
    except (OSError, subprocess.SubprocessError, tf.errors.OpError) as error:
        print(f"ringreduce.tensorflow: the graph error op could not be built ({error}); inside graphs a "
              "mismatch is raised as UnknownError", file=sys.stderr)
        return None


def _built_library() -> pathlib.Path:
    flags = [*tf.sysconfig.get_compile_flags(), *tf.sysconfig.get_link_flags()]
    source = _SOURCE.read_bytes()
    digest = hashlib.sha256(source + "\0".join([tf.__version__, *flags]).encode()).hexdigest()[:16]
    directory = _private_directory(_cache_root() / f"tf-ops-{tf.__version__}-{digest}")
    library = directory / "graph_errors.so"
    with open(directory / "build.lock", "w") as lock:  # ranks on one host build it once
        fcntl.flock(lock, fcntl.LOCK_EX)
        if not library.exists():
            _compile(source, flags, directory, library)
    _check_private(library)
    return library


def _compile(source: bytes, flags: list[str], directory: pathlib.Path, library: pathlib.Path) -> None:
    compiler = os.environ.get("CXX") or shutil.which("g++") or shutil.which("c++")
    if compiler is None:
        raise OSError("no C++ compiler (g++ or $CXX) on PATH")
    with tempfile.TemporaryDirectory(dir=directory) as scratch:
        built = pathlib.Path(scratch) / library.name
        result = subprocess.run([compiler, "-shared", "-fPIC", "-O2", "-w", "-x", "c++", "-", "-o", str(built), *flags],
                                input=source, capture_output=True, timeout=300)
        if result.returncode != 0:
            raise OSError(f"{compiler} failed: {result.stderr.decode(errors='replace')[-500:]}")
        os.replace(built, library)


def _cache_root() -> pathlib.Path:
    return pathlib.Path(os.environ.get("XDG_CACHE_HOME") or pathlib.Path.home() / ".cache") / "ringreduce"


def _private_directory(path: pathlib.Path) -> pathlib.Path:
    """`path`, made if missing (mode 0700); refused unless this user owns it and no one else can
    write to it or to its parent (so it cannot be swapped)."""
    path.parent.mkdir(parents=True, exist_ok=True, mode=0o700)
    with contextlib.suppress(FileExistsError):
        path.mkdir(mode=0o700)
    _check_private(path.parent)
    _check_private(path)
    return path


def _check_private(path: pathlib.Path) -> None:
    info = os.lstat(path)
    if stat.S_ISLNK(info.st_mode) or info.st_uid != os.getuid() or info.st_mode & (stat.S_IWGRP | stat.S_IWOTH):
        raise PermissionError(f"{path} is a link, not this user's, or writable by others: not used")
