"""Planning a job before it runs: the cluster simulator."""
