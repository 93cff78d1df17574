#!/bin/sh
# A test cluster of two hosts on this machine: network namespaces rr-hosta and rr-hostb joined by
# a veth pair (interface rrnet0 in each, 10.213.7.1 and 10.213.7.2), each with its own host name
# (a UTS namespace), its own /dev/shm and node-local directory $state/node (tmpfs in a mount
# namespace of its own, so no host reads another's), and its own sshd that accepts a key made for
# the test; on_host.sh runs a command inside a host's namespaces. Only these addresses and loopback
# are used. Needs root, iproute2, util-linux's unshare and openssh-server.
# Undo with down.sh. Prints "cluster up" when both hosts answer over ssh.
set -eu
here=$(cd "$(dirname "$0")" && pwd)
state=${RR_CLUSTER_DIR:-/tmp/ringreduce-cluster}
"$here/down.sh" >/dev/null 2>&1 || true
mkdir -p "$state" "$state/node" /run/sshd /root/.ssh
chmod 700 /root/.ssh
rm -f "$state/id" "$state/id.pub" "$state/host_key" "$state/host_key.pub"
ssh-keygen -q -t ed25519 -N "" -f "$state/id"
ssh-keygen -q -t ed25519 -N "" -f "$state/host_key"
cp "$state/id.pub" "$state/authorized_keys"

ip netns add rr-hosta
ip netns add rr-hostb
ip link add rrnet-a type veth peer name rrnet-b
ip link set rrnet-a netns rr-hosta
ip link set rrnet-b netns rr-hostb
for pair in "a 10.213.7.1" "b 10.213.7.2"; do
    set -- $pair
    ip netns exec rr-host$1 ip link set rrnet-$1 name rrnet0
    ip netns exec rr-host$1 ip addr add $2/24 dev rrnet0
    ip netns exec rr-host$1 ip link set rrnet0 up
    ip netns exec rr-host$1 ip link set lo up
    cat > "$state/sshd_config_$1" <<CONFIG
ListenAddress $2
HostKey $state/host_key
PidFile $state/sshd_$1.pid
AuthorizedKeysFile $state/authorized_keys
PermitRootLogin prohibit-password
PasswordAuthentication no
KbdInteractiveAuthentication no
UsePAM no
StrictModes no
AcceptEnv *
CONFIG
    ip netns exec rr-host$1 unshare --uts --mount --propagation private sh -c "hostname host$1 &&
        mount -t tmpfs -o size=2g tmpfs /dev/shm && mount -t tmpfs -o size=2g tmpfs $state/node &&
        exec /usr/sbin/sshd -f $state/sshd_config_$1"
done

# Names for the two hosts, and how ssh reaches them, in marked blocks that down.sh removes.
printf '10.213.7.1 hosta # ringreduce-test-cluster\n10.213.7.2 hostb # ringreduce-test-cluster\n' >> /etc/hosts
cat >> /root/.ssh/config <<CONFIG
# ringreduce-test-cluster begin
Host hosta hostb 10.213.7.1 10.213.7.2
    IdentityFile $state/id
    StrictHostKeyChecking no
    UserKnownHostsFile /dev/null
    LogLevel ERROR
# ringreduce-test-cluster end
CONFIG
for host in hosta hostb; do
    ip netns exec rr-hosta ssh -o BatchMode=yes -o ConnectTimeout=5 $host true
done
echo "cluster up"
