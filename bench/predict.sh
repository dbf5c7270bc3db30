#!/usr/bin/env bash
# Predicted against measured step time on this machine's CPU: for the pipeline
# example's GPT (examples/pipeline.json, synthetic data) on 2 stages x 1 replica
# (m = 2, 4, 8), 1 stage x 2 replicas and 2 x 2 (m = 4), GPipe and 1F1B, the
# mean step time of a real run (steps 3.. of 20, output.metrics time_s) beside
# `--simulate` of the same layout. The run plans with the costs `--profile`
# measured for that plan (`--costs`), so it runs the partition the simulation
# simulates; the profile is taken as the layout's rank 0 runs (bound to its
# CPUs, with as many BLAS threads), and every rank of the run is bound to its
# layout CPUs with as many BLAS threads. Where ranks share cores (2 x 2 on a
# 2-core machine) the simulator shares their time; the note says so.
#
# The speed of these VMs' cores drifts by up to 2x over seconds to minutes, so
# each row profiles just before and just after its run and predicts with
# both; when the two predictions differ by more than 10% the machine changed
# speed under the run and the row is measured again (up to 4 tries; the last
# column counts them). The prediction is the mean of the two.
#
#   bench/predict.sh [build dir]      (default: build)
set -euo pipefail
cd "$(dirname "$0")/.."
bin="$(cd "${1:-build}" && pwd)/cdphybrid"
tmp=$(mktemp -d)
trap 'rm -rf "$tmp"' EXIT
cores=$(nproc)

printf '%-7s %-6s %2s %12s %13s %8s %6s  %s\n' layout sched m "measured ms" "predicted ms" "error" tries note
for layout in 2x1 1x2 2x2; do
    P=${layout%x*}
    R=${layout#*x}
    ms="2 4 8"; [ "$layout" != 2x1 ] && ms="4"
    scheds="gpipe 1f1b"; [ "$P" = 1 ] && scheds="1f1b"
    for sched in $scheds; do
        for m in $ms; do
            cat > "$tmp/p.json" <<JSON
{ "model": { "preset": "gpt", "vocab": 256, "context": 64, "layers": 4, "heads": 4, "embed": 128 },
  "data": { "source": "synthetic", "seed": 1 },
  "train": { "steps": 20, "micro_batch": 4, "log_every": 1000, "eval_batches": 1,
             "optimizer": { "type": "adamw", "lr": 0.002, "weight_decay": 0.01 }, "grad_clip": 1.0 },
  "parallel": { "stages": $P, "replicas": $R, "micro_batches": $m, "schedule": "$sched" },
  "cluster": { "backend": "cpu" },
  "output": { "metrics": "$tmp/metrics.jsonl" } }
JSON
            tries=0
            while :; do
                tries=$((tries + 1))
                "$bin" --plan "$tmp/p.json" --profile --costs "$tmp/a.costs.json" > /dev/null
                "$bin" --plan "$tmp/p.json" --costs "$tmp/a.costs.json" -q > /dev/null
                "$bin" --plan "$tmp/p.json" --profile --costs "$tmp/b.costs.json" > /dev/null
                measured=$(sed -nE 's/.*"step": ([0-9]+),.*"time_s": ([0-9.e+-]+),.*/\1 \2/p' "$tmp/metrics.jsonl" |
                    awk '$1 >= 3 { s += $2 * 1e3; n++ } END { printf "%.2f", s / n }')
                pa=$("$bin" --plan "$tmp/p.json" --simulate --costs "$tmp/a.costs.json" --json |
                    sed -nE 's/.*"step_s": ([0-9.e+-]+).*/\1/p' | head -1)
                pb=$("$bin" --plan "$tmp/p.json" --simulate --costs "$tmp/b.costs.json" --json |
                    sed -nE 's/.*"step_s": ([0-9.e+-]+).*/\1/p' | head -1)
                steady=$(awk -v a="$pa" -v b="$pb" 'BEGIN { d = a - b; if (d < 0) d = -d; print (d <= 0.1 * (a + b) / 2) }')
                [ "$steady" = 1 ] || [ "$tries" -ge 4 ] && break
            done
            predicted=$(awk -v a="$pa" -v b="$pb" 'BEGIN { printf "%.2f", (a + b) / 2 * 1e3 }')
            err=$(awk -v a="$measured" -v b="$predicted" 'BEGIN { printf "%+.1f%%", 100 * (b - a) / a }')
            note=""
            [ $((P * R)) -gt "$cores" ] && note="$((P * R)) ranks on $cores cores: shared cores, modeled"
            [ "$steady" = 1 ] || note="${note:+$note; }the machine's speed changed under every try"
            printf '%-7s %-6s %2d %12s %13s %8s %6d  %s\n' "$layout" "$sched" "$m" "$measured" "$predicted" "$err" \
                "$tries" "$note"
        done
    done
done
