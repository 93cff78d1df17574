"""Broadcast down a binomial tree rooted at the root rank: log2(n) rounds, and large arrays
are forwarded piece by piece so that the levels of the tree work at the same time."""

from ringreduce.machine.layout import pieces


def broadcast(transport, buf, root, chunk_elems):
    n = transport.size
    relative = (transport.rank - root) % n
    parts = pieces(buf, chunk_elems)
    if relative == 0:
        receives = None
        span = 1
        while span < n:
            span *= 2
    else:
        span = relative & -relative  # the lowest set bit: the size of this rank's subtree
        parent = (relative - span + root) % n
        receives = [transport.irecv(p, parent) for p in parts]
    children = []
    step = span // 2
    while step >= 1:
        if relative + step < n:
            children.append((relative + step + root) % n)
        step //= 2
    sends = []
    for index, part in enumerate(parts):
        if receives is not None:
            transport.wait([receives[index]])
        sends.extend(transport.isend(part, child) for child in children)
    transport.wait(sends)
