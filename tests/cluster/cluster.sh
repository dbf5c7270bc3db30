#!/usr/bin/env bash
# A cluster of N hosts on this machine, for suite multinode (docs/multinode.md,
# "The multinode suite"). Each host is a process holding its own network, UTS
# (hostname) and mount namespaces: its own /tmp, /dev/shm and node-local folder
# /mnt, one veth cable to a bridge that lives in a namespace of its own.
# Nothing touches the machine's interfaces, default route or /etc/hosts; the
# root namespace only gets a blackhole route for the cluster's subnet while it
# is up (so nothing sent there can leave), and `down` removes everything.
#
#   cluster.sh up DIR N       bring up hosts h0..h(N-1) (DIR: an empty folder of its own)
#   cluster.sh exec DIR K CMD...   run CMD on host K with an ssh-like fresh environment
#   cluster.sh nsexec DIR K CMD... run CMD on host K with this environment
#   cluster.sh ssh DIR [OPTS] HOST CMD...  the rsh agent Open MPI calls (DIR/bin/ssh)
#   cluster.sh cable DIR K up|down  plug or pull host K's cable (its end at the bridge)
#   cluster.sh kill DIR K     end every process on host K (a crashed host), cable pulled
#   cluster.sh revive DIR K   host K back (rebooted when it was cut off): cable plugged, every
#                             host reaching it over TCP, its slurmd up
#   cluster.sh slurm DIR      munge, slurmctld on h0 and a slurmd per host (DIR/slurm)
#   cluster.sh down DIR       end every process the cluster holds, remove it all
#
# Exit 77 (meson's "skipped") with one line saying why when not root or when
# namespaces, veth or bridges are not available here.
set -euo pipefail
self=$(readlink -f "$0")
cmd=${1:?usage: cluster.sh up|exec|nsexec|ssh|cable|kill|down DIR ...}
dir=${2:?usage: cluster.sh $cmd DIR ...}
shift 2

pid_of() { cat "$dir/pid.$1"; }
n_hosts() { cat "$dir/hosts"; }

# The processes in host k's network namespace (the holder included): all of
# them were started through this script, nothing else can enter it.
procs_in() {
    local ns p
    ns=$(cat "$dir/ns.$1" 2>/dev/null) || return 0
    [ -n "$ns" ] || return 0
    for p in /proc/[0-9]*; do
        [ "$(readlink "$p/ns/net" 2>/dev/null)" = "$ns" ] && echo "${p#/proc/}"
    done
    return 0
}

# Host j reaches host k over TCP: a connection to a port nobody listens on
# (9) is refused by k's kernel, which proves the path both ways (j's SYN
# reached k, k's reset came back); one that something listens on is
# accepted. A SYN lost on a cable just plugged (its queue not yet started),
# an unanswered ARP or a pulled cable is neither within the second.
answers() {
    local out
    out=$(nsenter -t "$(pid_of "$1")" -n timeout 1 bash -c "exec 3<>/dev/tcp/$(cat "$dir/subnet").$(($2 + 1))/9" 2>&1) && return 0
    case "$out" in *"Connection refused"*) return 0 ;; esac
    return 1
}

# Waits until every other host whose cable is plugged reaches host k over
# TCP (each pair at most 20 s), else says which pair does not and fails: a
# test after a revive starts mpirun at once, and Open MPI gives up on a
# daemon it cannot connect to ("unable to complete a TCP connection").
wait_answers() {
    local k=$1 j t0 tries
    for j in $(seq 0 $(($(n_hosts) - 1))); do
        [ "$j" = "$k" ] && continue
        nsenter -t "$(pid_of bridge)" -n ip link show "c$j" | grep -q 'state UP' || continue
        t0=$(date +%s.%N) tries=0
        until answers "$j" "$k"; do
            tries=$((tries + 1))
            if (($(date +%s) - ${t0%.*} >= 20)); then
                echo "multinode: h$k does not answer TCP from h$j ($(cat "$dir/subnet").$((k + 1)) port 9) after 20 s" >&2
                exit 1
            fi
            sleep 0.1
        done
        # a wait is worth a line in the suite's log: it is what a test would have met
        ((tries == 0)) || echo "multinode: h$k answered h$j over TCP after $(awk "BEGIN{printf \"%.1f\", $(date +%s.%N) - $t0}") s (unanswered probes: $tries)" >&2
    done
}

