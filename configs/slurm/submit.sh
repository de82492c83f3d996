#!/bin/bash
# usage: N=8 CONFIG=configs/collect/embedded.yaml SPLIT=train configs/slurm/submit.sh
# Submits the shard array (one collect process per shard, every core of its node via --workers auto) and a merge job
# that starts only when every array task succeeded (afterok). Nothing here schedules tasks itself: Slurm does.
set -euo pipefail
N=${N:-4}
mkdir -p runs/shards/logs
ARRAY=$(sbatch --parsable --array=0-$((N - 1)) --export=ALL,N=$N configs/slurm/collect_shards.sbatch)
sbatch --dependency=afterok:${ARRAY%%;*} --export=ALL,N=$N configs/slurm/merge.sbatch
echo "array job $ARRAY: $N shards -> runs/shards/0..$((N - 1)); merge -> ${MERGED:-runs/collect}"
