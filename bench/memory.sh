#!/usr/bin/env bash
# Memory against time on this machine: for each activation recomputation mode
# (/train/recompute none, selective, full) and ZeRO stage (/parallel/zero 0,
# 1, 2), a GPT trained on 2 stages x 2 replicas of the cpu backend; per run the
# largest measured device peak of a rank (metrics.jsonl's peak_memory_bytes,
# what the device layer counted), the planner's prediction for that rank, the
# share of the none/0 peak, and the mean step time over steps 2-8. The losses
# of every run with zero 0 or 1 must be the same bits, those with zero 2
# (which sums each micro-batch's reduced gradient, another order) within 1e-5
# of them; the script says so or fails.
#
#   bench/memory.sh [build dir]      (default: build)
set -euo pipefail
cd "$(dirname "$0")/.."
bin="$(cd "${1:-build}" && pwd)/cdphybrid"
tmp=$(mktemp -d)
trap 'rm -rf "$tmp"' EXIT

printf '%-10s %4s %14s %14s %10s %12s\n' recompute zero "peak MiB/rank" "predicted MiB" "vs none/0" "step ms"
base=""
for mode in none selective full; do
  for zero in 0 1 2; do
    name="$mode-$zero"
    cat > "$tmp/$name.json" <<JSON
{ "model": {"preset": "gpt", "vocab": 512, "context": 256, "layers": 8, "heads": 8, "embed": 128},
  "data": {"source": "synthetic", "seed": 1},
  "train": {"steps": 8, "micro_batch": 4, "recompute": "$mode", "log_every": 1000, "eval_batches": 1},
  "parallel": {"stages": 2, "replicas": 2, "micro_batches": 4, "schedule": "1f1b", "zero": $zero},
  "cluster": {"backend": "cpu"},
  "output": {"metrics": "$name.jsonl"} }
JSON
    (cd "$tmp" && OPENBLAS_NUM_THREADS=1 "$bin" -q --plan "$name.json" >/dev/null)
    read -r peak pred ms losses <<<"$(python3 - "$tmp/$name.jsonl" <<'PY'
import json, sys
recs = [json.loads(l) for l in open(sys.argv[1]) if '"step"' in l]
last = recs[-1]["ranks"]
worst = max(last, key=lambda r: r["peak_memory_bytes"])
times = [r["time_s"] for r in recs[1:]]
print(worst["peak_memory_bytes"], worst["predicted_memory_bytes"], 1e3 * sum(times) / len(times),
      ",".join(repr(r["loss"]) for r in recs))
PY
)"
    if [ -z "$base" ]; then base=$peak; base_losses=$losses; fi
    if [ "$zero" != 2 ] && [ "$losses" != "$base_losses" ]; then
      echo "memory.sh: $name's losses differ from none-0's" >&2; exit 1
    fi
    if [ "$zero" = 2 ] && ! python3 -c '
import sys
a, b = [list(map(float, x.split(","))) for x in sys.argv[1:3]]
sys.exit(0 if len(a) == len(b) and all(abs(x - y) <= 1e-5 * abs(y) for x, y in zip(a, b)) else 1)' "$losses" "$base_losses"; then
      echo "memory.sh: $name's losses are not within 1e-5 of none-0's" >&2; exit 1
    fi
    awk -v m="$mode" -v z="$zero" -v a="$peak" -v b="$pred" -v c="$base" -v t="$ms" \
        'BEGIN{printf "%-10s %4s %14.2f %14.2f %9.0f%% %12.1f\n", m, z, a/1048576, b/1048576, 100*a/c, t}'
  done
done
echo "losses: the same bits in every run with zero 0 or 1, within 1e-5 of them with zero 2"
