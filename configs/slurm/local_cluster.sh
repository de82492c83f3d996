#!/bin/bash
# A one-node Slurm on this machine (Debian's slurmctld, slurmd and munge), to run configs/slurm as written.
#
#   configs/slurm/local_cluster.sh install          apt-get install slurmctld slurmd slurm-client munge (root)
#   configs/slurm/local_cluster.sh start STATE      munged + slurmctld + slurmd, every file under STATE (no /etc edit)
#   configs/slurm/local_cluster.sh stop STATE       stop the three daemons started with that STATE (by their pid files)
#   configs/slurm/local_cluster.sh check STATE [N] [LIMIT]
#       start, submit configs/slurm/submit.sh (N shards of the first LIMIT train tasks of configs/collect/embedded.yaml,
#       default 2 x 20) from a submission folder STATE/submit that links this repository's code (its runs/ is its own),
#       wait for the array and the dependent merge, run the same tasks unsharded, compare the merged harvest byte for
#       byte, stop. Exit 0 only when every job COMPLETED and every file is identical. `make slurm-check` runs it.
#
# The node declares 16 CPUs and 32 GB (SlurmdParameters=config_overrides) whatever the machine has, so the sbatch
# scripts' own requests (--cpus-per-task=8 --mem=16G) are submitted unchanged; CPUs are the only consumable
# (CR_CPU), no cgroup or accounting daemon is needed. The daemons run as root; munged uses its own key and socket
# under STATE, and the ports are chosen free at start, so another Slurm or munged on the machine is not touched.
set -euo pipefail
HERE=$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)
REPO=$(cd "$HERE/../.." && pwd)

need() { command -v "$1" >/dev/null || { echo "error: $1 not found: configs/slurm/local_cluster.sh install" >&2; exit 4; }; }
free_port() { python3 -c 'import socket; s=socket.socket(); s.bind(("127.0.0.1", 0)); print(s.getsockname()[1])'; }

install() {
  [ "$(id -u)" = 0 ] || { echo "error: install needs root (apt-get)" >&2; exit 4; }
  DEBIAN_FRONTEND=noninteractive apt-get install -y -qq --no-install-recommends slurmctld slurmd slurm-client munge
}

