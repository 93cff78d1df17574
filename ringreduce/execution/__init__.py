"""Execution: an agreed group of requests turned into calls of an algorithm family, on numpy or CuPy arrays."""
