#!/bin/bash
@@SBATCH@@
#
# A study of `search` on this SLURM allocation, written by:
#   @@COMMAND@@
# Submit this file again (sbatch @@SELF@@) to continue the study where it stopped.
# Ray lives in a folder and on ports of this job's own; the script stops it by pid.
set -u
: "${SLURM_JOB_ID:?is not set: submit this script with sbatch, it is a SLURM batch job}"
cd @@WORKDIR@@ || exit 2
PY=@@PYTHON@@
RAY=@@RAY@@
STUDY_RUN=(@@RUN@@)
REQUEUE=@@REQUEUE@@
DRIVER="" HEAD="" WORKERS="" LIMIT=0 STATUS=143
RAY_TMP="${TMPDIR:-/tmp}/search-ray-${SLURM_JOB_ID}"
OTHERS=$((${SLURM_JOB_NUM_NODES:-1} - 1))

say() { echo "search slurm: $*" >&2; }
on_limit() {
    LIMIT=1
    say "the time limit is near: stopping the study as SIGTERM does"
    [ -z "$DRIVER" ] || kill -TERM "$DRIVER" 2>/dev/null
}
on_term() {
    say "SIGTERM (scancel, preemption): stopping the study"
    [ -z "$DRIVER" ] || kill -TERM "$DRIVER" 2>/dev/null
}
trap on_limit USR1
trap on_term TERM

# The job's own token: drivers and nodes of this Ray need it; no file is written.
export RAY_AUTH_MODE=token
RAY_AUTH_TOKEN="$("$PY" -c 'import secrets; print(secrets.token_hex(32))')"
export RAY_AUTH_TOKEN
# The trials at the job's own priority, not Ray's default 15 nicer (a node SLURM shares with
# other jobs would starve them), as a run's local Ray does (search/compute/cluster.py).
export RAY_worker_niceness=0
# Every port the kernel's pick (0), but the client server's, which Ray wants named.
CLIENT_PORT="$("$PY" -c 'import socket; s = socket.socket(); s.bind(("", 0)); print(s.getsockname()[1])')"
PORTS=(--node-manager-port=0 --object-manager-port=0 --dashboard-agent-listen-port=0
    --dashboard-agent-grpc-port=0 --runtime-env-agent-port=0 --metrics-export-port=0
    --min-worker-port=0 --max-worker-port=0)
# What SLURM gave this node: its CPUs, its GPUs (CUDA_VISIBLE_DEVICES names them), its memory.
node_resources() {
    echo "--num-cpus=${SLURM_CPUS_ON_NODE:-1} --num-gpus=${SLURM_GPUS_ON_NODE:-0}"
    if [ -n "${SLURM_MEM_PER_NODE:-}" ]; then
        echo "--memory=$((SLURM_MEM_PER_NODE * 1048576 * 7 / 10))"
        echo "--object-store-memory=$((SLURM_MEM_PER_NODE * 1048576 * 3 / 10))"
    fi
}

rm -rf "$RAY_TMP"  # what an earlier start of this job (requeued) left
# shellcheck disable=SC2046
"$RAY" start --head --block --disable-usage-stats --include-dashboard=false \
    --temp-dir="$RAY_TMP" --port=0 --ray-client-server-port="$CLIENT_PORT" "${PORTS[@]}" \
    $(node_resources) &
HEAD=$!
until [ -s "$RAY_TMP/ray_current_cluster" ]; do
    if ! kill -0 "$HEAD" 2>/dev/null; then
        say "Ray's head did not start (its lines are above); the study was not touched"
        exit 1
    fi
    sleep 1
done
ADDRESS="$(cat "$RAY_TMP/ray_current_cluster")"
say "Ray's head at $ADDRESS on ${SLURMD_NODENAME:-$(hostname)}, $OTHERS worker node(s)"
if [ "$OTHERS" -gt 0 ]; then
    # shellcheck disable=SC2016
    srun --overlap --nodes="$OTHERS" --ntasks="$OTHERS" --ntasks-per-node=1 \
        --exclude="$SLURMD_NODENAME" bash -c '"$0" start --block --disable-usage-stats \
        --address="$1" --temp-dir="$2" "${@:3}" --num-cpus="${SLURM_CPUS_ON_NODE:-1}" \
        --num-gpus="${SLURM_GPUS_ON_NODE:-0}"' "$RAY" "$ADDRESS" "$RAY_TMP" "${PORTS[@]}" &
    WORKERS=$!
fi

if [ "$LIMIT" = 0 ]; then
    "${STUDY_RUN[@]}" --address="$ADDRESS" &
    DRIVER=$!
    while :; do  # a trap ends `wait` early: wait again until the driver is gone
        wait "$DRIVER"
        STATUS=$?
        kill -0 "$DRIVER" 2>/dev/null || break
    done
    wait "$DRIVER" 2>/dev/null && STATUS=0 || { s=$?; [ "$s" -eq 127 ] || STATUS=$s; }
fi

# Stop this job's Ray, by pid (`ray stop` would end every Ray on the node).
for pid in $WORKERS $HEAD; do kill -TERM "$pid" 2>/dev/null; done
for pid in $WORKERS $HEAD; do wait "$pid" 2>/dev/null; done
if [ "$OTHERS" -gt 0 ]; then
    srun --overlap --nodes="$OTHERS" --ntasks="$OTHERS" --ntasks-per-node=1 \
        --exclude="$SLURMD_NODENAME" rm -rf "$RAY_TMP"
fi
rm -rf "$RAY_TMP"

if [ "$LIMIT" = 1 ] && [ "$STATUS" -ne 0 ]; then
    if [ "$REQUEUE" = 1 ]; then
        say "requeued: the job's next start continues the study"
        scontrol requeue "$SLURM_JOB_ID"
    else
        say "stopped for the time limit: sbatch @@SELF@@ continues the study"
    fi
fi
exit "$STATUS"
