#!/usr/bin/env bash
# A real Slurm cluster of N nodes on this one machine, for tests and demos.
#   cluster.sh start DIR [N]   write DIR/slurm.conf, start slurmctld and N slurmd (n1..nN)
#   cluster.sh stop DIR        stop the daemons started from DIR (by their pid files)
# Then: export SLURM_CONF=DIR/slurm.conf; sinfo; srun -N2 hostname; sbatch ...
# Vendored from the shared tools (slurm-local/cluster.sh) for the Slurm tests.
# Needs Debian's slurm-wlm (apt-get install -y slurm-wlm). No munge: auth/none, for a
# sandbox only. Every node is this host: NodeHostname is the same, each slurmd its own port.
# SLURM_LOCAL_CPUS (default 1) sets the CPUs each node advertises; SLURM_LOCAL_PORT the base port.
set -euo pipefail
cmd=${1:?start|stop}; dir=$(mkdir -p "${2:?DIR}" && cd "$2" && pwd); n=${3:-2}
conf=$dir/slurm.conf
if [ "$cmd" = stop ]; then
  for f in "$dir"/slurmd-*.pid "$dir"/slurmctld.pid; do
    [ -f "$f" ] && kill "$(cat "$f")" 2>/dev/null || true
  done
  exit 0
fi
command -v slurmctld >/dev/null || { echo "slurm-wlm is not installed: apt-get install -y slurm-wlm" >&2; exit 1; }
host=$(hostname); base=${SLURM_LOCAL_PORT:-16817}
mem=$(( $(awk '/MemTotal/ {print $2}' /proc/meminfo) / 1024 / n / 2 ))
mkdir -p "$dir/state" "$dir/spool" "$dir/log"
{
  echo "ClusterName=local"
  echo "SlurmctldHost=$host"
  echo "AuthType=auth/none"
  echo "CredType=cred/none"
  echo "SlurmUser=$(id -un)"
  echo "StateSaveLocation=$dir/state"
  echo "SlurmdSpoolDir=$dir/spool/%n"
  echo "SlurmctldPidFile=$dir/slurmctld.pid"
  echo "SlurmdPidFile=$dir/slurmd-%n.pid"
  echo "SlurmctldLogFile=$dir/log/slurmctld.log"
  echo "SlurmdLogFile=$dir/log/slurmd-%n.log"
  echo "ProctrackType=proctrack/linuxproc"
  echo "TaskPlugin=task/none"
  echo "SchedulerType=sched/backfill"
  echo "SelectType=select/cons_tres"
  echo "SelectTypeParameters=CR_Core"
  echo "ReturnToService=2"
  echo "MpiDefault=none"
  echo "SlurmctldPort=$base"
  for i in $(seq 1 "$n"); do
    echo "NodeName=n$i NodeHostname=$host Port=$((base + 10 + i)) CPUs=${SLURM_LOCAL_CPUS:-1} RealMemory=$mem State=UNKNOWN"
  done
  echo "PartitionName=debug Nodes=ALL Default=YES MaxTime=INFINITE State=UP"
} > "$conf"
export SLURM_CONF=$conf
slurmctld -f "$conf"
for i in $(seq 1 "$n"); do slurmd -f "$conf" -N "n$i"; done
for _ in $(seq 1 50); do
  [ "$(sinfo -h -N -t idle 2>/dev/null | wc -l)" -ge "$n" ] && { sinfo -N; exit 0; }
  sleep 0.2
done
echo "nodes not idle after 10 s; see $dir/log" >&2; exit 1
