#!/bin/sh
# Undo up.sh and slurm_up.sh: stop Slurm's daemons and the two sshds, remove the namespaces and the marked configuration blocks.
state=${RR_CLUSTER_DIR:-/tmp/ringreduce-cluster}
for daemon in slurmd slurmctld; do  # slurm_up.sh's, found by their configuration
    pkill -f "$daemon -f $state/slurm/slurm.conf" 2>/dev/null
done
for _ in 1 2 3 4 5 6 7 8 9 10; do  # until they have exited, or slurmctld may write its state while it is removed
    pgrep -f "$state/slurm/slurm.conf" >/dev/null || break
    sleep 0.5
done
for host in a b; do
    [ -f "$state/sshd_$host.pid" ] && kill "$(cat "$state/sshd_$host.pid")" 2>/dev/null
done
ip netns del rr-hosta 2>/dev/null
ip netns del rr-hostb 2>/dev/null
sed -i '/# ringreduce-test-cluster$/d' /etc/hosts 2>/dev/null
[ -f /root/.ssh/config ] && sed -i '/# ringreduce-test-cluster begin/,/# ringreduce-test-cluster end/d' /root/.ssh/config
rm -rf "$state"
true
