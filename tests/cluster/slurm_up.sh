#!/bin/sh
# Slurm on the two-host test cluster of up.sh (run that first): munge, slurmctld on hosta and one
# slurmd per host. Each slurmd runs in its host's namespaces (those of up.sh's sshd there), so it is
# that node: its tasks share the host's own /dev/shm with what ssh starts there, never the machine's
# (MPICH names its segments after the Slurm job, and a killed job's segments would otherwise meet
# the same job id after the cluster restarts). A mount namespace of its own below that holds the
# cgroup v1 hierarchies slurmd looks for (proctrack/linuxproc, and task/affinity, which binds tasks
# with sched_setaffinity, use none of them). The configuration lives in the cluster's state folder: commands find it through SLURM_CONF (tests/launch.py sets it).
# Needs root and Debian's slurmctld, slurmd, slurm-client, munge and libpmix-dev (srun --mpi=pmix loads libpmix.so). Prints "slurm up".
set -eu
state=${RR_CLUSTER_DIR:-/tmp/ringreduce-cluster}/slurm
mkdir -p "$state/ctld" /run/munge /var/log/munge /var/lib/munge
chown munge:munge /run/munge /var/log/munge /var/lib/munge
[ -f /etc/munge/munge.key ] || (dd if=/dev/urandom bs=1 count=1024 of=/etc/munge/munge.key 2>/dev/null &&
                                chown munge:munge /etc/munge/munge.key && chmod 400 /etc/munge/munge.key)
pgrep -x munged >/dev/null || runuser -u munge -- /usr/sbin/munged
# Each node as a two-socket GPU node in small: socket 0 is CPU 0, socket 1 is CPU 1, and four GPUs as
# generic resources, 0-1 near socket 0 and 2-3 near socket 1, backed by placeholder device files
# (character devices like /dev/null's, outside /dev so nothing takes them for NVIDIA's): Slurm
# allocates them and sets CUDA_VISIBLE_DEVICES and SLURM_GPUS_ON_NODE as it would for real ones.
# Where they sit is written as `nvidia-smi topo -m` prints it, and a placeholder nvidia-smi in
# $state/bin prints it (a job puts that folder first on PATH to have its GPU choice read it: the
# placeholders have no PCI device in sysfs, which is read first).
mkdir -p "$state/gpus" "$state/bin"
for host in hosta hostb; do
    for index in 0 1 2 3; do
        [ -e "$state/gpus/$host-$index" ] || mknod "$state/gpus/$host-$index" c 1 3
    done
done
cat > "$state/gres.conf" <<GRES
AutoDetect=off
NodeName=hosta Name=gpu File=$state/gpus/hosta-[0-1] Cores=0
NodeName=hosta Name=gpu File=$state/gpus/hosta-[2-3] Cores=1
NodeName=hostb Name=gpu File=$state/gpus/hostb-[0-1] Cores=0
NodeName=hostb Name=gpu File=$state/gpus/hostb-[2-3] Cores=1
GRES
tab=$(printf '\t')
cat > "$state/topology.txt" <<TOPOLOGY
${tab}GPU0${tab}GPU1${tab}GPU2${tab}GPU3${tab}CPU Affinity${tab}NUMA Affinity${tab}GPU NUMA ID
GPU0${tab} X ${tab}NV4${tab}SYS${tab}SYS${tab}0${tab}0${tab}${tab}N/A
GPU1${tab}NV4${tab} X ${tab}SYS${tab}SYS${tab}0${tab}0${tab}${tab}N/A
GPU2${tab}SYS${tab}SYS${tab} X ${tab}NV4${tab}1${tab}1${tab}${tab}N/A
GPU3${tab}SYS${tab}SYS${tab}NV4${tab} X ${tab}1${tab}1${tab}${tab}N/A

Legend:

  X    = Self
  SYS  = Connection traversing PCIe as well as the SMP interconnect between NUMA nodes
  NV#  = Connection traversing a bonded set of # NVLinks
