"""Alltoall by pairwise exchange: at step s each rank sends to rank+s and receives from
rank-s, so every step is a perfect matching and no rank is the hot spot."""


def alltoallv(transport, send, send_offsets, recv, recv_offsets):
    """Block j of `send` goes to rank j; block j of `recv` comes from rank j."""
    n, rank = transport.size, transport.rank
    recv[recv_offsets[rank]:recv_offsets[rank + 1]] = send[send_offsets[rank]:send_offsets[rank + 1]]
    for step in range(1, n):
        dest, source = (rank + step) % n, (rank - step) % n
        transport.sendrecv(
            send[send_offsets[dest]:send_offsets[dest + 1]], dest,
            recv[recv_offsets[source]:recv_offsets[source + 1]], source,
        )
