#!/usr/bin/env bash
# Tensor groups on the CPU (docs/parallelism.md): an MLP of two column-then-row
# pairs of split linears, and a GPT of 4 blocks split by heads (embedding and
# head replicated), each one stage and one replica, at t = 1 (one rank) and
# t = 2 (two ranks, one BLAS thread each), the two interleaved run by run so
# that the machine's load hits both alike. From each run's metrics, after the
# first step:
#   step ms      the mean step time
#   tensor ms    the mean over ranks of the step's time in the split layers'
#                all-reduces (metrics' tensor_comm_s; 0 at t = 1)
#   sim ms       the simulator's step for the same layout (--simulate): the
#                split layers' work divided by t, the tensor group's
#                all-reduces included (ring cost over the host's copy rate)
#   sim tensor   of it, the tensor all-reduces of rank 0 (the "tensor
#                all-reduce" events of --simulate's trace)
#
#   bench/tensor.sh [build dir] [repeats]      (default: build 3)
set -euo pipefail
cd "$(dirname "$0")/.."
bin="${1:-build}/cdphybrid"
reps="${2:-3}"
tmp=$(mktemp -d)
trap 'rm -rf "$tmp"' EXIT

mlp='"model": {"input": [1024], "layers": [{"type": "linear", "out": 4096, "split": "column"}, {"type": "relu"},
  {"type": "linear", "out": 1024, "split": "row"}, {"type": "linear", "out": 4096, "split": "column"},
  {"type": "gelu"}, {"type": "linear", "out": 16, "split": "row"}], "loss": "cross_entropy"}'
mlp_batch='"global_batch": 256, "micro_batch": 64'
gpt='"model": {"preset": "gpt", "vocab": 256, "context": 64, "layers": 4, "heads": 8, "embed": 256}'
gpt_batch='"global_batch": 16, "micro_batch": 8'

plan() { # t model batch
    cat > "$tmp/t$1.json" <<JSON
{$2, "data": {"source": "synthetic", "seed": 1},
 "train": {"steps": 6, $3, "optimizer": {"type": "sgd", "lr": 0.01},
           "eval_batches": 1, "log_every": 100},
 "parallel": {"stages": 1, "replicas": 1, "tensor": $1, "schedule": "1f1b"},
 "cluster": {"backend": "cpu"}, "output": {"metrics": "t$1.jsonl"}}
JSON
}

measure() { # metrics
    python3 - "$1" <<'PY'
import json, sys
steps = [json.loads(l) for l in open(sys.argv[1]) if '"time_s"' in l]
st = [s for s in steps if s["step"] >= 2]
m = lambda x: sum(x) / len(x) if x else float("nan")
print(f'{m([s["time_s"] * 1e3 for s in st]):.2f} {m([s.get("tensor_comm_s", 0) * 1e3 for s in st]):.2f}')
PY
}

simulated() { # plan: the step and rank 0's tensor all-reduces, ms
    local step
    step=$("$bin" --plan "$1" --simulate --json --trace "$tmp/trace.json" 2>/dev/null | python3 -c '
import json, sys
print("%.2f" % (json.load(sys.stdin)["predicted"]["step_s"] * 1e3))')
    python3 - "$tmp/trace.json" "$step" <<'PY'
import json, sys
d = json.load(open(sys.argv[1]))
ev = d["traceEvents"] if isinstance(d, dict) else d
t = sum(e["dur"] for e in ev if e.get("ph") == "X" and e.get("pid") == 0
        and str(e.get("name", "")).startswith("tensor all-reduce")) / 1e3
print(f"{sys.argv[2]} {t:.2f}")
PY
}

mean() { python3 -c 'import sys; x = [float(v) for v in sys.argv[1:]]; print(f"{sum(x) / len(x):.2f}")' "$@"; }
table() { # name model batch
    echo "$1"
    printf '%-3s %5s %9s %10s %8s %11s\n' t runs "step ms" "tensor ms" "sim ms" "sim tensor"
    for t in 1 2; do plan $t "$2" "$3"; done
    local -A step=() tens=()
    for r in $(seq "$reps"); do
        for t in 1 2; do
            OPENBLAS_NUM_THREADS=1 "$bin" -q --plan "$tmp/t$t.json" >/dev/null
            read -r s c < <(measure "$tmp/t$t.jsonl")
            step[$t]="${step[$t]:-} $s"
            tens[$t]="${tens[$t]:-} $c"
        done
    done
    for t in 1 2; do
        read -r ss st < <(simulated "$tmp/t$t.json")
        # shellcheck disable=SC2086
        printf '%-3s %5s %9s %10s %8s %11s\n' "$t" "$reps" "$(mean ${step[$t]})" "$(mean ${tens[$t]})" "$ss" "$st"
    done
}
table "mlp of split linears (1024 -> 4096 -> 1024 -> 4096 -> 16, micro-batch 64)" "$mlp" "$mlp_batch"
table "gpt (4 blocks, embed 256, 8 heads, context 64, vocab 256, micro-batch 8)" "$gpt" "$gpt_batch"
