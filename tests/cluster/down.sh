#!/bin/sh
# Undo up.sh: stop the two sshds, remove the namespaces and the marked configuration blocks.
state=${RR_CLUSTER_DIR:-/tmp/ringreduce-cluster}
for host in a b; do
    [ -f "$state/sshd_$host.pid" ] && kill "$(cat "$state/sshd_$host.pid")" 2>/dev/null
done
ip netns del rr-hosta 2>/dev/null
ip netns del rr-hostb 2>/dev/null
sed -i '/# ringreduce-test-cluster$/d' /etc/hosts 2>/dev/null
[ -f /root/.ssh/config ] && sed -i '/# ringreduce-test-cluster begin/,/# ringreduce-test-cluster end/d' /root/.ssh/config
rm -rf "$state"
true
