"""The inputs of the multi-process tests: the workers compute with them, the tests compute
the numpy reference from them, so both sides see the same arrays for every rank."""

import numpy as np

DTYPES = ("bool", "uint8", "int8", "uint16", "int16", "int32", "int64", "float16", "float32", "float64")
OPS = ("Sum", "Average", "Min", "Max", "Product")
BOOL_OPS = ("Min", "Max", "Product")


def lengths(size):
    """0, 1, fewer elements than ranks, lengths that do not divide, and one that needs pieces."""
    return sorted({0, 1, max(size - 1, 0), 7, 1001, 50_003})


def allreduce_cases(size):
    for dtype in DTYPES:
        for op in BOOL_OPS if dtype == "bool" else OPS:
            for length in lengths(size):
                yield f"allreduce-{dtype}-{op}-{length}", dtype, op, length


def ends(size):
    """A process set of the first and the last rank (at 2 ranks, whose set that is, the last alone)."""
    return [0, size - 1] if size > 2 else [size - 1]


def values(rank, dtype, length, salt=0, magnitude=3):
    """Small whole numbers (bools for bool), so every sum and product is exact in any order
    of reduction and the comparison with numpy can be exact, to the last element."""
    rng = np.random.default_rng(1_000_003 * rank + 7919 * length + salt)
    if dtype == "bool":
        return rng.random(length) < 0.7
    low = 0 if dtype.startswith("uint") else -magnitude
    return rng.integers(low, magnitude + 1, size=length).astype(dtype)


def case_input(rank, dtype, op, length):
    """A rank's input to an allreduce case: for Product, powers of two (and 0, -1, 1), whose products
    over 8 ranks are still exact in float16 (3**8 is not)."""
    return values(rank, dtype, length, magnitude=2 if op == "Product" else 3)


def normal(rank, dtype, length):
    """Random reals, for checking that arbitrary values come out close to numpy's."""
    return np.random.default_rng([rank, length]).standard_normal(length).astype(dtype)


def reference_reduce(arrays, op):
    """The reduction as numpy computes it, in the arrays' own dtype."""
    stacked = np.stack(arrays)
    dtype = stacked.dtype
    if op in ("Sum", "Average"):
        total = np.add.reduce(stacked, axis=0, dtype=dtype)
        return total if op == "Sum" else average(total, len(arrays))
    ufunc = {"Min": np.minimum, "Max": np.maximum, "Product": np.multiply}[op]
    return ufunc.reduce(stacked, axis=0, dtype=dtype)


