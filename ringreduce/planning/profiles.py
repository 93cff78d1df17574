"""The cost model's profile on disk: where `rrun --calibrate` saves it and every job looks for it."""

import dataclasses
import os
import pathlib
import tempfile

from ringreduce.algorithms import cost
from ringreduce.machine import cores


def default_path():
    """Where `rrun --calibrate` saves a profile and jobs look for one: RINGREDUCE_PROFILE, else
    ~/.cache/ringreduce/profile.json."""
    return pathlib.Path(os.environ.get("RINGREDUCE_PROFILE") or pathlib.Path.home() / ".cache/ringreduce/profile.json")


def load(path=None):
    """The saved profile at `path` (default_path()), or where there is none the built-in one (cost.DEFAULT) with this
    host's cores: whether ranks outnumber the cores is this machine's fact, not the test VM's."""
    path = pathlib.Path(path) if path else default_path()
    try:
        text = path.read_text()
    except FileNotFoundError:
        return dataclasses.replace(cost.DEFAULT, cores=cores.usable_cores())
    try:
        return cost.Profile.from_json(text, source=str(path))
    except (ValueError, TypeError, KeyError, AttributeError) as error:
        raise ValueError(f"{path} is not a ringreduce cost profile ({type(error).__name__}: {error}); "
                         "measure it again with rrun --calibrate, or remove it to use the built-in one") from None


def save(profile, path=None):
    """Write the profile whole or not at all (a job starting meanwhile reads the old one or the
    new, never half of one): to a temporary file beside it, renamed into place."""
    path = pathlib.Path(path) if path else default_path()
    path.parent.mkdir(parents=True, exist_ok=True)
    descriptor, temporary = tempfile.mkstemp(dir=path.parent, prefix=f".{path.name}-", suffix=".tmp")
    try:
        with os.fdopen(descriptor, "w") as f:
            f.write(profile.to_json())
        os.chmod(temporary, 0o644)
        os.replace(temporary, path)
    except BaseException:
        if os.path.exists(temporary):
            os.unlink(temporary)
        raise
    return path