# ssh's environment: a fresh one, with what sshd sets and nothing of the caller.
fresh_env() {
    echo env -i HOME=/root USER=root LOGNAME=root SHELL=/bin/bash PATH=/usr/local/bin:/usr/bin:/bin:/usr/sbin:/sbin \
        LANG=C.UTF-8
}

case "$cmd" in
up)
    n=${1:?cluster.sh up DIR N}
    skip() { echo "multinode: skipped: $*"; exit 77; }
    [ "$(id -u)" = 0 ] || skip "needs root (network, UTS and mount namespaces, veth cables, a bridge)"
    for t in unshare nsenter ip; do command -v $t >/dev/null || skip "needs $t (util-linux, iproute2)"; done
    unshare --net --uts --mount true 2>/dev/null || skip "this machine refuses new network/UTS/mount namespaces"
    unshare --net sh -c 'ip link add cdpt0 type veth peer name cdpt1 && ip link add cdpbr type bridge' 2>/dev/null \
        || skip "this kernel has no veth or bridge links"
    mkdir -p "$dir"
    echo "$n" > "$dir/hosts"
    # a /24 of 10.213.0.0/16 nobody uses: no address, no route but the default;
    # the blackhole route claims it (a second cluster gets "File exists")
    subnet=
    for x in $(seq 1 250); do
        net=10.213.$x
        ip -o addr | grep -q " $net\." && continue
        [ -z "$(ip route show match "$net.0/24" | grep -v '^default')" ] || continue
        if ip route add blackhole "$net.0/24" 2>/dev/null; then subnet=$net; break; fi
    done
    [ -n "$subnet" ] || { echo "multinode: no free /24 in 10.213.0.0/16" >&2; exit 1; }
    echo "$subnet" > "$dir/subnet"
    # the bridge's namespace
    # holders in sessions of their own: a signal to the caller's process group leaves them for `down`
    setsid unshare --net sh -c 'ip link set lo up; ip link add br0 type bridge; ip link set br0 up; exec sleep 1000000' </dev/null >/dev/null 2>&1 &
    echo $! > "$dir/pid.bridge"
    # a checkout or cluster folder under /tmp would be hidden by a host's
    # private /tmp: the machine's /tmp is bound on /mnt for a moment, each
    # such top folder bound back from there, and /mnt let go
    keep= pre= post=
    for p in "$dir" "$(dirname "$(dirname "$(dirname "$self")")")"; do
        p=$(readlink -f "$p")
        case "$p" in /tmp/?*) t=${p#/tmp/}; t=/tmp/${t%%/*}
            case "$keep" in *"'$t'"*) ;; *) keep="$keep mkdir -p '$t' && mount --bind '/mnt${t#/tmp}' '$t' &&" ;; esac ;;
        esac
    done
    [ -z "$keep" ] || { pre="mount --bind /tmp /mnt &&"; post="umount /mnt &&"; }
    for k in $(seq 0 $((n - 1))); do
        mkdir -p "$dir/h$k"
        # a host: hostname, private /tmp, /dev/shm and node-local /mnt, no IPv6
        # (Open MPI takes every address of the subnet's interface, the IPv6
        # link-local one too, tentative for its first seconds), then wait
        setsid unshare --net --uts --mount --propagation private sh -c "
            hostname h$k && $pre mount -t tmpfs -o size=1g,mode=1777 cdp-tmp /tmp && $keep $post
            mount -t tmpfs -o size=256m cdp-shm /dev/shm && mount -t tmpfs -o size=512m cdp-local /mnt &&
            { sysctl -qw net.ipv6.conf.all.disable_ipv6=1 net.ipv6.conf.default.disable_ipv6=1 2>/dev/null || :; } &&
            ip link set lo up && touch '$dir/h$k/ready' && exec sleep 1000000" </dev/null >/dev/null 2>"$dir/h$k/log" &
        echo $! > "$dir/pid.$k"
    done
    for k in bridge $(seq 0 $((n - 1))); do
        for _ in $(seq 100); do
            if [ "$k" = bridge ]; then nsenter -t "$(pid_of bridge)" -n ip link show br0 >/dev/null 2>&1 && break
            else [ -e "$dir/h$k/ready" ] && break; fi
            sleep 0.05
        done
    done
    b=$(pid_of bridge)
    readlink "/proc/$b/ns/net" > "$dir/ns.bridge"
    for k in $(seq 0 $((n - 1))); do
        [ -e "$dir/h$k/ready" ] || { echo "multinode: host h$k did not come up" >&2; exit 1; }
        p=$(pid_of "$k")
        # what `down` ends: every process in this namespace, holder or not
        readlink "/proc/$p/ns/net" > "$dir/ns.$k"
        # the cable: made in the bridge's namespace, its far end moved into the host
        nsenter -t "$b" -n ip link add "c$k" type veth peer name eth0 netns "$p"
        nsenter -t "$b" -n ip link set "c$k" master br0
        nsenter -t "$b" -n ip link set "c$k" up
        nsenter -t "$p" -n ip addr add "$subnet.$((k + 1))/24" dev eth0
        nsenter -t "$p" -n ip link set eth0 up
        echo "$subnet.$((k + 1)) h$k" >> "$dir/addresses"
    done
    # the rsh agent Open MPI calls, with this cluster's folder in it
    mkdir -p "$dir/bin"
    printf '#!/bin/sh\nexec %s ssh %s "$@"\n' "$self" "$dir" > "$dir/bin/ssh"
    chmod +x "$dir/bin/ssh"
    # every host reaches every other
    for k in $(seq 0 $((n - 1))); do wait_answers "$k"; done
    ;;