def average(total, size):
    """Average from the sum, as Horovod computes it: integers truncated toward zero, floats
    multiplied by 1 / size once, float16 and float32 in float32."""
    if np.issubdtype(total.dtype, np.integer):
        return np.sign(total) * (np.abs(total) // size)
    single = total.dtype.itemsize <= 4
    wide = total.astype(np.float32) * np.float32(1 / size) if single else total * (1 / size)
    return wide.astype(total.dtype)


# A fused group as a training step submits it: several lengths, averaged together, most in place.
FUSED_LENGTHS = (1, 7, 1001, 50_003, 3, 20_000)


def fused_input(rank, index):
    return values(rank, "int64", FUSED_LENGTHS[index], salt=index)


def stress_specs(count=300):
    """(name, dtype, shape, op) of many tensors of mixed sizes and dtypes, the same on every rank."""
    rng = np.random.default_rng(2024)
    specs = []
    for index in range(count):
        dtype = str(rng.choice([d for d in DTYPES if d != "bool"]))
        shape = tuple(int(d) for d in rng.integers(1, 6, size=rng.integers(1, 4)))
        if index % 50 == 0:
            shape = (int(rng.integers(20_000, 60_000)),)  # a few large ones among the small
        op = str(rng.choice(OPS))
        specs.append((f"stress.{index}", dtype, shape, op))
    return specs


def stress_input(rank, index, dtype, shape):
    length = int(np.prod(shape))
    return values(rank, dtype, length, salt=index).reshape(shape)


# The gradient tests of the framework bindings: rank r contributes contribution(r), and its loss is
# sum(weights(r, n) * result) for each collective's result of n values.
def contribution(rank):
    return np.arange(6, dtype=np.float32) * (rank + 1) + rank


def weights(rank, count=6):
    return np.arange(count, dtype=np.float32) + 10 * rank


def splits(rank, size):
    """Rows of its 6 that rank `rank` sends to each rank in the alltoall tests."""
    even = [6 // size + (i < 6 % size) for i in range(size)]
    return even[rank % size:] + even[:rank % size]


def scattered_rows(rank, size, total=6):
    """The rows of `total` that reducescatter leaves to `rank` (the first ranks one more)."""
    counts = [total // size + (i < total % size) for i in range(size)]
    start = sum(counts[:rank])
    return slice(start, start + counts[rank])


def equal_split_contribution(rank, size):
    """An alltoall without splits: rank r sends r + 1 rows to every rank."""
    return np.repeat(np.arange(size, dtype=np.float32), rank + 1) + rank


def expected_gradients(rank, size):
    """The gradient, by Horovod's rules, of every rank's loss with respect to rank `rank`'s
    contribution through each collective of the gradient tests (and the alltoall's received
    rows): allgather and broadcast average the gradient over the ranks, a Sum reducescatter
    scales the allgathered gradient by the size (ringreduce.training.gradients)."""
    all_w = sum(weights(r) for r in range(size))
    gathered = sum(r + 1 for r in range(size))
    start = sum(r + 1 for r in range(rank))
    received = [[splits(k, size)[j] for k in range(size)] for j in range(size)]  # rows j gets from each k
    mine = splits(rank, size)
    # Rank `rank`'s block j went to rank j, after the blocks of the ranks before it there.
    blocks = [weights(j, sum(received[j]))[sum(received[j][:rank]):sum(received[j][:rank]) + mine[j]]
              for j in range(size)]
    return {
        "allreduce-sum": all_w,
        "allreduce-average": all_w / size,
        "allgather": sum(weights(r, gathered) for r in range(size))[start:start + rank + 1] / size,
        "broadcast": all_w / size if rank == size - 1 else np.zeros(6, np.float32),
        "reducescatter": size * np.concatenate([weights(r)[:len(range(6)[scattered_rows(r, size)])]
                                                for r in range(size)]),
        "alltoall": np.concatenate(blocks),
        # Rank j receives k + 1 rows from each rank k, in rank order.
        "alltoall-equal": np.concatenate([weights(j, gathered)[start:start + rank + 1] for j in range(size)]),
        "alltoall-received": received[rank],
        "grouped": np.stack([all_w, 2 * all_w]),
    }


def process_set_layout(size):
    """The process sets of the process-set tests: (given to init, added after init), each
    {name: ranks as given}. One set is every rank, reversed (the global set, as in Horovod);
    they overlap, and one has a single rank."""
    at_init = {"everyone": list(reversed(range(size))), "evens": list(range(0, size, 2))}
    added = {"alone": [size - 1]}
    if size > 2:
        at_init["pair"] = [1, 0]
        added = {"tail": list(range(1, size)), **added}
    if size == 4:  # on the two-host cluster: pair inside hosta, last-two inside hostb, the rest across
        added["last-two"] = [2, 3]
    return at_init, added


def expected_topology(size, hosts):
    """[rank, size, local_rank, local_size, cross_rank, cross_size] of every rank, for ranks split
    into `hosts` consecutive groups, the first ones one rank larger."""
    per_host = [size // hosts + (h < size % hosts) for h in range(hosts)]
    host_of = [h for h, n in enumerate(per_host) for _ in range(n)]
    rows = []
    for rank in range(size):
        local_rank = host_of[:rank].count(host_of[rank])
        same_local_rank = [h for h, n in enumerate(per_host) if n > local_rank]
        rows.append([rank, size, local_rank, per_host[host_of[rank]],
                     same_local_rank.index(host_of[rank]), len(same_local_rank)])
    return rows


def mixed_magnitudes(rank, length, salt=0):
    """Float32 reals of magnitudes 1e-6 to 1e6: where their sum rounds depends on the order in
    which the ranks' values are added."""
    rng = np.random.default_rng([rank, length, salt, 17])
    return (rng.standard_normal(length) * 10.0 ** rng.integers(-6, 7, length)).astype(np.float32)


def rank_order_sum(arrays):
    """The arrays added in rank order, element by element, in their dtype: what every float sum
    gives under RINGREDUCE_DETERMINISTIC."""
    total = arrays[0].copy()
    for array in arrays[1:]:
        np.add(total, array, out=total)
    return total
