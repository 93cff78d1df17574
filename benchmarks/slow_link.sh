#!/bin/sh
# benchmarks/communication.py across the two-host test cluster (`make cluster`), with the link
# between the hosts limited to RATE by the kernel's traffic shaper: tc's tbf on each host's end
# (this kernel has no netem: the link is slow by rate, not by delay). Needs root; the shaping is
# removed at the end. The hosts share this machine's cores, so each rank gets one thread (rrun
# would give each "host" all of them), and the job uses MPICH's OFI module (see tests/support/launch.py).
# Usage: slow_link.sh [RATE [LABEL]]   e.g. slow_link.sh 1gbit "1 Gbit/s"
set -eu
rate=${1:-1gbit}
label=${2:-1 Gbit/s}
python=${PYTHON:-python3}
unshape() {
    for host in a b; do ip netns exec rr-host$host tc qdisc del dev rrnet0 root 2>/dev/null || true; done
}
trap unshape EXIT
for host in a b; do
    ip netns exec rr-host$host tc qdisc replace dev rrnet0 root tbf rate "$rate" burst 256kb latency 50ms
done
ip netns exec rr-hosta unshare --uts sh -c 'hostname hosta && exec "$0" "$@"' \
    env OMP_NUM_THREADS=1 MPIR_CVAR_CH4_NETMOD=ofi \
    "$python" -m ringreduce.launcher -x OMP_NUM_THREADS -H hosta:1,hostb:1 \
    "$python" benchmarks/communication.py --link "$label"
