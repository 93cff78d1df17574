"""The recycler of large results: a block goes out again only once nothing refers to it, and
then the smallest one that fits without wasting more than half of it."""

import numpy as np

from ringreduce.machine.memory import Recycler

MIB = 1 << 20


def _block_of(array):
    return array.base if array.base is not None else array


def test_a_block_in_use_is_never_handed_out_again():
    recycler = Recycler()
    first = recycler.empty((MIB // 4,), np.float32)
    view = first[10:20]
    del first
    second = recycler.empty((MIB // 4,), np.float32)
    assert not np.shares_memory(second, view)  # the view still holds the first block


def test_the_smallest_free_block_that_fits_is_reused():
    recycler = Recycler()
    large = recycler.empty((3 * MIB,), np.uint8)
    small = recycler.empty((2 * MIB,), np.uint8)
    large_block, small_block = _block_of(large).ctypes.data, _block_of(small).ctypes.data
    del large, small
    again = recycler.empty((MIB + 1,), np.uint8)  # both fit within twice its size: the smaller one
    assert again.ctypes.data == small_block
    other = recycler.empty((MIB + 2,), np.float32)  # 4 MiB and more: neither fits
    assert other.ctypes.data not in (small_block, large_block)
    assert other.shape == (MIB + 2,) and other.dtype == np.float32


def test_a_block_more_than_twice_the_size_is_left_for_larger_results():
    recycler = Recycler()
    big = recycler.empty((8 * MIB,), np.uint8)
    big_block = big.ctypes.data
    del big
    assert recycler.empty((2 * MIB,), np.uint8).ctypes.data != big_block
    assert recycler.empty((5 * MIB,), np.uint8).ctypes.data == big_block


def test_small_results_are_numpys_own_arrays_not_views_of_a_block():
    recycler = Recycler()
    small = recycler.empty((Recycler.MIN_BYTES // 8 - 1,), np.float64)
    assert small.shape == (Recycler.MIN_BYTES // 8 - 1,) and small.dtype == np.float64 and small.base is None
    large = recycler.empty((Recycler.MIN_BYTES // 8,), np.float64)
    assert large.base is not None  # from here on, a view of a recycled block
