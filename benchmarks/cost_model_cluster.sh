#!/bin/sh
# The cost model against measurement across the two-host test cluster (`make cluster`), its link
# limited to RATE by tc's tbf on each host's end (this kernel has no netem). The probe runs first,
# on 2 ranks per host (`rrun --calibrate`: both link classes); then benchmarks/cost_model.py
# measures held-out cases on 1 and on 2 ranks per host against that profile; last, the simulator's
# training step (benchmarks/simulated_step.py) on 1 rank per host, probed on that layout. Needs root.
# The bucket holds BURST bytes: a message smaller than it passes at the veth's speed, not at the
# rate. 256 KB: with 16 KB MPICH's TCP transfers lose a quarter of the rate (docs/cost_model.md).
# Usage: cost_model_cluster.sh RATE BURST LABEL MAX_BYTES  e.g. cost_model_cluster.sh 1gbit 256kb "1 Gbit/s" 268435456
set -eu
rate=$1
burst=$2
label=$3
max_bytes=$4
python=${PYTHON:-python3}
profile=/tmp/ringreduce-cost-model-$rate.json
unshape() {
    for host in a b; do ip netns exec rr-host$host tc qdisc del dev rrnet0 root 2>/dev/null || true; done
}
trap unshape EXIT
for host in a b; do
    ip netns exec rr-host$host tc qdisc replace dev rrnet0 root tbf rate "$rate" burst "$burst" latency 50ms
done
on_hosta() {
    tests/cluster/on_host.sh a env MPIR_CVAR_CH4_NETMOD=ofi OMP_NUM_THREADS=1 \
        "$python" -m ringreduce.launcher -x OMP_NUM_THREADS --network-interface rrnet0 "$@"
}
on_hosta -H hosta:2,hostb:2 --calibrate --profile "$profile"
for hosts in hosta:1,hostb:1 hosta:2,hostb:2; do
    on_hosta -H "$hosts" "$python" "$PWD/benchmarks/cost_model.py" --profile "$profile" --rounds 1 \
        --max-bytes "$max_bytes" --label "two hosts, $label"
done
on_hosta -H hosta:1,hostb:1 --calibrate --profile "$profile.1x1"
on_hosta -H hosta:1,hostb:1 "$python" "$PWD/benchmarks/simulated_step.py" --profile "$profile.1x1" \
    --label "two hosts, $label"
