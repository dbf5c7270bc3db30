#!/usr/bin/env bash
# shellcheck disable=SC2317 # the stage_* functions are called by name, through run_stage
# GPU checks for a machine with an NVIDIA GPU (CUDA at /usr/local/cuda): builds
# cdphybrid with the CUDA and cuDNN kernels, lists the GPUs, runs the gpu_ops
# suite (every kernel against the CPU reference) and `cdphybrid doctor`, trains
# the GPT example on one GPU (a world of one, NCCL set up) and as a 2-stage
# pipeline of ranks sharing the GPU (when mpirun is there), runs the NCCL
# communicator tests, and times a GPT-2 124M step (B=8, T=1024, bf16) against
# PyTorch eager on the same GPU; it ends with one table: stage | result |
# seconds | note. Every stage runs under `timeout`, and the whole run stays
# inside a time budget (7.5 min by default). On a machine that returns at most
# a few files, archive the logs: tar czf $OUT/gpu-check.tgz -C build-gpu-logs .
#
#   tools/gpu-check.sh                         run every stage
#   GPU_CHECK_LOGDIR=$OUT/gpu-check tools/gpu-check.sh
#                                              keep each stage's full log there
#                                              (7 files: a log per stage and
#                                              the suite's JSON report)
#
# GPU_CHECK_PREBUILT=DIR: a machine without the build's dependencies (jansson,
# OpenBLAS, Criterion headers) runs a build made elsewhere: DIR holds it as
# `meson compile` left it (cdphybrid, libcdphybrid.so*, libcdphybrid-cuda.so,
# tests/, bench/), with the libraries it needs beside it in DIR/lib;
# configure and compile then only check that every binary's libraries load.
#
# Environment: GPU_CHECK_BUILD (build folder, default build-gpu),
# GPU_CHECK_LOGDIR (logs, default <build>-logs), GPU_CHECK_BUDGET (seconds for
# the whole run, default 450), GPU_CHECK_MESON_ARGS (more `meson setup`
# arguments), GPU_CHECK_JOBS (parallel test processes, default 8),
# GPU_CHECK_CUDNN (the cudnn feature: enabled by default; auto builds without
# cuDNN where its header is not under $CUDA_HOME).
# Exit status: 0 when every stage passed, 1 otherwise.
#
# Adding a stage: write a function stage_<name> that runs its commands (its
# output goes to the stage's log; set NOTE for the summary's last column,
# return non-zero for FAIL) and append "<name> <timeout-seconds> <needs>" to
# STAGES below, where <needs> is the stage that must have passed first, or "-".
set -uo pipefail

ROOT=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)
cd "$ROOT" || exit 1
BUILD=${GPU_CHECK_PREBUILT:-${GPU_CHECK_BUILD:-build-gpu}}
case $BUILD in /*) ;; *) BUILD=$ROOT/$BUILD ;; esac
PREBUILT=${GPU_CHECK_PREBUILT:+1}
if [ -n "$PREBUILT" ]; then
    # the build's own libraries, then the pip CUDA libraries PyTorch brings (cuDNN, NCCL)
    pylibs=$(python3 -c 'import glob, nvidia; print(":".join(sorted(glob.glob(nvidia.__path__[0] + "/*/lib"))))' 2>/dev/null)
    export LD_LIBRARY_PATH="$BUILD:$BUILD/lib:${CUDA_HOME:-/usr/local/cuda}/lib64${pylibs:+:$pylibs}${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH}"
fi
LOGDIR=${GPU_CHECK_LOGDIR:-$BUILD-logs}
BUDGET=${GPU_CHECK_BUDGET:-450}
JOBS=${GPU_CHECK_JOBS:-8}
CUDNN=${GPU_CHECK_CUDNN:-enabled}
CUDA_HOME=${CUDA_HOME:-/usr/local/cuda}
# meson finds nvcc through PATH; the toolkit does not put it there
export PATH="$CUDA_HOME/bin:$PATH"
if ! command -v timeout >/dev/null 2>&1; then
    echo "gpu-check: 'timeout' (GNU coreutils) is missing; it bounds every stage" >&2
    exit 1
