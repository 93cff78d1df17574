"""Hosts and their slots, from -H, a hostfile or a Slurm allocation, and where the ranks go."""

import dataclasses
import re

from ringreduce.launcher.errors import LaunchError

_HOST = r"[A-Za-z0-9][A-Za-z0-9._-]*"
_COLON_FORM = re.compile(rf"^({_HOST})(?::(\d+))?$")
# Open MPI's form: `host slots=N max_slots=M` (either or both; max_slots alone is the slot count).
_SLOTS_FORM = re.compile(rf"^({_HOST})((?:\s+(?:max_)?slots\s*=\s*\d+)+)$")
_SLOT_SETTING = re.compile(r"(max_slots|slots)\s*=\s*(\d+)")


@dataclasses.dataclass(frozen=True)
class Host:
    name: str
    slots: int


def parse_hosts(text):
    """`host1:4,host2:4` (a host without a count has one slot)."""
    hosts = [_parse_entry(entry.strip(), f"-H entry {entry.strip()!r}") for entry in text.split(",")]
    return hosts


def parse_hostfile(path):
    """Lines `host slots=4 [max_slots=8]` or `host:4` (or a bare host: one slot); `#` starts a
    comment. A host on several lines gets their slots together, so a list of node names with one
    line per slot (what `scontrol show hostnames` repeated gives) works too."""
    try:
        with open(path) as f:
            lines = f.read().splitlines()
    except OSError as error:
        raise LaunchError(f"cannot read hostfile {path}: {error.strerror}") from None
    hosts = []
    for number, line in enumerate(lines, 1):
        text = line.split("#", 1)[0].strip()
        if not text:
            continue
        where = f"hostfile {path} line {number} ({text!r})"
        match = _SLOTS_FORM.match(text)
        hosts.append(Host(match[1], _slots_setting(match[2], where)) if match else _parse_entry(text, where))
    if not hosts:
        raise LaunchError(f"hostfile {path} names no hosts")
    slots = {}
    for host in hosts:
        slots[host.name] = slots.get(host.name, 0) + host.slots
    return [Host(name, count) for name, count in slots.items()]


def _slots_setting(text, where):
    """The slots of `slots=N max_slots=M`: N (at most M), else M."""
    settings = {key: _slots(value, where) for key, value in _SLOT_SETTING.findall(text)}
    slots = settings.get("slots", settings.get("max_slots"))
    if "max_slots" in settings and slots > settings["max_slots"]:
        raise LaunchError(f"{where}: slots={slots} is more than max_slots={settings['max_slots']}")
    return slots


_SHELL_METACHARACTERS = set(";|&$`<>(){}[]'\"\\*?!~")


def _parse_entry(text, where):
    match = _COLON_FORM.match(text)
    if not match:
        unsafe = "".join(sorted(set(text) & _SHELL_METACHARACTERS))
        if unsafe:
            raise LaunchError(f"{where} contains shell metacharacters ({unsafe}), which no host name has; "
                              "rrun never passes hosts through a shell")
        raise LaunchError(f"{where} is not 'host' or 'host:slots' or 'host slots=N'")
    return Host(match[1], _slots(match[2], where) if match[2] is not None else 1)


def _slots(text, where):
    slots = int(text)
    if slots < 1:
        raise LaunchError(f"{where}: the number of slots must be at least 1")
    return slots


def place(hosts, num_proc):
    """Fill the hosts' slots in order with `num_proc` ranks: [(host, ranks there), ...]."""
    total = sum(h.slots for h in hosts)
    if num_proc > total:
        listing = ", ".join(f"{h.name}:{h.slots}" for h in hosts)
        raise LaunchError(f"-np {num_proc} is more than the {total} slots given ({listing})")
    placement, left = [], num_proc
    for host in hosts:
        if left == 0:
            break
        count = min(host.slots, left)
        placement.append((host.name, count))
        left -= count
    return placement
