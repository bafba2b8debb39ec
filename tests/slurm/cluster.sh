#!/usr/bin/env bash
# A real SLURM cluster of N nodes (n1 ... nN; N=2 unless TRAINSCALE_TEST_CLUSTER_NODES says) on this
# one machine, for tests: one slurmd -N per node, all on this machine's cores.
#
#   cluster.sh up       install (if needed), configure and start munged, slurmctld,
#                       slurmd -N n1 ... slurmd -N nN; wait until every node is idle.
#                       A cluster that is already up and healthy is reused.
#   cluster.sh down     cancel all jobs, stop the daemons started by `up` (by pid file).
#   cluster.sh status   sinfo and squeue of the cluster.
#   cluster.sh check    exit 0 when the cluster is up, healthy and configured as now.
#   cluster.sh env      the variables a client needs (SLURM_CONF=...).
#
# Everything lives in $TRAINSCALE_TEST_CLUSTER_DIR (default /tmp/trainscale-slurm for the test suite's
# 2 nodes, /tmp/trainscale-slurm-<N>n for any other N, on ports of its own, so a 16-node cluster for
# the scale tests never replaces the 2-node one that test sessions share): its own
# munge key and socket, slurm.conf, state, spool, logs and pid files. Daemons and
# clients find the config through SLURM_CONF, so /etc/slurm is not used. Needs root
# (slurmd runs jobs as their user; SlurmUser=root). Never used on a user's cluster.
set -euo pipefail

N=${TRAINSCALE_TEST_CLUSTER_NODES:-2}
[[ $N =~ ^[1-9][0-9]?$ ]] || { echo "cluster.sh: TRAINSCALE_TEST_CLUSTER_NODES=$N: give 1 to 99 nodes" >&2; exit 2; }
if ((N == 2)); then
    DIR=${TRAINSCALE_TEST_CLUSTER_DIR:-/tmp/trainscale-slurm}
    CTLD_PORT=${TRAINSCALE_TEST_CLUSTER_CTLD_PORT:-16817}
    FIRST_NODE_PORT=17001
else # other sizes: a directory and ports of their own (17100 + 100 N ... + N - 1)
    DIR=${TRAINSCALE_TEST_CLUSTER_DIR:-/tmp/trainscale-slurm-${N}n}
    CTLD_PORT=${TRAINSCALE_TEST_CLUSTER_CTLD_PORT:-$((16900 + N))}
    FIRST_NODE_PORT=$((17100 + 100 * N))
fi
NODES=() NODE_PORTS=()
for ((i = 0; i < N; i++)); do
    NODES+=("n$((i + 1))")
    NODE_PORTS+=("$((FIRST_NODE_PORT + i))")
done
NODE_CPUS=4            # more than the machine has: allowed by config_overrides
NODE_MEMORY_MB=8000
CRED_EXPIRE_S=10       # step credential lifetime = how long a requeued job waits
UP_TIMEOUT_S=${TRAINSCALE_TEST_CLUSTER_UP_TIMEOUT:-60}
DOWN_TIMEOUT_S=30
HERE=$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)
INSTALL=$HERE/../../.ci/install-slurm.sh

export SLURM_CONF=$DIR/slurm.conf

log() { echo "cluster.sh: $*" >&2; }
die() { log "ERROR: $*"; exit 1; }

# Poll CMD until it succeeds or TIMEOUT seconds pass; returns 1 on timeout.
wait_for() {
    local timeout=$1; shift
    local deadline=$((SECONDS + timeout))
    until "$@" >/dev/null 2>&1; do
        ((SECONDS < deadline)) || return 1
        sleep 0.2
    done
}

# The pid file's process is running and is the daemon the file is named after
# (munged.pid, slurmctld.pid, slurmd-n1.pid): a stale file whose pid was reused
# by another program after a reboot must not be mistaken for, or killed as, ours.
pid_alive() { # pidfile
    local name pid
    [[ -s $1 ]] || return 1
    name=$(basename "$1" .pid)
    pid=$(cat "$1")
    [[ $(cat "/proc/$pid/comm" 2>/dev/null) == "${name%%-*}" ]]
}

pidfiles() {
    echo "$DIR/run/munged.pid" "$DIR/run/slurmctld.pid"
    local n
    for n in "${NODES[@]}"; do echo "$DIR/run/slurmd-$n.pid"; done
}

all_daemons_alive() {
    local f
    for f in $(pidfiles); do pid_alive "$f" || return 1; done
}

# True when sinfo lists every node in a usable state (idle, or busy with jobs, or
# completing one: a node is `comp` for a moment after every job).
nodes_ready() {
    local want=${1:-idle|mix|alloc|comp}
    local states
    states=$(sinfo -h -N -o '%N %t' 2>/dev/null | sort -u) || return 1
    local n
    for n in "${NODES[@]}"; do
        grep -Eq "^$n ($want)\$" <<<"$states" || return 1
    done
}

