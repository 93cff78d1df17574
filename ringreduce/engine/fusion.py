"""Which ready requests share one collective: allreduces with the same dtype, op, scaling,
compression and device are packed into one buffer up to the fusion threshold; everything else runs alone.

Every rank plans from the same ordered responses, so every rank builds the same buffers.
"""

from ringreduce.numerics import compression


def fusion_key(message):
    return (message.dtype, message.op, message.prescale, message.postscale, message.compression, message.device)


def wire_bytes(message):
    return message.count * compression.wire_dtype(message.compression, message.dtype).itemsize


def plan(responses, threshold):
    """Group responses into lists that each run as one collective, in an order every rank shares."""
    if len(responses) == 1:  # a lone call: nothing to plan
        return [responses]
    groups, open_groups = [], {}  # open_groups: key -> [responses, bytes]
    for response in responses:
        if response.error is not None or response.message.kind != "allreduce":
            groups.append([response])
            continue
        size = wire_bytes(response.message)
        if size > threshold:
            groups.append([response])
            continue
        key = fusion_key(response.message)
        group = open_groups.get(key)
        if group is not None and group[1] + size > threshold:
            groups.append(group[0])
            group = None
        if group is None:
            group = open_groups[key] = [[], 0]
        group[0].append(response)
        group[1] += size
    groups.extend(group for group, _ in open_groups.values())
    return groups
