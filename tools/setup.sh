#!/usr/bin/env bash
# Brings a Debian machine to the point where cdphybrid builds: installs the
# packages that are missing (only those), then configures and builds into
# build/ (or $CDP_BUILD_DIR). Safe to run again; a second run only rebuilds.
#
#   tools/setup.sh                       configure (first time) and build
#   tools/setup.sh -Dcuda=disabled       extra arguments go to `meson setup`
#   CDP_BUILD_DIR=build-asan tools/setup.sh -Db_sanitize=address,undefined
set -euo pipefail
cd "$(dirname "$0")/.."

packages=(gcc libc6-dev meson ninja-build pkg-config libjansson-dev libopenblas-dev libpcre2-dev
          libhwloc-dev hwloc libopenmpi-dev openmpi-bin libcriterion-dev)
missing=()
for p in "${packages[@]}"; do
    dpkg-query -W -f='${Status}' "$p" 2>/dev/null | grep -q 'install ok installed' || missing+=("$p")
done
if ((${#missing[@]})); then
    echo "setup: installing ${missing[*]}"
    sudo=""
    if [ "$(id -u)" -ne 0 ]; then sudo=sudo; fi
    $sudo apt-get update -qq
    DEBIAN_FRONTEND=noninteractive $sudo apt-get install -y -qq --no-install-recommends "${missing[@]}"
fi

# The CUDA toolkit installs nvcc outside PATH; meson finds it through PATH.
if ! command -v nvcc >/dev/null 2>&1 && [ -x /usr/local/cuda/bin/nvcc ]; then
    export PATH="/usr/local/cuda/bin:$PATH"
fi

build="${CDP_BUILD_DIR:-build}"
if [ ! -f "$build/build.ninja" ]; then
    meson setup "$build" "$@"
elif (($#)); then
    meson setup --reconfigure "$build" "$@"
fi
meson compile -C "$build"
