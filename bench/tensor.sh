#!/usr/bin/env bash
# Tensor groups on this machine's CPUs: the same model at t = 1 (one rank) and
# t = 2 (two ranks, one tensor group), its measured step time and the time the
# ranks spent in communication per step (at one stage and one replica, the
# tensor group's all-reduces and nothing else), beside the simulator's step
# and its tensor all-reduce time per step (the "tensor all-reduce" events of
# --simulate's trace, rank 0). The model is a layer list of split linears (a
# column then a row, twice): the GPT presets do not split yet
# (docs/parallelism.md). One BLAS thread per rank.
#
#   bench/tensor.sh [build dir]      (default: build)
set -euo pipefail
cd "$(dirname "$0")/.."
bin="${1:-build}/cdphybrid"
tmp=$(mktemp -d)
trap 'rm -rf "$tmp"' EXIT

printf '%2s %12s %18s %16s %20s\n' t "step ms" "communication ms" "predicted ms" "predicted tensor ms"
for t in 1 2; do
    cat > "$tmp/p.json" <<JSON
{ "model": {"input": [1024], "layers": [
    {"type": "linear", "out": 4096, "split": "column"}, {"type": "gelu"},
    {"type": "linear", "out": 1024, "split": "row"},
    {"type": "linear", "out": 4096, "split": "column"}, {"type": "gelu"},
    {"type": "linear", "out": 1024, "split": "row"}], "loss": "cross_entropy"},
  "data": {"source": "synthetic"},
  "train": {"steps": 12, "micro_batch": 64, "global_batch": 256, "log_every": 1000, "eval_batches": 1},
  "parallel": {"stages": 1, "replicas": 1, "tensor": $t},
  "cluster": {"backend": "cpu"} }
JSON
    OPENBLAS_NUM_THREADS=1 "$bin" --plan "$tmp/p.json" > "$tmp/run.txt"
    # the last step's "N ms/step"; one rank prints no "per step" line (no communication)
    step=$(sed -nE 's/^step .* ([0-9.]+) ms\/step.*/\1/p' "$tmp/run.txt" | tail -1)
    k=$(sed -nE 's/^per step .*: [0-9.]+ ms compute, ([0-9.]+) ms communication.*/\1/p' "$tmp/run.txt")
    k=${k:-0}
    "$bin" --plan "$tmp/p.json" --simulate --trace "$tmp/trace.json" > "$tmp/sim.txt"
    pred=$(sed -nE 's/^  step time +([0-9.]+) ms.*/\1/p' "$tmp/sim.txt" | head -1)
    tens=$(python3 -c '
import json, sys
d = json.load(open(sys.argv[1]))
ev = d["traceEvents"] if isinstance(d, dict) else d
print("%.3f" % (sum(e["dur"] for e in ev if e.get("ph") == "X" and e.get("pid") == 0
                    and str(e.get("name", "")).startswith("tensor all-reduce")) / 1e3))' "$tmp/trace.json")
    printf '%2d %12s %18s %16s %20s\n' "$t" "$step" "$k" "$pred" "$tens"
done