exec | nsexec)
    k=${1:?cluster.sh $cmd DIR K CMD...}
    shift
    p=$(pid_of "$k")
    if [ "$cmd" = exec ]; then
        # shellcheck disable=SC2046
        exec nsenter -t "$p" -n -u -m -- $(fresh_env) "$@"
    fi
    exec nsenter -t "$p" -n -u -m --wd="$PWD" -- "$@"
    ;;
ssh)
    # Open MPI's rsh launcher: [options] HOST COMMAND (one string, or words)
    while [ $# -gt 0 ]; do
        case "$1" in
        -[lpioeFJLRDWw]) shift 2 ;;
        -*) shift ;;
        *) break ;;
        esac
    done
    host=${1:?no host}
    shift
    k=
    while read -r addr name; do
        [ "$host" = "$name" ] || [ "$host" = "$addr" ] && k=${name#h}
    done < "$dir/addresses"
    [ -n "$k" ] || { echo "ssh: Could not resolve hostname $host: Name or service not known" >&2; exit 255; }
    # a pulled cable or a dead host: ssh would time out; say so at once
    if ! nsenter -t "$(pid_of bridge)" -n ip link show "c$k" 2>/dev/null | grep -q 'state UP'; then
        echo "ssh: connect to host $host port 22: No route to host" >&2
        exit 255
    fi
    # shellcheck disable=SC2046
    exec nsenter -t "$(pid_of "$k")" -n -u -m -- $(fresh_env) /bin/sh -c "$*"
    ;;
slurm)
    # munge (one daemon on h0; its socket is a file every host sees), slurmctld
    # on h0 and one slurmd per host, all state, logs and config under DIR/slurm,
    # each node's spool and TmpFS in its node-local /mnt
    for t in munged slurmctld slurmd srun sinfo; do
        command -v $t >/dev/null || { echo "multinode: Slurm skipped: no $t (apt-get install slurmctld slurmd slurm-client munge)"; exit 77; }
    done
    n=$(n_hosts)
    net=$(cat "$dir/subnet")
    s="$dir/slurm"
    mkdir -p "$s/munge" "$s/state" "$s/log"
    chmod 700 "$s/munge"
    head -c 1024 /dev/urandom > "$s/munge/munge.key"
    chmod 400 "$s/munge/munge.key"
    nodes=
    for k in $(seq 0 $((n - 1))); do
        nodes="${nodes}NodeName=h$k NodeAddr=$net.$((k + 1)) NodeHostname=h$k CPUs=2 RealMemory=2000 State=UNKNOWN
