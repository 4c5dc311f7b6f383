#!/bin/bash
# A 2-node torchrun job for the Slurm tests and benchmark: tests/jobs/tiny_train.py, one rank
# per node (gloo over loopback: every logical node is this host), as FIELD-NOTES recommends:
#   srun --kill-on-bad-exit=1 torchrun --nnodes=2 --nproc-per-node=1 --rdzv-backend=c10d ...
# Usage: sbatch [options] train_job.sh PYTHON TINY_TRAIN_ARGS...
set -u
py="$1"
shift
# The attempt as tiny_train counts it (its --fault-attempt reads TRAINGUARD_ATTEMPT).
export TRAINGUARD_ATTEMPT="${SLURM_RESTART_COUNT:-0}"
# A free port for the rendezvous, chosen once per attempt by the batch step.
port="$("$py" -c 'import socket; s=socket.socket(); s.bind(("127.0.0.1", 0)); print(s.getsockname()[1])')"
here="$(cd "$(dirname "$0")" 2>/dev/null && pwd)"
tiny="${TINY_TRAIN:-$here/../jobs/tiny_train.py}"
echo "attempt ${TRAINGUARD_ATTEMPT} of job ${SLURM_JOB_ID} on ${SLURM_JOB_NODELIST} (rendezvous port ${port})"
# TRAINGUARD_SNAPSHOT_DIR_PER_NODE=DIR: each node keeps its memory snapshots in DIR/<node>
# (every logical node of the local cluster shares this host's /dev/shm; a lost node's
# directory can then be removed as its memory would be gone).
step=(srun --kill-on-bad-exit=1 bash -c '
if [ -n "${TRAINGUARD_SNAPSHOT_DIR_PER_NODE:-}" ]; then
    export TRAINGUARD_SNAPSHOT_DIR="$TRAINGUARD_SNAPSHOT_DIR_PER_NODE/$SLURMD_NODENAME"
fi
is_host=0
[ "$SLURM_NODEID" = 0 ] && is_host=1
exec "$0" -m torch.distributed.run --nnodes=2 --nproc-per-node=1 --max-restarts=0 \
    --rdzv-backend=c10d --rdzv-endpoint=127.0.0.1:'"$port"' \
    --rdzv-id="$SLURM_JOB_ID-${SLURM_RESTART_COUNT:-0}" --rdzv-conf is_host=$is_host \
    "$@"' "$py" "$tiny" "$@")
# TRAINGUARD_STOP_ON_USR1=1: Slurm's warning before the time limit (--signal=B:USR1@N, or
# `scancel --signal=USR1 --batch`) reaches this batch shell only; it becomes SIGTERM to
# every process of the job step (the ranks' planned-stop signal). Not `kill -TERM` to
# srun: srun answers SIGTERM by killing the step.
if [ -n "${TRAINGUARD_STOP_ON_USR1:-}" ]; then
    "${step[@]}" &
    pid=$!
    trap 'echo "batch: SIGUSR1 (time limit ahead): SIGTERM to the job step"
          scancel --signal=TERM "$SLURM_JOB_ID"' USR1
    while :; do
        wait "$pid"
        rc=$?
        kill -0 "$pid" 2>/dev/null || exit "$rc"
    done
fi
exec "${step[@]}"
