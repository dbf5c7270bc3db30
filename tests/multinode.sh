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
    CDP_CLUSTER_WHY=$why "$prog" --jobs 1 "$@"
    exit $?
fi
mkdir -p "$dir/shared"
subnet=$(cat "$dir/subnet").0/24
echo "multinode: 3 hosts h0 h1 h2 on $subnet (blackholed outside), up in $(( $(date +%s) - start )) s"
# the program runs on host 0 with this environment; what it starts elsewhere goes through the agent
"$cl" nsexec "$dir" 0 env CDP_CLUSTER="$cl" CDP_CLUSTER_DIR="$dir" TMPDIR="$dir/shared" \
    OMPI_MCA_plm_rsh_agent="$dir/bin/ssh" OMPI_MCA_oob_tcp_if_include="$subnet" \
    OMPI_MCA_btl_tcp_if_include="$subnet" "$prog" --jobs 1 "$@"
rc=$?
echo "multinode: $(( $(date +%s) - start )) s in all"
exit $rc