"
    done
    cat > "$s/slurm.conf" <<CONF
ClusterName=cdp
SlurmctldHost=h0($net.1)
SlurmUser=root
SlurmdUser=root
AuthType=auth/munge
AuthInfo=socket=$s/munge/munge.socket
CredType=cred/munge
SlurmctldPort=6817
SlurmdPort=6818
StateSaveLocation=$s/state
SlurmdSpoolDir=/mnt/slurmd
TmpFS=/mnt
SlurmctldPidFile=$s/slurmctld.pid
SlurmdPidFile=/tmp/slurmd.pid
SlurmctldLogFile=$s/log/slurmctld.log
SlurmdLogFile=$s/log/slurmd-%n.log
SlurmctldDebug=info
SlurmdDebug=info
ProctrackType=proctrack/linuxproc
TaskPlugin=task/none
JobAcctGatherType=jobacct_gather/none
AccountingStorageType=accounting_storage/none
JobCompType=jobcomp/none
SwitchType=switch/none
MpiDefault=pmix
ReturnToService=2
SlurmdTimeout=30
InactiveLimit=0
KillWait=5
MinJobAge=30
SchedulerType=sched/builtin
SelectType=select/cons_tres
SelectTypeParameters=CR_Core
$nodes
PartitionName=main Nodes=ALL Default=YES MaxTime=INFINITE State=UP OverSubscribe=YES
CONF
    echo "SLURM_CONF=$s/slurm.conf" > "$s/env"
    "$self" nsexec "$dir" 0 munged --force --socket="$s/munge/munge.socket" --key-file="$s/munge/munge.key" \
        --pid-file="$s/munge/munged.pid" --log-file="$s/log/munged.log" --seed-file="$s/munge/seed" </dev/null >/dev/null 2>&1
    "$self" nsexec "$dir" 0 slurmctld -f "$s/slurm.conf" -i </dev/null >"$s/log/slurmctld.out" 2>&1
    for k in $(seq 0 $((n - 1))); do
        "$self" nsexec "$dir" "$k" slurmd -f "$s/slurm.conf" -N "h$k" </dev/null >"$s/log/slurmd-h$k.out" 2>&1
    done
    for _ in $(seq 100); do
        idle=$("$self" nsexec "$dir" 0 env SLURM_CONF="$s/slurm.conf" sinfo -h -o '%t %D' 2>/dev/null | awk '$1=="idle"{print $2}')
        [ "$idle" = "$n" ] && exit 0
        sleep 0.2
    done
    echo "multinode: Slurm did not come up: $("$self" nsexec "$dir" 0 env SLURM_CONF="$s/slurm.conf" sinfo 2>&1)" >&2
    tail -5 "$s/log/slurmctld.log" "$s"/log/slurmd-h*.log >&2 2>/dev/null
    exit 1
    ;;
