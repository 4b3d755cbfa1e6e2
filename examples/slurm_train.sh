#!/bin/bash
# asrlab train on several nodes under SLURM: one task per node, each starting torchrun with its GPUs.
#   sbatch --nodes=4 examples/slurm_train.sh /data/aishell/train/data.list /data/aishell/dev/data.list exp/base
# Each node may keep EXP on its own disk: the stall watch's files reach every node through the
# rendezvous store, checkpoints and every rank's ledger are kept on the first node (rank 0's), and a
# restart on any number of nodes resumes from there. With EXP on shared storage nothing changes.
#SBATCH --job-name=asrlab
#SBATCH --nodes=2
#SBATCH --ntasks-per-node=1
#SBATCH --gpus-per-node=8
#SBATCH --cpus-per-task=64
#SBATCH --time=24:00:00
set -euo pipefail
DATA=${1:?training data.list}; CV=${2:?validation data.list}; EXP=${3:-exp/base}
FIRST=$(scontrol show hostnames "$SLURM_JOB_NODELIST" | sed -n 1p)  # its agent serves the rendezvous (sed reads all: head would SIGPIPE scontrol, a failure under pipefail)
PORT=${ASRLAB_PORT:-29500}
GPUS=${SLURM_GPUS_ON_NODE:-8}

# build the data's index once before the job starts, where the list's folder is writable:
#   asrlab index "$DATA"
# workers, bucketing and the checkpoint interval as docs/scale.md derives them for 64 GPUs
srun --kill-on-bad-exit=1 bash -c "
  exec .venv/bin/asrlab train --config base --data '$DATA' --cv '$CV' --exp '$EXP' \
    --nnodes $SLURM_NNODES --node-rank \$SLURM_NODEID --rdzv-endpoint $FIRST:$PORT --rdzv-id $SLURM_JOB_ID \
    --nproc $GPUS --max-restarts ${ASRLAB_RESTARTS:-0} --ledger --save-every-steps 5000 \
    data.num_workers=4 data.bucketing=true
"
# afterwards, on the first node: .venv/bin/asrlab doctor "$EXP"
