"""`rrun --dump`: another rrun's way into a running job. Each rrun that runs a job serves a Unix
socket in its private run directory (only its user can reach it); whoever connects gets the
ranks' last collectives, asked for at that moment, and the job goes on."""

import glob
import os
import socket
import threading

import psutil

from ringreduce.launcher.errors import LaunchError
from ringreduce.resilience.safe_files import private_directory


def run_directory() -> str:
    """rrun's private directory on this host (0700, refused where another user could have made
    or changed it): the --dump sockets and the flight record files."""
    base = os.environ.get("XDG_RUNTIME_DIR") or "/tmp"
    path = os.path.join(base, f"ringreduce-{os.getuid()}")
    private_directory(path)
    return path


def _path(pid: int) -> str:
    return os.path.join(run_directory(), f"rrun-{pid}.sock")


class DumpServer:
    def __init__(self, dump) -> None:
        """Serve `dump()`'s text to each connection."""
        self._dump = dump
        self.path = _path(os.getpid())
        if os.path.lexists(self.path):  # an earlier rrun of this pid that was killed
            os.unlink(self.path)
        self._socket = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        self._socket.bind(self.path)
        self._socket.listen(4)
        threading.Thread(target=self._serve, name="rrun-dump", daemon=True).start()

    def _serve(self):
        while True:
            try:
                connection, _ = self._socket.accept()
            except OSError:  # closed
                return
            with connection:
                try:
                    connection.sendall(self._dump().encode() + b"\n")
                except OSError:
                    pass

    def close(self) -> None:
        self._socket.close()
        try:
            os.unlink(self.path)
        except FileNotFoundError:
            pass


def request(pid: int | None) -> str:
    """The dump of the job run by the rrun of `pid` (None: the only one of this user here)."""
    if pid is None:
        running = [path for path in sorted(glob.glob(_path(0).replace("rrun-0", "rrun-*")))
                   if psutil.pid_exists(int(os.path.basename(path)[5:-5]))]  # not one a killed rrun left
        if len(running) != 1:
            pids = ", ".join(os.path.basename(p)[5:-5] for p in running)
            raise LaunchError("rrun --dump: no job of yours runs on this host" if not running else
                              f"rrun --dump: several jobs of yours run here (rrun pids {pids}): give one, --dump PID")
        path = running[0]
    else:
        path = _path(pid)
    with socket.socket(socket.AF_UNIX, socket.SOCK_STREAM) as connection:
        try:
            connection.connect(path)
        except OSError as error:
            raise LaunchError(f"rrun --dump: no job of rrun {pid or ''} to reach at {path} "
                              f"({error.strerror})") from None
        connection.settimeout(30)
        chunks = []
        while chunk := connection.recv(65536):
            chunks.append(chunk)
    return b"".join(chunks).decode(errors="replace").rstrip("\n")
