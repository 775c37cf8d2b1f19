#!/usr/bin/env bash
# The KV cache manager's performance measurements (issue 15; docs/kvm.md, "Measured").
#
#   scripts/bench_kvm.sh [BUILD_DIR]        # default: build
#
# Builds nothing: it needs BUILD_DIR/kvsplit, BUILD_DIR/benchmarks/bench_serving_offline and
# BUILD_DIR/benchmarks/bench_engine. It
#   1. writes the phased trace (calm, a spike of long batch prompts, calm; classes interactive and
#      batch) with `kvsplit policy make-trace --phased`;
#   2. replays it with `bench_serving_offline --mode colocated --config C --trace T` for every
#      config in benchmarks/kvm/ (REPEATS rounds, every config once per round, so the machine's
#      drift hits them alike);
#   3. prints per class: goodput (requests meeting both the TTFT and the mean-ITL target, per
#      second and as a share), TTFT p99, ITL p99 (over requests' mean ITL): the mean of the rounds
#      and the min..max; and the ratios KVM-on / cuts-off and KVM-on / best static, per round;
#   4. writes an engine cost profile (`bench_engine --write-profile`), runs `kvsplit policy
#      simulate --json` for kvm-on and cuts-off and prints predicted vs measured p99 per class;
#   5. prints the KVM overhead line of the kvm-on runs.
#
# Environment: OUT (default BUILD_DIR/bench-kvm: trace, raw outputs, profile), REPEATS (default 2),
# CONFIGS (space-separated names under benchmarks/kvm/, default all), SEED (trace seed, 1).
set -euo pipefail

BUILD=${1:-build}
ROOT=$(cd "$(dirname "$0")/.." && pwd)
OUT=${OUT:-$BUILD/bench-kvm}
REPEATS=${REPEATS:-2}
SEED=${SEED:-1}
CFG_DIR="$ROOT/benchmarks/kvm"
CONFIGS=${CONFIGS:-"cuts-off semantic temporal spatial kvm-on static-base static-semantic-high static-swap-always static-batch-step8 static-batch-queue4 static-batch-queue16 static-worst kvm-dryrun kvm-tuned kvm-hold"}
KVSPLIT="$BUILD/kvsplit"
SERVE="$BUILD/benchmarks/bench_serving_offline"
ENGINE="$BUILD/benchmarks/bench_engine"
for b in "$KVSPLIT" "$SERVE" "$ENGINE"; do
  [[ -x "$b" ]] || { echo "bench_kvm.sh: $b not built (cmake --build $BUILD --target kvsplit bench_serving_offline bench_engine)" >&2; exit 2; }
done
mkdir -p "$OUT"
TRACE="$OUT/phased.jsonl"

# 1. The trace: 8 s calm, 10 s spike, 8 s calm. Interactive: 4 req/s, ~32-token prompts and
# outputs. Batch: 0.5 req/s of ~128 / 64 tokens when calm, 16 req/s of ~400-token prompts and
# ~100-token outputs in the spike (lengths uniform in [median/2, 3 median/2], clamped to the
# 512-token context by bench_serving_offline).
"$KVSPLIT" policy make-trace --phased --out "$TRACE" --seed "$SEED" --calm-ms 8000 --spike-ms 10000 \
  --batch-rate-spike 16 --spike-prompt 400 --spike-output 100 >/dev/null
echo "trace: $TRACE ($(wc -l <"$TRACE") requests)"
echo "machine: $(nproc) cores, $(uname -m), load $(cut -d' ' -f1-3 /proc/loadavg)"

# 2. The runs.
for ((r = 1; r <= REPEATS; r++)); do
  for c in $CONFIGS; do
    echo "round $r: $c" >&2
    "$SERVE" --mode colocated --config "$CFG_DIR/$c.yaml" --trace "$TRACE" >"$OUT/$c.$r.txt"
  done
done

# 4. Profile and simulator.
"$ENGINE" --model synthetic:stories260k --threads 1 --write-profile "$OUT/profile.json" \
  >"$OUT/profile.txt" 2>&1
for c in kvm-on cuts-off; do
  "$KVSPLIT" policy simulate --config "$CFG_DIR/$c.yaml" --trace "$TRACE" \
    --profile "$OUT/profile.json" --json >"$OUT/sim.$c.json"
done

# 3 and 5. The tables.
python3 - "$OUT" "$REPEATS" $CONFIGS <<'EOF'
import json, re, sys

