"""Where ringreduce keeps files that it later trusts (commits it unpickles, rrun's sockets and
flight records): directories no other user can enter or plant a file in. Light to import: rrun
uses it too."""

import os
import stat

from ringreduce.errors import UnsafeFileError


def private_directory(path: str | os.PathLike) -> None:
    """Make `path` a directory only this user can enter (0700), or check that it is one: a real
    directory, this user's, with no group or other bits (UnsafeFileError naming what is wrong)."""
    os.makedirs(os.path.dirname(os.path.abspath(path)), exist_ok=True)
    try:
        os.mkdir(path, 0o700)
        return
    except FileExistsError:
        pass
    info = os.lstat(path)
    if not stat.S_ISDIR(info.st_mode):
        raise UnsafeFileError(f"{path} exists and is not a directory (a link or a file someone put there); "
                              "remove it, or choose another")
    if info.st_uid != os.getuid() or stat.S_IMODE(info.st_mode) & 0o077:
        raise UnsafeFileError(f"{path} is not private to this user (owner {info.st_uid}, mode "
                              f"{stat.S_IMODE(info.st_mode):o}; needed: owner {os.getuid()}, mode 700): another "
                              "user could plant a commit that runs their code in every rank")