TOPOLOGY
cat > "$state/bin/nvidia-smi" <<SMI
#!/bin/sh
# The test cluster's placeholder: the nodes' GPU topology for \`nvidia-smi topo -m\`, and their
# bus ids (those the emulated CuPy gives its GPUs) for --query-gpu=pci.bus_id.
case "\$*" in
    "topo -m") exec cat "$state/topology.txt" ;;
    "--query-gpu=pci.bus_id --format=csv,noheader") printf '00000000:0%d:00.0\\n' 1 2 3 4 ;;
    *) echo "placeholder nvidia-smi: only topo -m and --query-gpu=pci.bus_id" >&2; exit 1 ;;
esac
SMI
chmod 755 "$state/bin/nvidia-smi"
cat > "$state/slurm.conf" <<CONFIG
ClusterName=rrtest
SlurmctldHost=hosta(10.213.7.1)
SlurmUser=root
SlurmdUser=root
AuthType=auth/munge
CredType=cred/munge
StateSaveLocation=$state/ctld
SlurmdSpoolDir=$state/spool-%n
SlurmctldPidFile=$state/slurmctld.pid
SlurmdPidFile=$state/slurmd-%n.pid
SlurmctldLogFile=$state/slurmctld.log
SlurmdLogFile=$state/slurmd-%n.log
ProctrackType=proctrack/linuxproc
TaskPlugin=task/affinity
SelectType=select/cons_tres
SelectTypeParameters=CR_Core
MpiDefault=none
ReturnToService=2
JobCompType=jobcomp/none
GresTypes=gpu
SchedulerParameters=bf_interval=2
JobAcctGatherType=jobacct_gather/none
AccountingStorageType=accounting_storage/none
KillWait=10
InactiveLimit=0
NodeName=hosta NodeAddr=10.213.7.1 Sockets=2 CoresPerSocket=1 ThreadsPerCore=1 RealMemory=1000 Gres=gpu:4 State=UNKNOWN
NodeName=hostb NodeAddr=10.213.7.2 Sockets=2 CoresPerSocket=1 ThreadsPerCore=1 RealMemory=1000 Gres=gpu:4 State=UNKNOWN
PartitionName=test Nodes=hosta,hostb Default=YES MaxTime=INFINITE State=UP
CONFIG
printf 'CgroupPlugin=cgroup/v1\nCgroupAutomount=no\n' > "$state/cgroup.conf"
# srun --mpi=pmix (Open MPI's ranks under rrun --launcher srun) keeps a folder per step named after
# the job, which the two hosts would share in the machine's /tmp: each slurmd sees its own at $state/pmix.
printf 'PMIxCliTmpDirBase=%s\n' "$state/pmix" > "$state/mpi.conf"
mkdir -p "$state/pmix" "$state/pmix-hosta" "$state/pmix-hostb"
ip netns exec rr-hosta unshare --uts sh -c "hostname hosta && exec slurmctld -f $state/slurm.conf"
for host in a b; do
    nsenter --target "$(cat "$state/../sshd_$host.pid")" --net --uts --mount \
        unshare --mount --propagation private sh -c "mount -t tmpfs none /sys/fs/cgroup &&
        mount --bind $state/pmix-host$host $state/pmix &&
        for c in freezer cpuset memory devices cpuacct cpu pids; do
            mkdir -p /sys/fs/cgroup/\$c && mount -t cgroup -o \$c none /sys/fs/cgroup/\$c; done &&
        exec slurmd -f $state/slurm.conf"
done
for attempt in $(seq 30); do
    if SLURM_CONF=$state/slurm.conf ip netns exec rr-hosta sinfo -h -o %t | grep -qv -e unk -e down; then
        SLURM_CONF=$state/slurm.conf ip netns exec rr-hosta sinfo -h -o %T | grep -q idle && echo "slurm up" && exit 0
    fi
    sleep 1
done
echo "slurm did not come up: see $state/*.log" >&2
exit 1
