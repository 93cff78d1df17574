"""The response cache: names negotiated before, so that a training loop's repeats travel as one
bit each. Every cache decision is made here: which slot stands for a pending request, whether a
request must be announced in full, and what the negotiation remembers and forgets. Every rank
holds an identical copy, changed by the same negotiation in the same order.
"""

import collections

from ringreduce.engine.requests import ANNOUNCED, CACHED, NEW


class Cache:
    """Each cached name in a slot, with the Response every rank agreed on (reused every time the
    name comes again as cache bits); least recently used goes first when full."""

    def __init__(self, capacity):
        self.capacity = capacity
        self._slots = collections.OrderedDict()  # name -> slot, least recently used first
        self._entries = {}  # slot -> Response
        self._free = list(range(capacity))

    def outgoing(self, requests, rank):
        """What this rank says of its pending `requests` this cycle: the messages to announce in
        full (new names, or arguments that changed) and the slots of the rest."""
        announce, slots = [], []
        for request in requests:
            if request.state == CACHED and self._name_of(request.slot) != request.name:
                request.state = ANNOUNCED  # evicted since: the others hold its message already
            if request.state == NEW:
                request.slot = self.slot_for(request.message, rank)
                if request.slot is None:
                    announce.append(request.message)
                    request.state = ANNOUNCED
                else:
                    request.state = CACHED
            if request.state == CACHED:
                slots.append(request.slot)
        return announce, slots

    def __contains__(self, name):
        return name in self._slots

    def entry(self, slot):
        return self._entries[slot]

    def cached(self, name, messages):
        """The cached Response for `name` when these are its very messages (all of them came as
        cache bits), else None."""
        slot = self._slots.get(name)
        if slot is None:
            return None
        response = self._entries[slot]
        return response if all(m is c for m, c in zip(messages, response.messages, strict=True)) else None

    def remember(self, response):
        """An agreed response, to be reused when its name comes again as cache bits."""
        if response.name in self._slots:
            self.touch(response.name)
        elif self.capacity:
            if not self._free:
                self._evict(next(iter(self._slots)))
            slot = min(self._free)
            self._free.remove(slot)
            self._slots[response.name] = slot
            self._entries[slot] = response

    def forget_announced(self, name):
        """A rank announced `name` in full although it is cached: its arguments changed there."""
        if name in self._slots:
            self._evict(name)

    def touch(self, name):
        self._slots.move_to_end(name)

    def slot_for(self, message, rank):
        """The slot that stands for this rank's message, if it is cached exactly as it is."""
        slot = self._slots.get(message.name)
        if slot is not None and self._entries[slot].messages[rank] == message:
            return slot
        return None

    def _name_of(self, slot):
        entry = self._entries.get(slot)
        return entry.name if entry else None

    def _evict(self, name):
        slot = self._slots.pop(name)
        del self._entries[slot]
        self._free.append(slot)
