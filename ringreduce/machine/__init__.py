"""What talks to the machine: MPI transports, the shared-memory segment, topology discovery,
GPU probing, and the memory the core reuses."""
