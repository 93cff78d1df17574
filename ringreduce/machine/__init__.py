"""What talks to the machine: MPI transports, the shared-memory segment, topology, GPUs, cores, reused memory."""