start() {
  local state=$1
  for c in munged mungekey slurmctld slurmd sbatch squeue scontrol; do need "$c"; done
  mkdir -p "$state"/{munge,ctld,spool,log}
  state=$(cd "$state" && pwd)
  chmod 0700 "$state/munge"
  [ -f "$state/munge/munge.key" ] || mungekey --create --keyfile="$state/munge/munge.key"
  munged --force --socket="$state/munge/munge.sock" --key-file="$state/munge/munge.key" \
    --pid-file="$state/munge/munged.pid" --log-file="$state/log/munged.log" --seed-file="$state/munge/munged.seed"
  local host; host=$(hostname -s)
  cat > "$state/slurm.conf" <<EOF
ClusterName=od-local
SlurmctldHost=$host(127.0.0.1)
SlurmctldPort=$(free_port)
SlurmdPort=$(free_port)
SlurmUser=root
SlurmdUser=root
AuthType=auth/munge
CredType=cred/munge
AuthInfo=socket=$state/munge/munge.sock
StateSaveLocation=$state/ctld
SlurmdSpoolDir=$state/spool
SlurmctldPidFile=$state/slurmctld.pid
SlurmdPidFile=$state/slurmd.pid
SlurmctldLogFile=$state/log/slurmctld.log
SlurmdLogFile=$state/log/slurmd.log
ProctrackType=proctrack/linuxproc
TaskPlugin=task/none
SelectType=select/cons_tres
SelectTypeParameters=CR_CPU
SchedulerType=sched/backfill
JobAcctGatherType=jobacct_gather/none
AccountingStorageType=accounting_storage/none
MpiDefault=none
ReturnToService=2
MinJobAge=3600
SlurmdParameters=config_overrides
NodeName=$host NodeAddr=127.0.0.1 CPUs=16 RealMemory=32768 State=UNKNOWN
PartitionName=local Nodes=$host Default=YES MaxTime=INFINITE State=UP
EOF
  export SLURM_CONF=$state/slurm.conf
  slurmctld -f "$SLURM_CONF"
  slurmd -f "$SLURM_CONF"
  for _ in $(seq 60); do
    if sinfo -h -o '%T' 2>/dev/null | grep -qx idle; then
      echo "slurm: one node ($host, 16 CPUs declared) idle; SLURM_CONF=$SLURM_CONF"
      return 0
    fi
    sleep 1
  done
  echo "error: the node did not become idle in 60 s; logs in $state/log" >&2
  tail -n 20 "$state"/log/*.log >&2 || true
  return 5
}

stop() {
  local state=$1 f pid
  for f in "$state/slurmd.pid" "$state/slurmctld.pid" "$state/munge/munged.pid"; do
    [ -f "$f" ] || continue
    pid=$(cat "$f")
    kill "$pid" 2>/dev/null || true
    for _ in $(seq 50); do kill -0 "$pid" 2>/dev/null || break; sleep 0.2; done
    rm -f "$f"
  done
}

check() {
  local state=$1 n=${2:-2} limit=${3:-20}
  mkdir -p "$state"
  state=$(cd "$state" && pwd)
  CHECK_STATE=$state
  trap 'stop "$CHECK_STATE"' EXIT
  start "$state"
  export SLURM_CONF=$state/slurm.conf
  # the submission folder: this repository's code and .venv by link, its own runs/
  local sub=$state/submit entry
  rm -rf "$sub" && mkdir -p "$sub"
  for entry in "$REPO"/* "$REPO"/.venv; do
    [ "$(basename "$entry")" = runs ] || ln -s "$entry" "$sub/$(basename "$entry")"
  done
  cd "$sub"
  echo "+ N=$n LIMIT=$limit CONFIG=configs/collect/embedded.yaml SPLIT=train configs/slurm/submit.sh"
  N=$n LIMIT=$limit CONFIG=configs/collect/embedded.yaml SPLIT=train configs/slurm/submit.sh
  echo "+ squeue (just after submission)"
  squeue -o '  %.8i %.10j %.9T %.20r %E' || true
  local t0=$SECONDS
  while [ -n "$(squeue -h -o %i)" ]; do
    if [ $((SECONDS - t0)) -gt 1200 ]; then echo "error: jobs still queued after 1200 s" >&2; squeue >&2; return 6; fi
    sleep 2
  done
  echo "+ scontrol show jobs (after $((SECONDS - t0)) s)"
  local jobs; jobs=$(scontrol -o show jobs)
  echo "$jobs" | tr ' ' '\n' | awk -F= '
    /^JobId=/ { if (line) print line; line = "  " $0 }
    /^(ArrayJobId|ArrayTaskId|JobName|JobState|ExitCode|RunTime|BatchHost)=/ { line = line " " $0 }
    END { print line }'
  if [ "$(echo "$jobs" | grep -c 'JobState=COMPLETED')" != $((n + 1)) ] || echo "$jobs" | grep -v -q 'JobState=COMPLETED'; then
    echo "error: expected $n array tasks and the merge, all COMPLETED; logs in $sub/runs/shards/logs" >&2
    tail -n 20 "$sub"/runs/shards/logs/* >&2 || true
    return 7
  fi
  echo "+ the same $limit tasks unsharded"
  .venv/bin/python -m collect --config configs/collect/embedded.yaml --split train --limit "$limit" \
    --out runs/unsharded --no-progress > runs/unsharded.log 2>&1
  local f bad=0
  # trajectories: the merge writes task-id order, one process writes them as they finish: the same lines, sorted
  if cmp -s <(sort runs/unsharded/trajectories.jsonl) <(sort runs/collect/trajectories.jsonl); then
    echo "  identical  trajectories.jsonl lines ($(wc -l < runs/collect/trajectories.jsonl); merged in task-id order)"
  else
    echo "  DIFFERENT  trajectories.jsonl" >&2
    bad=1
  fi
  for f in sft.train.jsonl sft.eval.jsonl rl_states.train.jsonl rl_states.eval.jsonl; do
    if cmp -s "runs/unsharded/$f" "runs/collect/$f"; then
      echo "  identical  $f ($(wc -l < "runs/collect/$f") lines, sha256 $(sha256sum < "runs/collect/$f" | cut -c1-16))"
    else
      echo "  DIFFERENT  $f" >&2
      bad=1
    fi
  done
  [ $bad = 0 ] || return 8
  echo "slurm check: $n shards + merge COMPLETED; the merged harvest is byte-identical to one unsharded run"
}

cmd=${1:-}
case "$cmd" in
  install) install ;;
  start) start "${2:?STATE folder}" ;;
  stop) stop "${2:?STATE folder}" ;;
  check) check "${2:?STATE folder}" "${3:-2}" "${4:-20}" ;;
  *) sed -n '2,13p' "$0"; exit 2 ;;
esac
