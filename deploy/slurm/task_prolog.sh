#!/bin/bash
# Slurm TaskProlog (slurm.conf: TaskProlog=/etc/slurm/summaryd-task-prolog.sh): each line `export NAME=VALUE`
# it prints is set in the task's environment. The ranks log to their node's relay, else to the owners.
port_file=/run/summaryd/relay-${SLURM_JOB_ID}.port
if [ -s "$port_file" ]; then
    echo "export SUMMARYD_ADDRESS=127.0.0.1:$(cat "$port_file")"
else
    # shellcheck source=relay.env
    . /etc/summaryd/relay.env
    echo "export SUMMARYD_ADDRESS=$SUMMARYD_UPSTREAM"
fi
