"""One negotiation domain as this rank runs it: the whole job or a process set, with its engine,
its communicators and the names of its unnamed calls."""

import itertools
import threading


class Domain:
    """One negotiation domain as this rank runs it: the whole job (set 0) or a process set, with
    its global ranks, its engine, the communicator of its point-to-point transfers and its plain
    allreduces in program order (each None where this rank is not a member; `ordered` also where
    the ranks do not run them so) and the names of its unnamed calls, given per domain so that they
    agree among the domain's ranks."""

    def __init__(self, set_id, ranks, engine, peer_comm, ordered=None, label=None):
        self.set_id, self.ranks, self.engine, self.peer_comm = set_id, list(ranks), engine, peer_comm
        self.ordered = ordered
        # A set its members alone make is numbered apart on each member: its label names it.
        self.unnamed_prefix = "noname" if set_id == 0 else f"noname.{label or set_id}"
        self._names = itertools.count(1)
        self._waiting = set()  # the numbers held by unnamed plain calls in flight
        self._names_lock = threading.Lock()
        # The Messages of calls whose arguments passed their checks, by those arguments: plain calls once
        # they ran in program order, async allreduces once submitted (collectives._checked_key)
        self.checked = {}

    def checked_message(self, key):
        """The Message kept under `key`, or None: none kept, or a key no dict can hold (an argument
        such as a list for a factor), whose call the checks then see and name."""
        try:
            return self.checked.get(key)
        except TypeError:
            return None

    def remember_checked(self, key, message):
        if len(self.checked) >= 1024:  # a program that makes ever new calls: keep what recent ones need
            self.checked.clear()
        try:
            self.checked[key] = message
        except TypeError:  # a key no dict can hold: its calls are checked each time
            pass

    def auto_name(self):
        """An unnamed async call's name: counted, so the calls of every rank pair up in order."""
        with self._names_lock:
            number = next(self._names)
        return f"{self.unnamed_prefix}.{number}"

    def waiting_name(self):
        """An unnamed plain call's (number, name): the lowest number no other plain call in flight
        here holds. A thread's plain calls finish one by one, so a loop's unnamed calls repeat the
        same name, which the response cache then knows (a counted name never comes again)."""
        with self._names_lock:
            number = min(set(range(len(self._waiting) + 1)) - self._waiting) if self._waiting else 0
            self._waiting.add(number)
        return number, f"{self.unnamed_prefix}.wait.{number}"

    def release(self, numbers):
        with self._names_lock:
            self._waiting.difference_update(numbers)

    def describe(self):
        return f"process set {self.set_id} (ranks {', '.join(map(str, self.ranks))})"
