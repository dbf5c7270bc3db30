#!/usr/bin/env bash
# Pipeline executor on this machine: per step, the time in compute, in
# communication, waiting on peers (the bubble) and the executor's own overhead,
# and the measured bubble against each schedule's closed form (docs/simulator.md:
# gpipe, 1f1b (p-1)/(m+p-1); zb-h1, zb-h2 (p-1)/(3m+p-1); zbv (p-1+e)/(6m+p-1+e),
# e = max(0, 2p-2-m), the split ones at equal forward, input- and weight-gradient
# times), with each step time's ratio to 1f1b's of the same model and m in the
# same run, for balanced stages (an MLP of equal layers; a GPT) on 2 stages x 1
# replica, one BLAS thread per rank, where each rank has a core of its own.
#
#   bench/pipeline.sh [build dir]      (default: build)
set -euo pipefail
cd "$(dirname "$0")/.."
bin="${1:-build}/cdphybrid"
tmp=$(mktemp -d)
trap 'rm -rf "$tmp"' EXIT

mlp='"model": {"preset": "mlp", "input": [1024], "hidden": [1024, 1024, 1024, 1024, 1024], "classes": 1024}'
gpt='"model": {"preset": "gpt", "vocab": 256, "context": 64, "layers": 6, "heads": 4, "embed": 192}'
p=2

printf '%-5s %-6s %2s %3s %10s %9s %9s %9s %15s %8s %11s %8s\n' model sched p m "step ms" "compute" "comm" \
    "waiting" "overhead" "bubble" "closed form" "vs 1f1b"
for model in mlp gpt; do
    for m in 2 4 8; do
        base=
        for sched in 1f1b gpipe zb-h1 zb-h2 zbv; do
            spec=$mlp; mb=32
            if [ $model = gpt ]; then spec=$gpt; mb=4; fi
            cat > "$tmp/p.json" <<JSON
{ $spec, "data": {"source": "synthetic"},
  "train": {"steps": 12, "micro_batch": $mb, "log_every": 1000, "eval_batches": 1},
  "parallel": {"stages": $p, "replicas": 1, "micro_batches": $m, "schedule": "$sched"},
  "cluster": {"backend": "cpu"} }
JSON
            line=$(OPENBLAS_NUM_THREADS=1 "$bin" --plan "$tmp/p.json" | grep '^per step')
            # "per step (mean over ranks): A ms compute, B ms communication, C ms waiting on peers, D ms executor overhead; bubble E%"
            read -r c k w o b <<<"$(sed -E 's/.*: ([0-9.]+) ms compute, ([0-9.]+) ms communication, ([0-9.]+) ms waiting on peers, ([0-9.-]+) ms executor overhead; bubble ([0-9.]+)%.*/\1 \2 \3 \4 \5/' <<<"$line")"
            step=$(awk -v a="$c" -v b="$k" -v d="$w" -v e="$o" 'BEGIN{printf "%.1f", a+b+d+e}')
            [ -z "$base" ] && base=$step
            ideal=$(awk -v m="$m" -v p=$p -v s="$sched" 'BEGIN{
                e = 2*p-2-m; if (e < 0) e = 0
                if (s == "zbv") f = (p-1+e)/(6*m+p-1+e); else if (s ~ /^zb-/) f = (p-1)/(3*m+p-1); else f = (p-1)/(m+p-1)
                printf "%.1f%%", 100*f}')
            share=$(awk -v o="$o" -v s="$step" 'BEGIN{printf "%.2f%%", (s > 0 ? 100 * o / s : 0)}')
            ratio=$(awk -v s="$step" -v b="$base" 'BEGIN{printf "%.3f", (b > 0 ? s / b : 0)}')
            printf '%-5s %-6s %2d %3d %10s %9s %9s %9s %15s %7s%% %11s %8s\n' $model $sched $p "$m" "$step" "$c" "$k" \
                "$w" "$o ($share)" "$b" "$ideal" "$ratio"
        done
    done
done
