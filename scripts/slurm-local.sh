#!/usr/bin/env bash
# A real Slurm cluster on this one host, for trainguard's tests, benchmark and demos.
#
#   scripts/slurm-local.sh up              install (Debian's slurmctld slurmd slurm-client
#                                          munge) when missing, configure and start; prints
#                                          `export SLURM_CONF=...` on stdout
#   scripts/slurm-local.sh down            stop every daemon and remove all state
#   scripts/slurm-local.sh status          daemons and `sinfo -N`; exit 1 when not up
#   scripts/slurm-local.sh reset           cancel all jobs, restart dead slurmds, resume
#                                          every node, wait until all nodes are idle
#   scripts/slurm-local.sh node-kill NODE  a node dies: its slurmd and every task it runs
#                                          are SIGKILLed (slurmctld notices by itself)
#   scripts/slurm-local.sh node-up NODE    start the slurmd of NODE again
#   scripts/slurm-local.sh env             print `export SLURM_CONF=...`
#
# The cluster: slurmctld on 127.0.0.1, logical compute nodes n1..n$NODES (default 4), one
# `slurmd -N nX` each (NodeHostname=localhost, NodeAddr=127.0.0.1, ports 17001...), each with
# 4 CPUs and gres gpu:4 backed by stand-in character devices /run/fakegpu/nvidia0..3 (GRES
# needs char devices: docs/field-notes.md). A private munged (own key and socket). Jobs are
# requeueable by default (JobRequeue=1), a dead node is noticed quickly (SlurmdTimeout=10),
# a requeued job may start again after 5 s (AuthInfo cred_expire=5 instead of 120).
#
# Per node, a stand-in kernel log $DIR/nodes/nX/kern.log (what dmesg would show on that
# node; tests append XID lines to it) and $DIR/inventory.json (the GPUs of each node: index,
# uuid, PCI bus id, as an agent would report them).
#
# Everything lives in $TRAINGUARD_SLURM_DIR (default /tmp/trainguard-slurm); ports come from
# TRAINGUARD_SLURM_PORT (slurmctld, default 16817) and TRAINGUARD_SLURMD_PORT (first slurmd,
# default 17001). Needs root (daemons, mknod) and no systemd. Idempotent: `up` on a running
# cluster only prints the environment line.
set -euo pipefail

cmd="${1:-up}"
dir="${TRAINGUARD_SLURM_DIR:-/tmp/trainguard-slurm}"
nodes="${TRAINGUARD_SLURM_NODES:-4}"
ctld_port="${TRAINGUARD_SLURM_PORT:-16817}"
slurmd_port="${TRAINGUARD_SLURMD_PORT:-17001}"
gpus=4
conf="$dir/etc/slurm.conf"
export SLURM_CONF="$conf"

say() { echo "slurm-local: $*" >&2; }
die() { say "$*"; exit 1; }

node_names() { local i; for ((i = 1; i <= nodes; i++)); do echo "n$i"; done; }

pid_alive() { [ -n "${1:-}" ] && kill -0 "$1" 2>/dev/null; }
pid_of() { [ -s "$1" ] && cat "$1" 2>/dev/null || true; }

