#!/usr/bin/env bash
# Suite multinode: brings up a cluster of 3 hosts on this machine
# (tests/cluster/cluster.sh), runs test-multinode on host 0 with Open MPI
# reaching the others through the cluster's rsh agent, and takes the cluster
# down on every exit. Without root or namespaces the cluster's tests skip,
# with one line saying why, and the rest run here.
#   multinode.sh SOURCE_ROOT BUILD_ROOT TEST_PROGRAM
set -uo pipefail
src=$1 build=$2 prog=$3
shift 3
cl="$src/tests/cluster/cluster.sh"
dir=$(mktemp -d "$build/multinode-XXXXXX")
trap '"$cl" down "$dir" >/dev/null 2>&1; rm -rf "$dir"' EXIT
trap 'exit 143' TERM INT
start=$(date +%s)
why=$("$cl" up "$dir" 3 2>&1)
rc=$?
if [ $rc != 0 ]; then
    [ $rc = 77 ] || { echo "multinode: the cluster did not come up: $why" >&2; exit 1; }
    echo "$why"
    CDP_CLUSTER_WHY=$why CDP_SLURM_WHY="no cluster" "$prog" --jobs 1 "$@" &
    wait $!
    exit $?
fi
mkdir -p "$dir/shared"
subnet=$(cat "$dir/subnet").0/24
echo "multinode: 3 hosts h0 h1 h2 on $subnet (blackholed outside), up in $(( $(date +%s) - start )) s"
# Slurm on the same hosts: without its packages its tests skip, saying so
slurm=(CDP_SLURM_WHY=)
why=$("$cl" slurm "$dir" 2>&1)
case $? in
0) slurm=(SLURM_CONF="$dir/slurm/slurm.conf"); echo "multinode: Slurm up (slurmctld on h0, slurmd on h0 h1 h2)" ;;
77) echo "$why"; slurm=(CDP_SLURM_WHY="$why") ;;
*) echo "multinode: Slurm did not come up: $why" >&2; exit 1 ;;
esac
# the program runs on host 0 with this environment; what it starts elsewhere
# goes through the agent. Open MPI's daemons and ranks talk over the cluster's
# subnet only, IPv4 only (an address outside it, or a link-local IPv6 one,
# is one more for a connection to try and fail on). In the background, so that a TERM runs the trap at once.
"$cl" nsexec "$dir" 0 env CDP_CLUSTER="$cl" CDP_CLUSTER_DIR="$dir" TMPDIR="$dir/shared" \
    OMPI_MCA_plm_rsh_agent="$dir/bin/ssh" OMPI_MCA_oob_tcp_if_include="$subnet" \
    OMPI_MCA_btl_tcp_if_include="$subnet" OMPI_MCA_oob_tcp_disable_ipv6_family=1 OMPI_MCA_btl_tcp_disable_family=6 \
    "${slurm[@]}" "$prog" --jobs 1 "$@" &
wait $!
rc=$?
echo "multinode: $(( $(date +%s) - start )) s in all"
exit $rc
