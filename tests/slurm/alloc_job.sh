#!/bin/bash
# A torchrun job protected by trainguard inside its allocation (decision 0510): one
# trainguard per node, `--spares K` of the nodes kept as hot spares; tests/jobs/tiny_train.py,
# one rank per node (gloo over loopback: every logical node is this host).
# Usage: sbatch --nodes=N+K --no-kill alloc_job.sh PYTHON NNODES TRAINGUARD_RUN_ARGS... -- TINY_TRAIN_ARGS...
set -u
py="$1"
nnodes="$2"
shift 2
tg=()
while [ $# -gt 0 ] && [ "$1" != "--" ]; do
    tg+=("$1")
    shift
done
[ $# -gt 0 ] && shift
# A free port for the rendezvous (every logical node is this host).
port="$("$py" -c 'import socket; s=socket.socket(); s.bind(("127.0.0.1", 0)); print(s.getsockname()[1])')"
here="$(cd "$(dirname "$0")" 2>/dev/null && pwd)"
tiny="${TINY_TRAIN:-$here/../jobs/tiny_train.py}"
echo "job ${SLURM_JOB_ID} on ${SLURM_JOB_NODELIST} (rendezvous port ${port})"
srun --no-kill --ntasks-per-node=1 "$py" -m trainguard.cli run "${tg[@]}" -- \
    "$py" -m torch.distributed.run --nnodes="$nnodes" --nproc-per-node=1 --max-restarts=0 \
    --rdzv-backend=c10d --rdzv-endpoint="127.0.0.1:$port" "$tiny" "$@"
rc=$?
echo "srun exit $rc"
exit "$rc"
