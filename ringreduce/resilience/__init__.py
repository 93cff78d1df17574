"""Jobs that outlive a failure: the elastic commit store, preemption notices, the rank's end of rrun's link."""