revive)
    # host K back as after a reboot: its cable plugged, its slurmd started again.
    # A host whose cable was pulled is rebooted too (what ran there ended):
    # a slurmd that starts registers at once, where one that was cut off
    # keeps the node "completing" until slurmctld asks again (a minute)
    k=${1:?cluster.sh revive DIR K}
    rebooted=
    if ! nsenter -t "$(pid_of bridge)" -n ip link show "c$k" | grep -q 'state UP'; then
        rebooted=1
        holder=$(pid_of "$k")
        for p in $(procs_in "$k"); do [ "$p" = "$holder" ] || kill -KILL "$p" 2>/dev/null || true; done
        for _ in $(seq 50); do
            [ "$(procs_in "$k")" = "$holder" ] && break
            sleep 0.1
        done
    fi
    nsenter -t "$(pid_of bridge)" -n ip link set "c$k" up
    wait_answers "$k"
    s="$dir/slurm"
    [ -e "$s/slurm.conf" ] || exit 0
    running=
    for p in $(procs_in "$k"); do [ "$(cat "/proc/$p/comm" 2>/dev/null)" = slurmd ] && running=1; done
    [ -n "$running" ] || "$self" nsexec "$dir" "$k" slurmd -f "$s/slurm.conf" -N "h$k" </dev/null >>"$s/log/slurmd-h$k.out" 2>&1
    for _ in $(seq 300); do
        state=$("$self" nsexec "$dir" 0 env SLURM_CONF="$s/slurm.conf" sinfo -h -n "h$k" -o '%t' 2>/dev/null)
        [ "$state" = idle ] && exit 0
        # a node that was not cut off finishes ending its last job by itself
        # (a job that needs it waits for that)
        [ -z "$rebooted" ] && [ "$state" = comp ] && exit 0
        # a node Slurm marked down for not answering comes back when told; a
        # rebooted one still "completing" the job it was cut from is told down
        # (what ran there is gone) and back
        case "$state" in
        down* | drain*) "$self" nsexec "$dir" 0 env SLURM_CONF="$s/slurm.conf" \
            scontrol update nodename="h$k" state=resume >/dev/null 2>&1 ;;
        comp*) [ -z "$rebooted" ] || "$self" nsexec "$dir" 0 env SLURM_CONF="$s/slurm.conf" \
            scontrol update nodename="h$k" state=down reason=rebooted >/dev/null 2>&1 ;;
        esac
        sleep 0.2
    done
    echo "multinode: h$k did not come back to Slurm: $state" >&2
    exit 1
    ;;
cable)
    k=${1:?cluster.sh cable DIR K up|down}
    nsenter -t "$(pid_of bridge)" -n ip link set "c$k" "${2:?up or down}"
    ;;
kill)
    k=${1:?cluster.sh kill DIR K}
    nsenter -t "$(pid_of bridge)" -n ip link set "c$k" down
    holder=$(pid_of "$k")
    for p in $(procs_in "$k"); do [ "$p" = "$holder" ] || kill -KILL "$p" 2>/dev/null || true; done
    ;;
down)
    [ -e "$dir/hosts" ] || exit 0
    n=$(n_hosts)
    for k in $(seq 0 $((n - 1))); do
        [ -e "$dir/pid.$k" ] || continue
        for p in $(procs_in "$k"); do kill -KILL "$p" 2>/dev/null || true; done
    done
    for p in $(procs_in bridge); do kill -KILL "$p" 2>/dev/null || true; done
    for _ in $(seq 50); do
        alive=
        for k in bridge $(seq 0 $((n - 1))); do alive="$alive$(procs_in "$k")"; done
        [ -z "$alive" ] && break
        sleep 0.1
    done
    [ -e "$dir/subnet" ] && ip route del blackhole "$(cat "$dir/subnet").0/24" 2>/dev/null || true
    rm -f "$dir"/pid.* "$dir"/ns.* "$dir/subnet" "$dir/hosts" "$dir/addresses"
    ;;
*)
    echo "cluster.sh: unknown command $cmd" >&2
    exit 2
    ;;
esac
