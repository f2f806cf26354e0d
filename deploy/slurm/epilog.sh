#!/bin/bash
# Slurm Epilog (slurm.conf: Epilog=/etc/slurm/summaryd-epilog.sh): drain the job's relay on this node. SIGTERM
# makes it finish the batches in flight upstream (within SUMMARYD_SHUTDOWN_TIMEOUT) and exit; it keeps nothing,
# and the ranks' clients kept every batch until the owner acknowledged it, so nothing is lost even if it is
# killed at the deadline.
set -u
RUN_DIR=/run/summaryd
ENV_FILE=/etc/summaryd/relay.env
job=${SLURM_JOB_ID:?the epilog runs for a job}
pid_file="$RUN_DIR/relay-$job.pid"
[ -s "$pid_file" ] || exit 0
# shellcheck source=relay.env
. "$ENV_FILE"
pid=$(cat "$pid_file")
deadline=$((${SUMMARYD_SHUTDOWN_TIMEOUT%.*} + 5))
if kill -TERM "$pid" 2>/dev/null; then
    for _ in $(seq $((deadline * 5))); do
        kill -0 "$pid" 2>/dev/null || break
        sleep 0.2
    done
    kill -KILL "$pid" 2>/dev/null
fi
rm -f "$pid_file" "$RUN_DIR/relay-$job.port"
exit 0