write_munge_key() {
    local key=$DIR/munge/munge.key
    [[ -s $key ]] && return 0
    if command -v mungekey >/dev/null 2>&1; then
        mungekey --create --keyfile="$key"
    else
        dd if=/dev/urandom of="$key" bs=1024 count=1 status=none
    fi
    chmod 400 "$key"
}

render_config() {
    local host
    host=$(hostname -s)
    local nodelist
    nodelist=$(IFS=,; echo "${NODES[*]}")
    {
        echo "# Written by tests/slurm/cluster.sh: a $N-node test cluster on one machine."
        echo "ClusterName=trainscale-test"
        echo "SlurmctldHost=$host(127.0.0.1)"
        echo "SlurmctldPort=$CTLD_PORT"
        echo "SlurmUser=root"
        echo "SlurmdUser=root"
        echo "AuthType=auth/munge"
        echo "CredType=cred/munge"
        # cred_expire also delays the restart of a requeued job (default 120 s).
        echo "AuthInfo=socket=$DIR/munge/munge.socket,cred_expire=$CRED_EXPIRE_S"
        echo "StateSaveLocation=$DIR/state"
        echo "SlurmctldPidFile=$DIR/run/slurmctld.pid"
        echo "SlurmctldLogFile=$DIR/log/slurmctld.log"
        echo "SlurmdSpoolDir=$DIR/spool/%n"
        echo "SlurmdPidFile=$DIR/run/slurmd-%n.pid"
        echo "SlurmdLogFile=$DIR/log/slurmd-%n.log"
        echo "SlurmdParameters=config_overrides"
        echo "SelectType=select/cons_tres"
        echo "SelectTypeParameters=CR_Core"
        echo "ProctrackType=proctrack/linuxproc"
        echo "TaskPlugin=task/affinity"
        echo "MpiDefault=none"
        echo "ReturnToService=2"
        echo "JobRequeue=1"
        echo "MinJobAge=600"
        echo "KillWait=5"
        echo "SchedulerType=sched/backfill"
        # Re-scan pending jobs every second: a requeued job becomes eligible
        # without any event that would wake the scheduler (defaults: 60 s / 30 s).
        echo "SchedulerParameters=sched_interval=1,bf_interval=1"
        echo "AccountingStorageType=accounting_storage/none"
        echo "JobAcctGatherType=jobacct_gather/none"
        echo "JobCompType=jobcomp/filetxt"
        echo "JobCompLoc=$DIR/log/jobcomp.txt"
        local i
        for i in "${!NODES[@]}"; do
            echo "NodeName=${NODES[$i]} NodeAddr=127.0.0.1 NodeHostname=$host Port=${NODE_PORTS[$i]} CPUs=$NODE_CPUS RealMemory=$NODE_MEMORY_MB State=UNKNOWN"
        done
        echo "PartitionName=debug Nodes=$nodelist Default=YES MaxTime=INFINITE State=UP"
    }
}

