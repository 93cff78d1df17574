"""Prints on both streams, including a last line without a newline, for the output tests."""

import sys

import ringreduce as rr

rr.init()
print(f"hello from {rr.rank()} of {rr.size()}")
print("second line")
sys.stderr.write(f"warning from {rr.rank()}\n")
sys.stdout.write("no newline at the end")
