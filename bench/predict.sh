#!/usr/bin/env bash
# Predicted against measured step time on this machine's CPU: for the pipeline
# example's GPT (examples/pipeline.json, synthetic data) on 2 stages x 1 replica
# (m = 2, 4, 8) and 2 x 2 (m = 4), GPipe and 1F1B, the median step time of a real
# run (steps 3.. of 12, output.metrics time_s) beside `--simulate --costs` on a
# table from `--profile` of the same plan. Every rank and the profile use one
# BLAS thread (OPENBLAS_NUM_THREADS=1), as each rank has a core to itself.
# 2 x 2 runs 4 ranks: on a machine with fewer cores they share them, which the
# prediction (one device per rank) does not model; the script says so.
#
#   bench/predict.sh [build dir]      (default: build)
set -euo pipefail
cd "$(dirname "$0")/.."
bin="$(cd "${1:-build}" && pwd)/cdphybrid"
tmp=$(mktemp -d)
trap 'rm -rf "$tmp"' EXIT
export OPENBLAS_NUM_THREADS=1
cores=$(nproc)

printf '%-7s %-6s %2s %12s %13s %8s  %s\n' layout sched m "measured ms" "predicted ms" "error" note
for layout in 2x1 2x2; do
    ms="2 4 8"; [ $layout = 2x2 ] && ms="4"
    R=${layout#2x}
    for sched in gpipe 1f1b; do
        for m in $ms; do
            cat > "$tmp/p.json" <<JSON
{ "model": { "preset": "gpt", "vocab": 256, "context": 64, "layers": 4, "heads": 4, "embed": 128 },
  "data": { "source": "synthetic", "seed": 1 },
  "train": { "steps": 12, "micro_batch": 4, "log_every": 1000, "eval_batches": 1,
             "optimizer": { "type": "adamw", "lr": 0.002, "weight_decay": 0.01 }, "grad_clip": 1.0 },
  "parallel": { "stages": 2, "replicas": $R, "micro_batches": $m, "schedule": "$sched" },
  "cluster": { "backend": "cpu" },
  "output": { "metrics": "$tmp/metrics.jsonl" } }
JSON
            "$bin" --plan "$tmp/p.json" --profile --costs "$tmp/p.costs.json" > /dev/null
            "$bin" --plan "$tmp/p.json" -q > /dev/null
            measured=$(sed -nE 's/.*"step": ([0-9]+),.*"time_s": ([0-9.e+-]+),.*/\1 \2/p' "$tmp/metrics.jsonl" |
                awk '$1 >= 3 { print $2 * 1e3 }' | sort -g |
                awk '{ v[NR] = $1 } END { if (NR % 2) printf "%.2f", v[(NR + 1) / 2]; else printf "%.2f", (v[NR / 2] + v[NR / 2 + 1]) / 2 }')
            predicted=$("$bin" --plan "$tmp/p.json" --simulate --costs "$tmp/p.costs.json" --json |
                sed -nE 's/.*"step_s": ([0-9.e+-]+).*/\1/p' | head -1 | awk '{ printf "%.2f", $1 * 1e3 }')
            err=$(awk -v a="$measured" -v b="$predicted" 'BEGIN { printf "%+.1f%%", 100 * (b - a) / a }')
            note=""
            [ $((2 * R)) -gt "$cores" ] && note="$((2 * R)) ranks on $cores cores: oversubscribed, not comparable"
            printf '%-7s %-6s %2d %12s %13s %8s  %s\n' "$layout" "$sched" "$m" "$measured" "$predicted" "$err" "$note"
        done
    done
done
