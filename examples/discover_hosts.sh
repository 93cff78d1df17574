#!/bin/sh
# A host discovery script for rrun --host-discovery-script: prints the hosts a job may use, one
# host:slots a line. Here: the lines of the file $HOSTS if set, else this machine with 2 slots. On a
# cluster it would ask the scheduler or the cloud which nodes are up.
if [ -n "$HOSTS" ]; then cat "$HOSTS"; else echo localhost:2; fi
