"""The out-of-step check of plain calls in program order (ringreduce/engine/plain_calls.py), fed a
peer's packet by hand: both ranks' calls and where they were made."""

import pytest


def test_calls_out_of_step_are_named_with_each_ranks_call_and_where_it_was_made():
    """Pure logic of the check (no MPI): a peer whose packet is of another call number."""
    import pickle

    from ringreduce.engine import plain_calls
    from ringreduce.engine.agreement import Message
    from ringreduce.errors import MismatchError

    mine = Message(name="grad.3", kind="allreduce", dtype="float32", shape=(4,), site="train.py:40")
    theirs = pickle.dumps(Message(name="loss", kind="allreduce", dtype="float32", shape=(1,), site="train.py:52"))
    buffer = bytearray(plain_calls._PREFIX.size) + theirs
    packet = plain_calls._Packet(peer=1, flags=0, length=len(theirs), rows=0, calls=7, waited=0.0, buffer=buffer)
    order = object.__new__(plain_calls.PlainCalls)
    order.ranks, order.me, order.where = [0, 1], 0, ""
    with pytest.raises(MismatchError) as raised:
        order._check(mine, pickle.dumps(mine), [packet], number=6)
    assert str(raised.value).startswith(
        "plain calls are out of step: this is call 7 in program order on rank 0, allreduce 'grad.3' (train.py:40), "
        "but call 8 on rank 1, allreduce 'loss' (train.py:52)")



def test_a_call_cut_short_on_the_callers_thread_fails_every_later_plain_call():
    """A large call the caller ran after the meeting and that raised leaves the ranks' algorithms
    out of step: later plain calls on that set fail at once, naming it, and pair with nothing."""
    import types

    import numpy as np

    from ringreduce.engine import plain_calls
    from ringreduce.engine.agreement import Message
    from ringreduce.errors import RingReduceError

    def run(responses, requests):
        raise MemoryError("no room for the result")

    order = object.__new__(plain_calls.PlainCalls)
    order.ranks, order.me, order.size, order.where, order._broken = [0, 1], 0, 2, "", None
    order.engine = types.SimpleNamespace(failure=None, caller_executor=types.SimpleNamespace(run=run))
    message = Message(name="grad", kind="allreduce", dtype="float32", shape=(1 << 20,))
    plan = types.SimpleNamespace(ragged=False)
    with pytest.raises(MemoryError):
        order._execute(message, plan, [], np.ones(1 << 20, np.float32), None)
    with pytest.raises(RingReduceError, match=r"^plain calls no longer pair up in program order on rank 0: an "
                                              r"earlier one failed here \(MemoryError: no room for the result\)"):
        order.run(message, np.ones(1 << 20, np.float32), None)