out, repeats, configs = sys.argv[1], int(sys.argv[2]), sys.argv[3:]
ROW = re.compile(r"^\s+(\S+)\s+(\d+)\s+(\d+)\s+([\d.]+)\s+([\d.]+)\s+([\d.]+)\s+([\d.]+)\s+([\d.]+)%$")
runs = {}  # config -> [round] -> {class: dict}, plus "_overhead"
for c in configs:
    runs[c] = []
    for r in range(1, repeats + 1):
        d = {}
        for line in open(f"{out}/{c}.{r}.txt"):
            m = ROW.match(line)
            if m:
                d[m[1]] = dict(requests=int(m[2]), errors=int(m[3]), ttft_p99=float(m[5]),
                               itl_p99=float(m[6]), good_rps=float(m[7]), good=float(m[8]))
            if line.startswith("  kvm overhead:"):
                d["_overhead"] = line.strip()
            if line.startswith("  preemptions"):
                d["_preempt"] = int(line.split()[1].rstrip(","))
        classes = [k for k in d if not k.startswith("_")]
        req = sum(d[k]["requests"] for k in classes)
        d["all"] = dict(requests=req, good_rps=sum(d[k]["good_rps"] for k in classes),
                        good=sum(d[k]["good"] * d[k]["requests"] for k in classes) / max(req, 1),
                        ttft_p99=float("nan"), itl_p99=float("nan"))
        runs[c].append(d)

def span(vals, fmt):
    lo, hi, mean = min(vals), max(vals), sum(vals) / len(vals)
    return (fmt % mean) + (" (" + (fmt % lo) + ".." + (fmt % hi) + ")" if len(vals) > 1 else "")

classes = [k for k in runs[configs[0]][0] if not k.startswith("_") and k != "all"] + ["all"]
KVMS = ("kvm-on", "kvm-tuned", "kvm-dryrun")
statics = [c for c in configs if c not in KVMS]
print(f"\nPer class: mean of {repeats} rounds (min..max). goodput: requests within both the "
      "TTFT and the mean-ITL target; p99 in ms (ITL: of requests' mean ITL)")
for k in classes:
    print(f"\n[{k}]")
    print(f"  {'config':22} {'goodput r/s':>22} {'goodput %':>22} {'TTFT p99':>26} {'ITL p99':>22}"
          f" {'preempt':>8}")
    for c in configs:
        g = [run[k]["good_rps"] for run in runs[c]]
        s = [run[k]["good"] for run in runs[c]]
        t = [run[k]["ttft_p99"] for run in runs[c]]
        i = [run[k]["itl_p99"] for run in runs[c]]
        p = [run.get("_preempt", 0) for run in runs[c]]
        tt = "" if k == "all" else span(t, "%.1f")
        it = "" if k == "all" else span(i, "%.2f")
        print(f"  {c:22} {span(g, '%.2f'):>22} {span(s, '%.1f'):>22} {tt:>26} {it:>22}"
              f" {span(p, '%.0f') if k == 'all' else '':>8}")

def best_static(k):
    return max(statics, key=lambda c: sum(run[k]["good_rps"] for run in runs[c]))

for kv in ("kvm-on", "kvm-tuned"):
    if kv not in configs:
        continue
    print(f"\nRatios of goodput (r/s), {kv}, per round (the same round's runs); best static: the"
          " highest mean over the rounds:")
    for k in classes:
        parts = []
        if "cuts-off" in configs:
            rs = [runs[kv][r][k]["good_rps"] / max(runs["cuts-off"][r][k]["good_rps"], 1e-9)
                  for r in range(repeats)]
            parts.append("/ cuts-off " + " ".join("%.2fx" % x for x in rs))
        b = best_static(k)
        rs = [runs[kv][r][k]["good_rps"] / max(runs[b][r][k]["good_rps"], 1e-9)
              for r in range(repeats)]
        parts.append(f"/ best static ({b}) " + " ".join("%.2fx" % x for x in rs))
        print(f"  {k:12} " + "; ".join(parts))

print("\nSimulator (policy simulate, bench_engine profile) vs measured (mean of the rounds), p99 ms:")
print(f"  {'config':10} {'class':12} {'TTFT pred':>10} {'meas':>9} {'err':>7} {'ITL pred':>10}"
      f" {'meas':>9} {'err':>7}")
for c in ("kvm-on", "cuts-off"):
    if c not in configs:
        continue
    sim = json.loads(open(f"{out}/sim.{c}.json").read())["classes"]
    for k in classes:
        if k == "all" or k not in sim:
            continue
        mt = sum(run[k]["ttft_p99"] for run in runs[c]) / repeats
        mi = sum(run[k]["itl_p99"] for run in runs[c]) / repeats
        pt, pi = sim[k]["ttft_p99_ms"], sim[k]["itl_p99_ms"]
        print(f"  {c:10} {k:12} {pt:10.1f} {mt:9.1f} {100 * (pt - mt) / mt:+6.0f}% {pi:10.2f}"
              f" {mi:9.2f} {100 * (pi - mi) / mi:+6.0f}%")

for c in KVMS:
    if c not in configs:
        continue
    print(f"\nKVM overhead ({c} runs):")
    for r, run in enumerate(runs[c], 1):
        print(f"  round {r}: {run.get('_overhead', '(no overhead line)')[len('kvm overhead: '):]}")
EOF