ensure_hosts() {
    # The first node name becomes MASTER_ADDR in jobs, so n1 ... nN must resolve.
    local n missing=()
    for n in "${NODES[@]}"; do
        getent hosts "$n" >/dev/null || missing+=("$n")
    done
    if ((${#missing[@]})); then
        log "adding '127.0.0.1 ${missing[*]}' to /etc/hosts"
        echo "127.0.0.1 ${missing[*]}" >>/etc/hosts
    fi
}

print_where() {
    echo "SLURM_CONF=$SLURM_CONF"
    echo "logs: $DIR/log (slurmctld.log, slurmd-n1.log ... slurmd-n$N.log, munged.log)"
}

# The daemons must not inherit fd 9 (the cluster.lock held by `locked`).
start_daemons() {
    if ! pid_alive "$DIR/run/munged.pid"; then
        rm -f "$DIR/munge/munge.socket" "$DIR/munge/munge.socket.lock"
        munged --key-file="$DIR/munge/munge.key" --socket="$DIR/munge/munge.socket" \
            --pid-file="$DIR/run/munged.pid" --log-file="$DIR/log/munged.log" \
            --seed-file="$DIR/munge/munged.seed" 9>&-
        wait_for 10 test -S "$DIR/munge/munge.socket" || die "munged did not create its socket; see $DIR/log/munged.log"
    fi
    if ! pid_alive "$DIR/run/slurmctld.pid"; then
        slurmctld 9>&- || die "slurmctld failed to start; see $DIR/log/slurmctld.log"
    fi
    local n
    for n in "${NODES[@]}"; do
        if ! pid_alive "$DIR/run/slurmd-$n.pid"; then
            slurmd -N "$n" 9>&- || die "slurmd -N $n failed to start; see $DIR/log/slurmd-$n.log"
        fi
    done
}

# Up, every node usable, and running the slurm.conf this script would write now.
healthy() {
    [[ -e $SLURM_CONF ]] && all_daemons_alive && nodes_ready &&
        [[ $(render_config) == "$(cat "$SLURM_CONF")" ]]
}

cmd_up() {
    local t0=$SECONDS
    if healthy; then
        log "cluster already up (reused)"
        print_where
        return 0
    fi
    [[ $(id -u) -eq 0 ]] || die "needs root (slurmd must run jobs as their user; SlurmUser=root); you are $(id -un)"
    bash "$INSTALL" || die "could not install SLURM (see the message above)"
    # A partly running cluster (some daemon died) is restarted as a whole.
    if [[ -d $DIR/run ]]; then stop_daemons; fi
    # A cluster started again starts empty: jobs the controller saved (a `down` that stopped while jobs were
    # still queued, a session killed mid-job) would come back as running on nodes with none (state `mix`) and
    # hold them for minutes (seen in CI: "nodes not idle after 60s").
    # Its job ids start from 1 again: the finished jobs' log (`sacct --completion`) starts again with them.
    rm -rf "$DIR/state" "$DIR/spool"
    if [[ -e $DIR/log/jobcomp.txt ]]; then mv "$DIR/log/jobcomp.txt" "$DIR/log/jobcomp.before.txt"; fi
    mkdir -p "$DIR"/{munge,state,run,log,tmp} "${NODES[@]/#/$DIR/spool/}"
    chmod 755 "$DIR/munge" # munged wants its socket's directory searchable by all
    ensure_hosts
    write_munge_key
    render_config >"$SLURM_CONF.new"
    mv "$SLURM_CONF.new" "$SLURM_CONF"
    start_daemons
    if ! wait_for "$UP_TIMEOUT_S" nodes_ready idle; then
        sinfo -N >&2 || true
        die "nodes not idle after ${UP_TIMEOUT_S}s; logs in $DIR/log"
    fi
    log "cluster up in $((SECONDS - t0))s"
    print_where
}

# Pids of processes still running anything of this cluster's jobs: slurmstepd
# and the job processes have our SLURM_CONF in their environment.
cluster_job_pids() {
    local files f p
    files=$(grep -lzx "SLURM_CONF=$SLURM_CONF" /proc/[0-9]*/environ 2>/dev/null) || return 0
    # shellcheck disable=SC2086
    for f in $(grep -lz '^SLURM_JOB_ID=' $files 2>/dev/null); do
        p=${f#/proc/}
        p=${p%/environ}
        [[ $p == "$$" || $p == "$BASHPID" ]] || echo "$p"
    done
}

none_alive() { # pid...
    local pid
    for pid in "$@"; do ! kill -0 "$pid" 2>/dev/null || return 1; done
}

# SIGTERM to every pid file's process at once (each daemon takes 1-2 s to exit),
# then wait for all of them; SIGKILL whatever outlives the deadline.
stop_pids() { # pidfile...
    local f pid pids=()
    for f in "$@"; do
        pid_alive "$f" || continue
        pid=$(cat "$f")
        kill -TERM "$pid" 2>/dev/null || true
        pids+=("$pid")
    done
    if ((${#pids[@]})) && ! wait_for "$DOWN_TIMEOUT_S" none_alive "${pids[@]}"; then
        for pid in "${pids[@]}"; do
            if kill -0 "$pid" 2>/dev/null; then
                log "pid $pid ignored SIGTERM for ${DOWN_TIMEOUT_S}s; killing it"
                kill -KILL "$pid" 2>/dev/null || true
            fi
        done
    fi
    rm -f "$@"
}

stop_daemons() {
    if pid_alive "$DIR/run/slurmctld.pid"; then
        scancel --quiet --user=root 2>/dev/null || true
        wait_for "$DOWN_TIMEOUT_S" bash -c '[[ -z $(squeue -h -o %i) ]]' ||
            log "jobs still in the queue after ${DOWN_TIMEOUT_S}s; stopping anyway"
    fi
    # shellcheck disable=SC2046
    stop_pids $(pidfiles)
    local left
    left=$(cluster_job_pids)
    if [[ -n $left ]]; then
        log "killing leftover job processes of this cluster: $left"
        # shellcheck disable=SC2086
        kill -KILL $left 2>/dev/null || true
    fi
}

cmd_down() {
    [[ -d $DIR/run ]] || { log "no cluster in $DIR"; return 0; }
    stop_daemons
    log "cluster in $DIR stopped (logs kept in $DIR/log)"
}

cmd_status() {
    [[ -e $SLURM_CONF ]] || die "no cluster configured in $DIR (run: $0 up)"
    sinfo
    squeue
}

# One up/down at a time (several test sessions may share the cluster).
locked() {
    mkdir -p "$DIR"
    exec 9>"$DIR/cluster.lock"
    flock -w 120 9 || die "another cluster.sh holds $DIR/cluster.lock for 120s"
    "$@"
}

case ${1:-} in
up) locked cmd_up ;;
down) locked cmd_down ;;
status) cmd_status ;;
check) healthy ;;
env) echo "SLURM_CONF=$SLURM_CONF" ;;
*)
    echo "usage: [TRAINSCALE_TEST_CLUSTER_NODES=N] $0 up|down|status|check|env   (cluster dir: \$TRAINSCALE_TEST_CLUSTER_DIR, now $DIR)" >&2
    exit 2
    ;;
esac