install_packages() {
    local missing=()
    command -v slurmctld >/dev/null 2>&1 || missing+=(slurmctld)
    command -v slurmd >/dev/null 2>&1 || missing+=(slurmd)
    command -v sbatch >/dev/null 2>&1 || missing+=(slurm-client)
    command -v munged >/dev/null 2>&1 || missing+=(munge)
    [ ${#missing[@]} -eq 0 ] && return 0
    say "installing ${missing[*]} (Debian) ..."
    export DEBIAN_FRONTEND=noninteractive
    # The package lists may be missing on a fresh machine: update once, only when needed.
    if ! apt-get install -y --no-install-recommends "${missing[@]}" >"$dir/apt.log" 2>&1; then
        apt-get update >>"$dir/apt.log" 2>&1 || true
        apt-get install -y --no-install-recommends "${missing[@]}" >>"$dir/apt.log" 2>&1 \
            || { tail -20 "$dir/apt.log" >&2; die "could not install ${missing[*]}"; }
    fi
}

fake_gpus() {
    mkdir -p /run/fakegpu
    local i
    for ((i = 0; i < gpus; i++)); do
        if [ ! -c "/run/fakegpu/nvidia$i" ]; then
            rm -f "/run/fakegpu/nvidia$i"
            mknod "/run/fakegpu/nvidia$i" c 1 3  # a /dev/null twin: a char device, harmless
        fi
    done
}

write_config() {
    local host last_port
    host="$(hostname -s 2>/dev/null || hostname)"
    last_port=$((slurmd_port + nodes - 1))
    mkdir -p "$dir/etc" "$dir/state" "$dir/spool" "$dir/log" "$dir/run" "$dir/nodes"
    cat >"$conf" <<EOF
# Written by scripts/slurm-local.sh: a private test cluster on one host.
ClusterName=trainguard
SlurmctldHost=$host(127.0.0.1)
SlurmctldPort=$ctld_port
SlurmUser=root
SlurmdUser=root
AuthType=auth/munge
CredType=cred/munge
AuthInfo=socket=$dir/munge/munge.socket,cred_expire=5
StateSaveLocation=$dir/state
SlurmdSpoolDir=$dir/spool/%n
SlurmctldPidFile=$dir/run/slurmctld.pid
SlurmdPidFile=$dir/run/slurmd-%n.pid
SlurmctldLogFile=$dir/log/slurmctld.log
SlurmdLogFile=$dir/log/slurmd-%n.log
SlurmctldDebug=info
SlurmdDebug=info
ProctrackType=proctrack/linuxproc
TaskPlugin=task/none
MpiDefault=none
SelectType=select/cons_tres
SelectTypeParameters=CR_Core
GresTypes=gpu
SlurmdParameters=config_overrides
ReturnToService=1
JobRequeue=1
SlurmdTimeout=10
SlurmctldTimeout=30
MessageTimeout=5
KillWait=3
MinJobAge=600
InactiveLimit=0
SchedulerType=sched/backfill
SchedulerParameters=sched_interval=1,bf_interval=1
AccountingStorageType=accounting_storage/none
JobAcctGatherType=jobacct_gather/none
JobCompType=jobcomp/filetxt
JobCompLoc=$dir/log/jobcomp.txt
NodeName=n[1-$nodes] NodeHostname=localhost NodeAddr=127.0.0.1 Port=[$slurmd_port-$last_port] CPUs=4 RealMemory=2048 Gres=gpu:$gpus Features=gpu State=UNKNOWN
PartitionName=gpu Nodes=n[1-$nodes] Default=YES MaxTime=INFINITE State=UP
EOF
    cat >"$dir/etc/gres.conf" <<EOF
NodeName=n[1-$nodes] Name=gpu File=/run/fakegpu/nvidia[0-$((gpus - 1))]
EOF
    # What an agent would report per node: identical PCI topology on every node (as on a
    # real cluster), unique UUIDs.
    {
        echo "{"
        local n i sep_n="" sep_i
        for ((n = 1; n <= nodes; n++)); do
            printf '%s  "n%d": [' "$sep_n" "$n"
            sep_i=""
            for ((i = 0; i < gpus; i++)); do
                printf '%s{"index": %d, "uuid": "GPU-5a7e0000-0000-4000-8000-%012d", ' \
                    "$sep_i" "$i" $((n * 100 + i))
                printf '"pci_bus_id": "0000:%02x:00.0", "model": "stand-in H100", ' $((0x18 + i * 0x10))
                printf '"memory_mb": 81559, "host": "n%d"}' "$n"
                sep_i=", "
            done
            printf ']'
            sep_n=$',\n'
        done
        printf '\n}\n'
    } >"$dir/inventory.json"
    local n
    for n in $(node_names); do
        mkdir -p "$dir/nodes/$n" "$dir/spool/$n"
        touch "$dir/nodes/$n/kern.log"
    done
}

start_munge() {
    local m="$dir/munge"
    if pid_alive "$(pid_of "$m/munged.pid")"; then
        return 0
    fi
    mkdir -p "$m"
    if [ ! -s "$m/munge.key" ]; then
        dd if=/dev/urandom of="$m/munge.key" bs=1024 count=1 status=none
    fi
    chown -R munge:munge "$m"
    chmod 0755 "$m"
    chmod 0600 "$m/munge.key"
    # munged refuses to run as root: use the account Debian's package created.
    runuser -u munge -- munged --force --key-file="$m/munge.key" --socket="$m/munge.socket" \
        --pid-file="$m/munged.pid" --log-file="$m/munged.log" --seed-file="$m/munged.seed" \
        || { cat "$m/munged.log" >&2 2>/dev/null; die "munged did not start"; }
    local t
    for t in $(seq 1 50); do
        [ -S "$m/munge.socket" ] && return 0
        sleep 0.1
    done
    die "munged socket $m/munge.socket did not appear"
}

wait_for() {  # wait_for SECONDS DESCRIPTION COMMAND...
    local limit="$1" what="$2"
    shift 2
    local end=$((SECONDS + limit))
    while ! "$@" >/dev/null 2>&1; do
        if [ "$SECONDS" -ge "$end" ]; then
            return 1
        fi
        sleep 0.2
    done
    say "$what"
}

start_ctld() {
    if pid_alive "$(pid_of "$dir/run/slurmctld.pid")"; then
        return 0
    fi
    slurmctld -f "$conf" || { tail -20 "$dir/log/slurmctld.log" >&2; die "slurmctld did not start"; }
    wait_for 30 "slurmctld answers" scontrol ping \
        || { tail -20 "$dir/log/slurmctld.log" >&2; die "slurmctld does not answer scontrol ping"; }
}

start_slurmd() {
    local n="$1"
    if pid_alive "$(pid_of "$dir/run/slurmd-$n.pid")"; then
        return 0
    fi
    slurmd -f "$conf" -N "$n" || { tail -20 "$dir/log/slurmd-$n.log" >&2; die "slurmd $n did not start"; }
}

all_responding() {  # every node registered and answering (whatever it runs)
    local states
    states="$(sinfo -h -N -o '%T' 2>/dev/null)" || return 1
    [ -n "$states" ] || return 1
    ! echo "$states" | grep -q -e unknown -e '\*' -e not_responding -e '^down'
}

all_idle() {
    local states
    states="$(sinfo -h -N -o '%N %T' 2>/dev/null)" || return 1
    [ -n "$states" ] || return 1
    [ "$(echo "$states" | awk '$2 != "idle"' | wc -l)" -eq 0 ]
}

running() {
    [ -f "$conf" ] || return 1
    pid_alive "$(pid_of "$dir/munge/munged.pid")" || return 1
    pid_alive "$(pid_of "$dir/run/slurmctld.pid")" || return 1
    local n
    for n in $(node_names); do
        pid_alive "$(pid_of "$dir/run/slurmd-$n.pid")" || return 1
    done
    scontrol ping >/dev/null 2>&1
}

print_env() { echo "export SLURM_CONF=$conf"; }

# The pids of processes started for this cluster: daemons from their pid files, and
# anything whose command line names this cluster's directory (a daemon whose pid file is
# gone, slurmstepd started with our config).
our_pids() {
    local f p
    for f in "$dir"/run/*.pid "$dir/munge/munged.pid"; do
        p="$(pid_of "$f")"
        pid_alive "$p" && echo "$p"
    done
    for p in /proc/[0-9]*; do
        p="${p#/proc/}"
        [ "$p" = "$$" ] && continue
        if { tr '\0' ' ' <"/proc/$p/cmdline"; } 2>/dev/null | grep -qF -- "$dir/"; then
            echo "$p"
        fi
    done
}

# Tasks of one node: processes whose environment says SLURMD_NODENAME=<node> and
# SLURM_CONF=<this cluster's config> (another local cluster on the host has nodes of the
# same names), and the slurmstepd that is their parent.
node_task_pids() {
    local n="$1" f p ppid
    # One grep over every environment (NUL-separated entries): fast, so a node dies at once.
    for f in $(grep -lsxz -- "SLURMD_NODENAME=$n" /proc/[0-9]*/environ 2>/dev/null); do
        grep -qsxzF -- "SLURM_CONF=$conf" "$f" || continue
        p="${f#/proc/}"
        p="${p%/environ}"
        echo "$p"
        ppid="$(awk '{print $4}' "/proc/$p/stat" 2>/dev/null || true)"
        if [ -n "$ppid" ] && grep -q slurmstepd "/proc/$ppid/comm" 2>/dev/null; then
            echo "$ppid"
        fi
    done | sort -u
}

up() {
    mkdir -p "$dir"
    if running; then
        print_env
        return 0
    fi
    [ "$(id -u)" = "0" ] || die "needs root (daemons, mknod); run it as root or with sudo"
    install_packages
    fake_gpus
    write_config
    start_munge
    start_ctld
    local n
    for n in $(node_names); do
        start_slurmd "$n"
    done
    # Nodes left DOWN in saved state (a previous run) are resumed; a drain stays.
    if ! wait_for 15 "all nodes responding" all_responding; then
        local n
        for n in $(sinfo -h -N -t down -o '%N' 2>/dev/null | sort -u); do
            scontrol update nodename="$n" state=resume >/dev/null 2>&1 || true
        done
        wait_for 30 "all nodes responding" all_responding \
            || { sinfo -N >&2; die "nodes did not come up"; }
    fi
    print_env
}

down() {
    local pids
    pids="$(our_pids | sort -u | tr '\n' ' ')"
    if [ -n "${pids// /}" ]; then
        # shellcheck disable=SC2086
        kill $pids 2>/dev/null || true
        local t
        for t in $(seq 1 30); do
            local alive=""
            for p in $pids; do pid_alive "$p" && alive="$alive $p"; done
            [ -z "$alive" ] && break
            sleep 0.1
        done
        for p in $pids; do pid_alive "$p" && kill -9 "$p" 2>/dev/null || true; done
    fi
    rm -rf "$dir"
    say "down"
}

reset() {
    { [ -f "$conf" ] && pid_alive "$(pid_of "$dir/run/slurmctld.pid")"; } || die "not up (run: $0 up)"
    scancel --full --quiet "--user=$(id -un)" >/dev/null 2>&1 || true
    local n
    for n in $(node_names); do
        start_slurmd "$n"
    done
    local t
    for t in $(seq 1 100); do
        [ -z "$(squeue -h -o %i 2>/dev/null)" ] && break
        sleep 0.2
    done
    scontrol update nodename="n[1-$nodes]" state=resume >/dev/null 2>&1 || true
    wait_for 60 "all nodes idle" all_idle || { sinfo -N >&2; die "nodes did not become idle"; }
}

node_kill() {
    local n="${1:-}"
    [[ "$n" =~ ^n[0-9]+$ ]] || die "node-kill: bad node name '$n'"
    local pids
    pids="$(pid_of "$dir/run/slurmd-$n.pid") $(node_task_pids "$n" | tr '\n' ' ')"
    # shellcheck disable=SC2086
    kill -9 $pids 2>/dev/null || true
    rm -f "$dir/run/slurmd-$n.pid"
    say "killed $n (slurmd and tasks:$pids)"
}

case "$cmd" in
    up) up ;;
    down) down ;;
    status)
        if running; then
            sinfo -N
            exit 0
        fi
        say "not up"
        exit 1
        ;;
    reset) reset ;;
    node-kill) node_kill "${2:-}" ;;
    node-up)
        [[ "${2:-}" =~ ^n[0-9]+$ ]] || die "node-up: bad node name '${2:-}'"
        start_slurmd "$2"
        ;;
    env) print_env ;;
    *) die "usage: $0 up|down|status|reset|node-kill NODE|node-up NODE|env" ;;
esac
