"""Planning a job: the cost model's calibration probe, its profile on disk, `explain`, the cluster simulator."""
