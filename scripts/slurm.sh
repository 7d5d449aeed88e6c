#!/usr/bin/env bash
# A real one-node SLURM cluster on this machine, for `detour study --executor slurm`, its tests and CI.
#   sudo bash scripts/slurm.sh start     # munged, slurmctld, slurmd; waits until `sinfo` shows the node idle
#   bash scripts/slurm.sh status         # sinfo and squeue, or "not running" (exit 3)
#   sudo bash scripts/slurm.sh stop      # stops the daemons this script started
#
# Needs root and Debian's slurm-wlm and munge packages (`apt-get install -y slurm-wlm munge`).
# SLURM is a system service: its configuration must live where the daemons and every client
# (sbatch, squeue, sacct) look for it, so this script writes /etc/slurm/slurm.conf, marked as
# its own on the first line. A slurm.conf without that mark (an administrator's) is never
# overwritten: the script stops with an error instead. State, logs and the job history go to
# the Debian package's folders (/var/lib/slurm, /var/log/slurm).
#
# The node is this host (`hostname -s`) with the CPUs and memory `slurmd -C` reports, in one
# partition `debug` (default, no time limit). Cores and memory are the consumable resources
# (cons_tres, CR_Core_Memory) and a job that asks for no memory gets its CPUs' share, so two
# 1-CPU jobs run at once on 2 cores. There is no accounting database: finished jobs go to the
# job-completion file, which `sacct -c` reads (`sacct` alone says accounting is disabled), and
# `squeue` shows them for MinJobAge (5 minutes) after they end.
set -euo pipefail

CONF_DIR=/etc/slurm
CONF=$CONF_DIR/slurm.conf
MARK="# Written by detour's scripts/slurm.sh: a one-node cluster on this machine (rewritten by each start)."
STATE=/var/lib/slurm
LOGS=/var/log/slurm
RUN=/run/slurm
JOBCOMP=$LOGS/jobcomp.txt
TIMEOUT=${DETOUR_SLURM_TIMEOUT:-60}

die() { echo "scripts/slurm.sh: $*" >&2; exit 2; }

node_state() { sinfo -h -N -o %t 2>/dev/null | head -n1; }

answering() {
  # idle or mix (a trailing * or ~ would mean not responding / powered down: not answering)
  case "$(node_state)" in idle|mix|alloc) return 0 ;; *) return 1 ;; esac
}

running() {  # pidfile
  [ -f "$1" ] && kill -0 "$(cat "$1")" 2>/dev/null
}

write_conf() {
  local host cpus sockets cores threads mem real
  host=$(hostname -s)
  # slurmd -C: "NodeName=vm CPUs=2 Boards=1 SocketsPerBoard=1 CoresPerSocket=2 ThreadsPerCore=1 RealMemory=24105"
  local probe
  probe=$(slurmd -C | head -n1)
  field() { sed -n "s/.*\b$1=\([0-9]*\).*/\1/p" <<<"$probe"; }
  cpus=$(field CPUs); sockets=$(field SocketsPerBoard); cores=$(field CoresPerSocket)
  threads=$(field ThreadsPerCore); mem=$(field RealMemory)
  [ -n "$cpus" ] && [ -n "$mem" ] || die "cannot read CPUs and memory from 'slurmd -C' ($probe)"
  # a little below what slurmd measures: a node whose configured memory exceeds its measured
  # memory is drained ("Low RealMemory"), and the measure moves with the kernel's reservations
  real=$(( mem - (mem / 20 > 512 ? mem / 20 : 512) ))
  local conf
  conf=$(cat <<EOF
$MARK
ClusterName=detour
SlurmctldHost=$host
SlurmUser=slurm
AuthType=auth/munge
StateSaveLocation=$STATE/slurmctld
SlurmdSpoolDir=$STATE/slurmd
SlurmctldPidFile=$RUN/slurmctld.pid
SlurmdPidFile=$RUN/slurmd.pid
SlurmctldLogFile=$LOGS/slurmctld.log
SlurmdLogFile=$LOGS/slurmd.log
# no cgroups in containers (gVisor, Docker without a delegated cgroup): processes are tracked
# through /proc and tasks are not pinned
ProctrackType=proctrack/linuxproc
TaskPlugin=task/none
JobAcctGatherType=jobacct_gather/none
MpiDefault=none
SchedulerType=sched/backfill
SelectType=select/cons_tres
SelectTypeParameters=CR_Core_Memory
DefMemPerCPU=$(( real / cpus ))
# a node restarted with the cluster comes back by itself
ReturnToService=2
AccountingStorageType=accounting_storage/none
JobCompType=jobcomp/filetxt
JobCompLoc=$JOBCOMP
MinJobAge=300
NodeName=$host CPUs=$cpus Boards=1 SocketsPerBoard=${sockets:-1} CoresPerSocket=${cores:-$cpus} ThreadsPerCore=${threads:-1} RealMemory=$real State=UNKNOWN
PartitionName=debug Nodes=$host Default=YES MaxTime=INFINITE State=UP
EOF
)
  if [ -f "$CONF" ] && [ "$(head -n1 "$CONF")" != "$MARK" ]; then
    die "$CONF exists and was not written by this script; leaving it (and SLURM) as they are"
  fi
  mkdir -p "$CONF_DIR"
  [ -f "$CONF" ] && [ "$(cat "$CONF")" = "$conf" ] || printf '%s\n' "$conf" > "$CONF"
}

