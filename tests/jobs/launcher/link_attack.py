"""A job attacked on rrun's link port while it runs (run with --heartbeat-seconds): rank 0 starts
another process that connects to the port the ranks were given and does what a stranger could:
garbage, a line that is not an object, a 10 MB line, unsigned and forged hellos, hello then
close, an unsigned done, a resumed without its fields, and a hundred silent connections. Meanwhile
both ranks allreduce and check every result; the job must end with status 0."""

import os
import subprocess
import sys
import time

import numpy as np

import ringreduce as rr

ATTACKER = r'''
import socket, sys, time
host, port = sys.argv[1].rsplit(":", 1)
def connect():
    return socket.create_connection((host, int(port)), timeout=5)
lines = [b"garbage\n", b"[1, 2]\n", b'{"kind": "done"}\n', b'{"kind": "resumed"}\n',
         b'{"kind": "hello", "rank": 1, "host": "elsewhere", "pid": 1}\n',
         b"ab" * 32 + b' {"kind": "hello", "rank": 0, "host": "elsewhere", "pid": 1}\n']
for line in lines:
    c = connect(); c.sendall(line); time.sleep(0.05); c.close()
c = connect()
try:
    for _ in range(160):
        c.sendall(b"x" * 65536)  # 10 MB without a newline
except OSError:
    pass
silent = [connect() for _ in range(100)]  # silent: before, each counted as a rank that stopped beating
time.sleep(7)
'''


def main():
    rr.init()
    attacker = None
    if rr.rank() == 0:
        attacker = subprocess.Popen([sys.executable, "-c", ATTACKER, os.environ["RRUN_LINK"]])
    deadline = time.monotonic() + 8.0  # past the heartbeat timeout and the link's AUTH_SECONDS
    steps = 0
    # Both ranks stop at the same step: each its own clock let one leave while the other waited.
    while rr.allreduce(np.array([float(time.monotonic() < deadline)]), op=rr.Min, name="going on")[0]:
        got = rr.allreduce(np.full(1000, rr.rank() + 1.0), op=rr.Sum, name="attacked")
        assert np.array_equal(got, np.full(1000, 3.0)), got[:4]
        steps += 1
        time.sleep(0.02)
    if attacker is not None:
        attacker.wait(timeout=30)
    print(f"OK after {steps} checked allreduces", flush=True)
    rr.shutdown()


if __name__ == "__main__":
    main()
