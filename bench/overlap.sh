#!/usr/bin/env bash
# Gradient buckets overlapped with the backward (issue 17): a GPT on 1 x 2 and
# 2 x 2 CPU layouts (stages x replicas), one BLAS thread per rank, each run
# with buckets (/parallel/bucket_mb, default 1 MiB) and without (0), the two
# interleaved run by run so that the machine's load hits both alike. From
# every run's metrics and trace, after the first step:
#   step ms      the mean step time (rank 0's metrics)
#   reduce ms    the reduction's span per rank and step (its all-reduce event:
#                from the call, or the first bucket's start, to the end; it
#                includes waiting for a late replica)
#   exposed ms   its part after the last replica of the stage ended its last
#                backward: without buckets the whole reduction
#   hidden       1 - exposed with buckets / exposed without: the share of the
#                reduction's time that no longer adds to the step
#
#   bench/overlap.sh [build dir] [repeats]      (default: build 3)
set -euo pipefail
cd "$(dirname "$0")/.."
bin="${1:-build}/cdphybrid"
reps="${2:-3}"
tmp=$(mktemp -d)
trap 'rm -rf "$tmp"' EXIT

gpt='"model": {"preset": "gpt", "vocab": 512, "context": 64, "layers": 6, "heads": 4, "embed": 256}'

# Means over ranks and steps >= 2: the step time (rank 0's metrics), the
# reduction's span (its all-reduce event: the first bucket's start, or the
# call, to the end) and its exposed part: from the moment the last replica of
# the rank's stage finished its last backward (so a straggler's lateness is
# not counted as reduction) to the reduction's end.
measure() { # trace metrics
    python3 - "$1" "$2" <<'PY'
import json, re, sys
t = json.load(open(sys.argv[1]))
ev = [e for e in t["traceEvents"] if e.get("ph") == "X"]
stage = {}
for e in t["traceEvents"]:
    m = re.match(r"rank (\d+): stage (\d+),", str(e.get("args", {}).get("name", ""))) if e.get("ph") == "M" else None
    if m: stage[int(m.group(1))] = int(m.group(2))
ranks = len(stage)
bwd_end = {}
for e in ev:
    if e["tid"] < ranks and e["name"].startswith("B"):
        k = (stage[e["tid"]], e["args"]["step"])
        bwd_end[k] = max(bwd_end.get(k, 0), e["ts"] + e["dur"])
span, exposed = [], []
for e in ev:
    if e["tid"] >= ranks and e["name"].startswith("all-reduce") and e["args"]["step"] >= 2:
        k = (stage[e["tid"] - ranks], e["args"]["step"])
        span.append(e["dur"] / 1000)
        exposed.append(max(0.0, e["ts"] + e["dur"] - bwd_end[k]) / 1000)
steps = [json.loads(l) for l in open(sys.argv[2]) if '"time_s"' in l]
st = [s["time_s"] * 1000 for s in steps if s.get("step", 0) >= 2]
m = lambda x: sum(x) / len(x) if x else float("nan")
print(f"{m(st):.1f} {m(span):.2f} {m(exposed):.2f}")
PY
}

printf '%-6s %-8s %4s %9s %10s %11s %8s\n' layout buckets runs "step ms" "reduce ms" "exposed ms" hidden
for lay in "1 2" "2 2"; do
    read -r p R <<<"$lay"
    declare -A sum_step=() sum_red=() sum_exp=()
    for mode in on off; do sum_step[$mode]=0; sum_red[$mode]=0; sum_exp[$mode]=0; done
    for ((k = 0; k < reps; k++)); do
        for mode in on off; do
            mb=1; [ $mode = off ] && mb=0
            cat > "$tmp/p.json" <<JSON
{ $gpt, "data": {"source": "synthetic"},
  "train": {"steps": 6, "micro_batch": 4, "log_every": 1000, "eval_batches": 1},
  "parallel": {"stages": $p, "replicas": $R, "micro_batches": 2, "bucket_mb": $mb},
  "cluster": {"backend": "cpu"},
  "output": {"trace": "$tmp/t.json", "metrics": "$tmp/m.jsonl"} }
JSON
            rm -f "$tmp/m.jsonl"
            OPENBLAS_NUM_THREADS=1 "$bin" --plan "$tmp/p.json" >/dev/null
            read -r s r x <<<"$(measure "$tmp/t.json" "$tmp/m.jsonl")"
            sum_step[$mode]=$(awk -v a="${sum_step[$mode]}" -v b="$s" 'BEGIN{print a+b}')
            sum_red[$mode]=$(awk -v a="${sum_red[$mode]}" -v b="$r" 'BEGIN{print a+b}')
            sum_exp[$mode]=$(awk -v a="${sum_exp[$mode]}" -v b="$x" 'BEGIN{print a+b}')
        done
    done
    for mode in on off; do
        hidden="-"
        if [ $mode = on ]; then
            hidden=$(awk -v e="${sum_exp[on]}" -v r="${sum_exp[off]}" 'BEGIN{printf "%.0f%%", (r > 0 ? 100 * (1 - e / r) : 0)}')
        fi
        awk -v l="${p}x${R}" -v m="$mode" -v n="$reps" -v s="${sum_step[$mode]}" -v r="${sum_red[$mode]}" \
            -v x="${sum_exp[$mode]}" -v h="$hidden" \
            'BEGIN{printf "%-6s %-8s %4d %9.1f %10.2f %11.2f %8s\n", l, m, n, s/n, r/n, x/n, h}'
    done
done
