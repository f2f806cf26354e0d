#!/bin/bash
# Slurm Prolog (slurm.conf: Prolog=/etc/slurm/summaryd-prolog.sh, PrologFlags=Alloc): on each node of a job,
# start a relay for the job's ranks before they run. It listens on loopback on a port of its own (the job's
# TaskProlog, deploy/slurm/task_prolog.sh, gives the ranks its address) and forwards their sessions to the
# owners in /etc/summaryd/relay.env. A relay that does not come up fails nothing: the TaskProlog then sends
# the ranks straight to the owners.
set -u
RUN_DIR=/run/summaryd
ENV_FILE=/etc/summaryd/relay.env
RELAY_USER=summaryd
SUMMARYD=/opt/summaryd/bin/summaryd
job=${SLURM_JOB_ID:?the prolog runs for a job}

mkdir -p "$RUN_DIR"
chown "$RELAY_USER" "$RUN_DIR"
port_file="$RUN_DIR/relay-$job.port"
rm -f "$port_file"
set -a
# shellcheck source=relay.env
. "$ENV_FILE"
set +a
# Port 0: the relay picks a free one and writes it to the port file, so jobs sharing a node never collide.
setsid runuser -u "$RELAY_USER" -- "$SUMMARYD" serve --listen 127.0.0.1:0 --port-file "$port_file" \
    --log-format json </dev/null >>"$RUN_DIR/relay-$job.log" 2>&1 &
echo $! >"$RUN_DIR/relay-$job.pid"
for _ in $(seq 50); do
    [ -s "$port_file" ] && exit 0
    sleep 0.2
done
echo "summaryd relay of job $job did not start; its ranks go straight upstream" >&2
exit 0