start_munge() {
  if munge -n 2>/dev/null | unmunge >/dev/null 2>&1; then return 0; fi
  if [ ! -s /etc/munge/munge.key ]; then
    mkdir -p /etc/munge
    if command -v mungekey >/dev/null; then mungekey --create --keyfile=/etc/munge/munge.key
    else dd if=/dev/urandom bs=1 count=1024 of=/etc/munge/munge.key status=none; fi
    chown munge:munge /etc/munge/munge.key
    chmod 0400 /etc/munge/munge.key
  fi
  mkdir -p /run/munge /var/lib/munge /var/log/munge
  chown munge:munge /run/munge /var/lib/munge /var/log/munge
  chmod 0755 /run/munge
  # as Debian's service unit runs it: munged refuses a key it does not own
  runuser -u munge -- /usr/sbin/munged
  touch "$RUN/munged.ours"
  for _ in $(seq 50); do
    munge -n 2>/dev/null | unmunge >/dev/null 2>&1 && return 0
    sleep 0.1
  done
  die "munged did not answer (see /var/log/munge/munged.log)"
}

start() {
  [ "$(id -u)" = 0 ] || die "start needs root (it writes $CONF and starts system daemons)"
  for tool in slurmctld slurmd sinfo munged; do
    command -v "$tool" >/dev/null || die "$tool not found: apt-get install -y slurm-wlm munge"
  done
  write_conf
  mkdir -p "$RUN" "$STATE/slurmctld" "$STATE/slurmd" "$LOGS"
  chown slurm:slurm "$RUN" "$STATE/slurmctld" "$LOGS"
  touch "$JOBCOMP" && chown slurm:slurm "$JOBCOMP"
  local t0=$SECONDS
  start_munge
  running "$RUN/slurmctld.pid" || slurmctld
  running "$RUN/slurmd.pid" || slurmd
  until answering; do
    if (( SECONDS - t0 >= TIMEOUT )); then
      die "the node is not idle after ${TIMEOUT}s (sinfo: '$(node_state)'; see $LOGS/slurmctld.log and $LOGS/slurmd.log)"
    fi
    sleep 0.5
  done
  echo "SLURM up in $(( SECONDS - t0 ))s: $(sinfo -h -o '%P %a %D %t %c CPUs %m MB' | head -n1)"
}

stop_pid() {  # name pidfile
  running "$2" || return 0
  local pid
  pid=$(cat "$2")
  kill -TERM "$pid"
  for _ in $(seq 100); do kill -0 "$pid" 2>/dev/null || return 0; sleep 0.1; done
  die "$1 (pid $pid) did not stop within 10 s"
}

stop() {
  [ "$(id -u)" = 0 ] || die "stop needs root"
  stop_pid slurmd "$RUN/slurmd.pid"
  stop_pid slurmctld "$RUN/slurmctld.pid"
  # munged only if this script started it: another service on the machine may rely on it
  if [ -f "$RUN/munged.ours" ]; then
    stop_pid munged /run/munge/munged.pid
    rm -f "$RUN/munged.ours"
  fi
  echo "SLURM stopped"
}

status() {
  if answering; then
    sinfo
    squeue
  else
    echo "SLURM is not running (or its node is not idle: '$(node_state)')"
    exit 3
  fi
}

case "${1:-}" in
  start) start ;;
  stop) stop ;;
  status) status ;;
  *) echo "usage: bash scripts/slurm.sh start|stop|status" >&2; exit 2 ;;
esac
