"""Binomial trees rooted at one rank: broadcast down the tree, reduce up it, and allreduce as a
reduce to rank 0 followed by a broadcast from it.

Each takes ceil(log2 n) rounds each way, so its latency grows with log n rather than with n as
the ring's does; every level carries the whole array, so it suits small arrays (where the
rounds, not the bytes, cost). Large arrays travel piece by piece so the levels work at once.
"""

from ringreduce.machine.layout import pieces


def _shape(relative, n):
    """(parent, children) of the rank `relative` places after the root, both relative too: the
    parent is `relative` without its lowest set bit, the children add each lower power of two
    (largest subtree first)."""
    if relative == 0:
        span, parent = 1, None
        while span < n:
            span *= 2
    else:
        span = relative & -relative  # the lowest set bit: the size of this rank's subtree
        parent = relative - span
    children = []
    step = span // 2
    while step >= 1:
        if relative + step < n:
            children.append(relative + step)
        step //= 2
    return parent, children


def broadcast(transport, buf, root, chunk_elems):
    n = transport.size
    parent, children = _shape((transport.rank - root) % n, n)
    children = [(child + root) % n for child in children]
    parts = pieces(buf, chunk_elems)
    receives = None if parent is None else [transport.irecv(p, (parent + root) % n) for p in parts]
    sends = []
    for index, part in enumerate(parts):
        if receives is not None:
            transport.wait([receives[index]])
        sends.extend(transport.isend(part, child) for child in children)
    transport.wait(sends)


def reduce(transport, buf, combine, scratch, chunk_elems):
    """Combine every rank's `buf` into rank 0's. Each rank adds its children's partial results in
    a fixed order (smallest subtree first), so the result does not depend on arrival times.
    `scratch` holds len(buf) elements per child."""
    parent, children = _shape(transport.rank, transport.size)
    parts = pieces(buf, chunk_elems)
    incoming = [pieces(scratch[i * len(buf):(i + 1) * len(buf)], chunk_elems) for i in range(len(children))]
    order = list(reversed(range(len(children))))
    receives = [[transport.irecv(p, children[i]) for p in incoming[i]] for i in range(len(children))]
    sends = []
    for index, part in enumerate(parts):
        for i in order:
            transport.wait([receives[i][index]])
            combine(part, incoming[i][index], out=part)
        if parent is not None:
            sends.append(transport.isend(part, parent))
    transport.wait(sends)


def allreduce(transport, buf, combine, scratch, chunk_elems, scale_result=None):
    """Reduce to rank 0, which runs `scale_result` on the result, then broadcast it from there."""
    reduce(transport, buf, combine, scratch, chunk_elems)
    if scale_result is not None and transport.rank == 0:
        scale_result(buf)
    broadcast(transport, buf, 0, chunk_elems)


def children_of(rank, size):
    """How many children `rank` has in the tree rooted at rank 0 (its scratch need)."""
    return len(_shape(rank, size)[1])
