"""Filling a fusion buffer from a group's inputs, on the host or the GPU alike."""

from ringreduce.numerics import reduction


def pack(buf, offsets, requests, op, copy_scaled):
    """Fill a fusion buffer: request i's input at [offsets[i], offsets[i + 1]) through
    copy_scaled(input, piece shaped like it), or the op's identity where a joined rank has none."""
    for index, request in enumerate(requests):
        piece = buf[offsets[index]:offsets[index + 1]]
        if request is None:
            piece.fill(reduction.identity(op, buf.dtype))
        else:
            copy_scaled(request.input, piece.reshape(request.message.shape))
