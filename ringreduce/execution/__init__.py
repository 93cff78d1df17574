"""Execution: turns an agreed group of requests into calls of an algorithm family, on the host
(numpy) or on the GPU (CuPy): packing or reading in place, compression, scaling, results."""
