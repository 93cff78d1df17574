#!/bin/sh
# Run a command on host a or b of the test cluster (up.sh): inside the namespaces of that host's
# sshd (network, host name, mount: its own /dev/shm and node directory), as a login there would be.
# Usage: on_host.sh a|b COMMAND [ARGS...]
state=${RR_CLUSTER_DIR:-/tmp/ringreduce-cluster}
host=$1
shift
exec nsenter --target "$(cat "$state/sshd_$host.pid")" --net --uts --mount -- "$@"