fi
mkdir -p "$LOGDIR" || exit 1

# name, timeout (s), stage that must have passed first
STAGES=(
    "prereqs 30 -"
    "nvidia_smi 30 -"
    "configure 120 -"
    "compile 300 configure"
    "gpu_ops 180 compile"
    "doctor 60 compile"
    "train_gpt 90 compile"
    "train_pipeline 90 compile"
    "nccl 60 compile"
    "bench 150 compile"
)

NOTE=""

# ---- stages -----------------------------------------------------------------------

have() { command -v "$1" >/dev/null 2>&1; }

# What the build needs and what is missing, each on one line. Fails only on
# what stops the CUDA build; criterion (tests), mpicc and torch are reported.
stage_prereqs() {
    local missing=() optional=() v
    if [ -n "$PREBUILT" ]; then
        NOTE="prebuilt in $BUILD: the build's tools are not needed"
        have nvidia-smi || echo "missing  nvidia-smi (optional)"
        python3 -c "import torch" 2>/dev/null && echo "ok       python3 with torch" ||
            echo "missing  python3 with torch (optional)"
        return 0
    fi
    check() { # check <what> <required|optional> <command...>
        local what=$1 kind=$2
        shift 2
        if "$@" >/dev/null 2>&1; then
            echo "ok       $what"
        elif [ "$kind" = required ]; then
            echo "MISSING  $what (required)"
            missing+=("$what")
        else
            echo "missing  $what (optional)"
            optional+=("$what")
        fi
    }
    check "C compiler (cc)" required have cc
    check "pkg-config" required have pkg-config
    check "meson >= 1.0" required meson_ok
    check "ninja" required have ninja
    check "nvcc ($CUDA_HOME/bin/nvcc)" required test -x "$CUDA_HOME/bin/nvcc"
    check "jansson >= 2.10 (pkg-config jansson)" required pkg-config --atleast-version=2.10 jansson
    check "OpenBLAS (pkg-config openblas)" required pkg-config --exists openblas
    local need_cudnn=required
    [ "$CUDNN" = enabled ] || need_cudnn=optional
    check "cuDNN header ($CUDA_HOME/include/cudnn.h)" "$need_cudnn" test -f "$CUDA_HOME/include/cudnn.h"
    check "cuDNN library ($CUDA_HOME/lib64/libcudnn.so)" "$need_cudnn" cudnn_lib_ok
    if [ ! -f "$CUDA_HOME/include/cudnn.h" ]; then
        v=$(python3 -c 'import nvidia.cudnn, os; print(os.path.dirname(nvidia.cudnn.__file__))' 2>/dev/null)
        [ -n "$v" ] && echo "info     a pip cuDNN is at $v (meson looks only under $CUDA_HOME;" \
            "GPU_CHECK_CUDNN=auto builds without cuDNN)"
    fi
    check "Criterion (pkg-config criterion; without it no test binaries)" optional pkg-config --exists criterion
    check "hwloc >= 2.0 (pkg-config hwloc)" optional pkg-config --atleast-version=2.0 hwloc
    check "mpicc (else -Dmpi=disabled)" optional have mpicc
    check "nvidia-smi" optional have nvidia-smi
    check "python3 with torch (later stages)" optional python3 -c "import torch"
    if have nvcc; then
        v=$(nvcc --version | sed -n 's/.*release \([0-9.]*\).*/\1/p')
        echo "info     nvcc release ${v:-?}"
    fi
    if ((${#missing[@]})); then
        NOTE="missing: $(join "${missing[@]}")"
        return 1
    fi
    ((${#optional[@]})) && NOTE="optional missing: $(join "${optional[@]}")"
    return 0
}

meson_ok() {
    local v
    v=$(meson --version 2>/dev/null) || return 1
    [ "$(printf '%s\n' 1.0.0 "$v" | sort -V | head -n1)" = 1.0.0 ]
}

cudnn_lib_ok() { compgen -G "$CUDA_HOME/lib64/libcudnn.so*" >/dev/null; }

join() {
    local IFS=,
    echo "$*"
}

stage_nvidia_smi() {
    if ! have nvidia-smi; then
        NOTE="nvidia-smi not found (no NVIDIA driver?)"
        return 1
    fi
    nvidia-smi -L || {
        NOTE="nvidia-smi -L failed"
        return 1
    }
    NOTE="$(nvidia-smi -L | grep -c '^GPU') GPU(s): $(nvidia-smi -L | head -n1 | cut -c1-60)"
}

# A prebuilt build: every binary's libraries must resolve here.
prebuilt_check() {
    local f bad=0
    for f in "$BUILD/cdphybrid" "$BUILD/libcdphybrid-cuda.so" "$BUILD"/tests/test-* "$BUILD"/bench/bench-*; do
        [ -f "$f" ] || continue
        if ldd "$f" | grep 'not found'; then
            echo "^ $f"
            bad=1
        fi
    done
    NOTE="prebuilt in $BUILD$( ((bad)) && echo '; libraries missing (see log)')"
    return "$bad"
}

stage_configure() {
    if [ -n "$PREBUILT" ]; then
        prebuilt_check
        return
    fi
    local args=(-Dcuda=enabled "-Dcudnn=$CUDNN")
    if ! have mpicc; then
        args+=(-Dmpi=disabled)
        NOTE="no mpicc: -Dmpi=disabled"
    fi
    # shellcheck disable=SC2206 # word splitting of the extra arguments is wanted
    args+=(${GPU_CHECK_MESON_ARGS:-})
    echo "+ meson setup $BUILD ${args[*]}"
    if [ -f "$BUILD/build.ninja" ]; then
        meson setup --reconfigure "$BUILD" "${args[@]}"
    else
        meson setup "$BUILD" "${args[@]}"
    fi
}

stage_compile() {
    if [ -n "$PREBUILT" ]; then
        NOTE="prebuilt"
        return 0
    fi
    meson compile -C "$BUILD"
}

# The suite binary straight, so that --verbose shows every test and the errors
# each comparison measured. On this machine a skipped cuda_* test means the GPU
# was not usable: that fails the stage.
stage_gpu_ops() {
    local bin="$BUILD/tests/test-gpu_ops" rc skipped
    if [ ! -x "$bin" ]; then
        NOTE="no $bin (Criterion missing when configured?)"
        return 1
    fi
    CDP_MODULE_DIR="$BUILD" "$bin" --verbose --jobs "$JOBS" --timeout 120 \
        --json="$LOGDIR/gpu_ops.json" 2>&1
    rc=$?
    skipped=$(grep -c '^\[SKIP\]' "$STAGE_LOG")
    NOTE=$(grep -o 'Synthesis: .*' "$STAGE_LOG" | tail -n1 | sed 's/Synthesis: //')
    if ((skipped)); then
        NOTE="$NOTE | $skipped skipped"
        echo "gpu-check: $skipped tests skipped; on a GPU machine that is a failure"
        ((rc)) || rc=1
    fi
    return "$rc"
}

stage_doctor() {
    local rc
    CDP_MODULE_DIR="$BUILD" "$BUILD/cdphybrid" doctor
    rc=$?
    NOTE="$(grep -c '^WARN' "$STAGE_LOG") WARN, $(grep -c '^FAIL' "$STAGE_LOG") FAIL"
    NOTE="$NOTE; $(grep -m1 '^can run' "$STAGE_LOG")"
    return "$rc"
}

# The GPT example on one GPU: the executor on a world of one (it sets up NCCL
# when the module has it), bf16 matrix products.
stage_train_gpt() {
    CDP_MODULE_DIR="$BUILD" "$BUILD/cdphybrid" -v --plan examples/gpu-gpt.json || return 1
    NOTE=$(grep -m1 -o 'done: [0-9]* steps in [0-9.]* s, loss [0-9.]* -> [0-9.]*' "$STAGE_LOG")
    [ -n "$NOTE" ]
}

# Two ranks sharing the GPU as a 2-stage 1F1B pipeline (activations and
# gradients through the host); needs mpirun. Return 3: SKIP.
stage_train_pipeline() {
    if ! have mpirun; then
        NOTE="no mpirun on this machine"
        return 3
    fi
    if ! "$BUILD/cdphybrid" --version | grep -q "mpi yes"; then
        NOTE="this build has no MPI"
        return 3
    fi
    CDP_MODULE_DIR="$BUILD" "$BUILD/cdphybrid" --plan examples/gpu-pipeline.json || return 1
    NOTE=$(grep -m1 -o 'done: [0-9]* steps in [0-9.]* s, loss [0-9.]* -> [0-9.]*' "$STAGE_LOG")
    [ -n "$NOTE" ]
}

# The NCCL communicator's GPU tests of suite comm (one GPU: the np1 test; the
# 2-GPU ones skip); they run ranks under mpirun. Return 3: SKIP.
stage_nccl() {
    local bin=$BUILD/tests/test-comm rc
    if ! have mpirun; then
        NOTE="no mpirun on this machine"
        return 3
    fi
    if [ ! -x "$bin" ]; then
        NOTE="no $bin in this build"
        return 3
    fi
    CDP_MODULE_DIR="$BUILD" CDP_BIN="$BUILD/cdphybrid" CDP_COMM_PROBE="$BUILD/tests/comm_probe" \
        OMPI_ALLOW_RUN_AS_ROOT=1 OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1 OMPI_MCA_rmaps_base_oversubscribe=1 \
        "$bin" --verbose --filter='comm/*needs*' 2>&1
    rc=$?
    NOTE=$(grep -o 'Synthesis: .*' "$STAGE_LOG" | tail -n1 | sed 's/Synthesis: //')
    return "$rc"
}

# GPT-2 124M, B=8, T=1024, bf16: our step against PyTorch eager's on this GPU.
stage_bench() {
    local ours=$LOGDIR/bench-cdphybrid.json theirs=$LOGDIR/bench-pytorch.json
    CDP_MODULE_DIR="$BUILD" "$BUILD/bench/bench-gpu-step" --preset gpt2 --batch 8 --seq 1024 \
        --precision bf16 --steps 10 --warmup 3 | tee "$ours" || return 1
    if ! python3 -c 'import torch' 2>/dev/null; then
        NOTE="$(python3 -c 'import json,sys; d=json.load(open(sys.argv[1])); print("cdphybrid %.1f ms/step, MFU %.1f%%; no torch here" % (d["ms_per_step"], 100*d["mfu"]))' "$ours")"
        return 1
    fi
    python3 bench/torch_gpt2_step.py --batch 8 --seq 1024 --precision bf16 --steps 10 --warmup 3 | tee "$theirs" ||
        return 1
    NOTE=$(python3 - "$ours" "$theirs" <<'PY'
import json, sys
a, b = (json.load(open(p)) for p in sys.argv[1:3])
print("cdphybrid %.1f ms vs pytorch %.1f ms per step = %.2fx; MFU %.1f%% (%s)" % (
    a["ms_per_step"], b["ms_per_step"], a["ms_per_step"] / b["ms_per_step"], 100 * a["mfu"], a["device"]))
PY
)
}

# ---- the runner -------------------------------------------------------------------

declare -A RESULT
ORDER=()
SECONDS_TAKEN=()
RESULTS=()
NOTES=()
START=$(date +%s)

run_stage() {
    local name=$1 limit=$2 needs=$3 left t0 t1 rc result
    STAGE_LOG="$LOGDIR/$name.log"
    NOTE=""
    left=$((BUDGET - ($(date +%s) - START)))
    ((limit > left)) && limit=$left
    echo
    echo "==== $name (timeout ${limit}s) ===="
    t0=$(date +%s.%N)
    if [ "$needs" != - ] && [ "${RESULT[$needs]:-}" != PASS ]; then
        result=SKIP
        NOTE="needs $needs"
    elif ((limit < 5)); then
        result=SKIP
        NOTE="time budget (${BUDGET}s) spent"
    else
        # A subshell under `timeout`, so a hung command cannot outlive the stage;
        # NOTE comes back through a file.
        export -f "stage_$name" have join meson_ok cudnn_lib_ok prebuilt_check
        export ROOT BUILD LOGDIR JOBS CUDA_HOME CUDNN STAGE_LOG PREBUILT GPU_CHECK_MESON_ARGS="${GPU_CHECK_MESON_ARGS:-}"
        timeout --kill-after=10 "$limit" bash -o pipefail -c \
            "NOTE=''; stage_$name; rc=\$?; printf '%s' \"\$NOTE\" > '$STAGE_LOG.note'; exit \$rc" \
            >"$STAGE_LOG" 2>&1 </dev/null
        rc=$?
        NOTE=$(cat "$STAGE_LOG.note" 2>/dev/null)
        rm -f "$STAGE_LOG.note"
        case $rc in
        0) result=PASS ;;
        3) result=SKIP ;;
        124 | 137)
            result=TIMEOUT
            NOTE="killed after ${limit}s${NOTE:+; $NOTE}"
            ;;
        *) result=FAIL ;;
        esac
        show_log "$name" "$result"
    fi
    t1=$(date +%s.%N)
    RESULT[$name]=$result
    ORDER+=("$name")
    RESULTS+=("$result")
    SECONDS_TAKEN+=("$(awk -v a="$t0" -v b="$t1" 'BEGIN { printf "%.1f", b - a }')")
    NOTES+=("$NOTE")
    echo "---- $name: $result${NOTE:+ ($NOTE)}"
}

# Short logs in full; long ones (the build) in full only where they failed,
# else their tail. The suite's log: test results and failures, not the
# per-comparison measurements (those stay in the log file).
show_log() {
    local name=$1 result=$2 log="$LOGDIR/$1.log"
    case $name in
    gpu_ops)
        # every cuda_* test skips for the same reason when no GPU is usable: show three
        grep -vE '^\[(RUN |PASS)\]|^\[----\] +measured:' "$log" |
            awk '/^\[SKIP\]/ && ++skips > 3 { next } { print }' | tail -n 150
        echo "(full log with measured errors: $log)"
        ;;
    compile | configure)
        if [ "$result" = PASS ]; then tail -n 5 "$log"; else tail -n 80 "$log"; fi
        ;;
    *) tail -n 60 "$log" ;;
    esac
}

for s in "${STAGES[@]}"; do
    # shellcheck disable=SC2086 # "name timeout needs"
    run_stage $s
done

echo
echo "==== summary (logs in $LOGDIR) ===="
printf '%-14s | %-7s | %7s | %s\n' stage result seconds note
printf '%-14s-+-%-7s-+-%7s-+-%s\n' -------------- ------- ------- ----
status=0
for i in "${!ORDER[@]}"; do
    printf '%-14s | %-7s | %7s | %s\n' "${ORDER[$i]}" "${RESULTS[$i]}" "${SECONDS_TAKEN[$i]}" "${NOTES[$i]}"
    [ "${RESULTS[$i]}" = PASS ] || status=1
done
echo "total: $(($(date +%s) - START))s of a ${BUDGET}s budget"
exit $status
