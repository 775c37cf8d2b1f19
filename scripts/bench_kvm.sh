#!/usr/bin/env bash
# The KV cache manager's performance measurements (issue 15; docs/kvm.md, "Measured").
#
#   scripts/bench_kvm.sh [BUILD_DIR]        # default: build
#
# Builds nothing: it needs BUILD_DIR/kvsplit, BUILD_DIR/benchmarks/bench_serving_offline and
# BUILD_DIR/benchmarks/bench_engine. It
#   1. writes an engine cost profile of this machine (`bench_engine --write-profile`);
#   2. writes the phased trace (calm, a spike of long batch prompts, calm; classes interactive and
#      batch) with `kvsplit policy make-trace --phased --rate-scale S`. S scales every arrival rate
#      to this machine: LOAD x (the simulated busy time of the unscaled trace under the built-in
#      profile, the development machine the trace was sized on / under this machine's profile);
#   3. sweeps static settings in the simulator (batch max_queue x batch semantic_threshold on
#      static-base.yaml), writes the three best as OUT/static-sim-{1,2,3}.yaml, and kvm-on.yaml's
#      policy with the best one's queue cap and threshold as OUT/kvm-sim.yaml;
#   4. replays the trace with `bench_serving_offline --mode colocated --config C --trace T
#      --write-requests` for every config (OUT/C.yaml if the sweep wrote it, else
#      benchmarks/kvm/C.yaml; REPEATS rounds, every config once per round, so the machine's drift
#      hits them alike);
#   5. prints per class: goodput (requests meeting both the TTFT and the mean-ITL target, per
#      second and as a share), TTFT p99, ITL p99 (over requests' mean ITL): the mean of the rounds and the min..max; the ratios of each KVM config to cuts-off and to the
#      best static, per round; the simulator's predicted p99s against the measured ones for every
#      config; the KVM overhead line of the KVM runs.
#
# Environment: OUT (default BUILD_DIR/bench-kvm), REPEATS (default 2), CONFIGS (space-separated),
# SEED (trace seed, 1), LOAD (1.3), SCALE (the rate scale; default: computed as above).
set -euo pipefail

BUILD=${1:-build}
ROOT=$(cd "$(dirname "$0")/.." && pwd)
OUT=${OUT:-$BUILD/bench-kvm}
REPEATS=${REPEATS:-2}
SEED=${SEED:-1}
LOAD=${LOAD:-1.3}
CFG_DIR="$ROOT/benchmarks/kvm"
CONFIGS=${CONFIGS:-"cuts-off semantic temporal spatial static-base static-semantic-high static-batch-queue16 static-sim-1 static-sim-2 static-sim-3 kvm-on kvm-sim"}
KVSPLIT="$BUILD/kvsplit"
SERVE="$BUILD/benchmarks/bench_serving_offline"
ENGINE="$BUILD/benchmarks/bench_engine"
for b in "$KVSPLIT" "$SERVE" "$ENGINE"; do
  [[ -x "$b" ]] || { echo "bench_kvm.sh: $b not built (cmake --build $BUILD --target kvsplit bench_serving_offline bench_engine)" >&2; exit 2; }
done
mkdir -p "$OUT/sweep"
TRACE="$OUT/phased.jsonl"
echo "machine: $(nproc) cores, $(uname -m), load $(cut -d' ' -f1-3 /proc/loadavg)"

# 1. This machine's engine costs.
"$ENGINE" --model synthetic:stories260k --threads 1 --write-profile "$OUT/profile.json" \
  >"$OUT/profile.txt" 2>&1

# 2. The trace: 8 s calm, 10 s spike, 8 s calm. At scale 1: interactive 4 req/s of ~32-token
# prompts and outputs; batch 0.5 req/s of ~128 / 64 tokens when calm, 16 req/s of ~400-token
# prompts and ~100-token outputs in the spike (lengths uniform in [median/2, 3 median/2], clamped
# to the 512-token context by bench_serving_offline).
phased() {
  "$KVSPLIT" policy make-trace --phased --out "$1" --seed "$SEED" --calm-ms 8000 --spike-ms 10000 \
    --batch-rate-spike 16 --spike-prompt 400 --spike-output 100 --rate-scale "$2" 2>/dev/null
}
busy() {  # simulated busy time (ms) of cuts-off on trace $1 with profile args ${@:2}
  "$KVSPLIT" policy simulate --config "$CFG_DIR/cuts-off.yaml" --trace "$1" "${@:2}" --json \
    2>/dev/null | python3 -c 'import json,sys; d=json.load(sys.stdin); print(d["steps"]*d["mean_step_ms"])'
}
if [[ -z "${SCALE:-}" ]]; then
  phased "$OUT/phased-1x.jsonl" 1
  REF=$(busy "$OUT/phased-1x.jsonl")
  HERE=$(busy "$OUT/phased-1x.jsonl" --profile "$OUT/profile.json")
  SCALE=$(python3 -c "print(round($LOAD * $REF / $HERE, 3))")
  echo "rate scale: $SCALE = LOAD $LOAD x speed $(python3 -c "print(round($REF / $HERE, 3))") (simulated busy time of the 1x trace: built-in profile $REF ms, this machine's $HERE ms)"
else
  echo "rate scale: $SCALE (given)"
fi
phased "$TRACE" "$SCALE"
echo "trace: $TRACE ($(wc -l <"$TRACE") requests)"

# 3. Static settings swept in the simulator, and kvm-on's policy with the best one's values.
sim_all() {  # all-request attainment of config $1 on the trace, as the simulator predicts it
  "$KVSPLIT" policy simulate --config "$1" --trace "$TRACE" --profile "$OUT/profile.json" --json \
    | python3 -c 'import json,sys; c=json.load(sys.stdin)["classes"].values(); print(sum(v["attainment"]*v["requests"] for v in c)/sum(v["requests"] for v in c))'
}
: >"$OUT/sweep.txt"
for q in 16 32 48 64 72 80 96 128 1024; do
  for t in 0.15 0.3 0.45 0.6; do
    f="$OUT/sweep/q$q-t$t.yaml"
    sed -e "s|^  batch: {max_ttft_ms: 2000, max_itl_ms: 20}|  batch: {max_ttft_ms: 2000, max_itl_ms: 20, max_queue: $q}|" \
        -e "s|semantic_threshold: 0.15|semantic_threshold: $t|" \
        -e "s|^# Static: .*|# Static, written by scripts/bench_kvm.sh's sweep: batch max_queue $q, semantic_threshold $t.|" \
        "$CFG_DIR/static-base.yaml" >"$f"
    echo "$(sim_all "$f") $q $t" >>"$OUT/sweep.txt"
  done
done
sort -rn "$OUT/sweep.txt" | head -3 | nl | while read -r k a q t; do
  cp "$OUT/sweep/q$q-t$t.yaml" "$OUT/static-sim-$k.yaml"
  echo "static-sim-$k: batch max_queue $q, semantic_threshold $t (predicted attainment $a)"
  if [[ $k == 1 ]]; then
    sed -e "s|then: \"max_queue = 80\"|then: \"max_queue = $q\"|" \
        -e "s|then: \"semantic_threshold = 0.6\"|then: \"semantic_threshold = $t\"|" \
        "$CFG_DIR/kvm-on.yaml" >"$OUT/kvm-sim.yaml"
  fi
done

# 4. The runs.
cfg() { if [[ -f "$OUT/$1.yaml" ]]; then echo "$OUT/$1.yaml"; else echo "$CFG_DIR/$1.yaml"; fi; }
for ((r = 1; r <= REPEATS; r++)); do
  for c in $CONFIGS; do
    echo "round $r: $c" >&2
    "$SERVE" --mode colocated --config "$(cfg "$c")" --trace "$TRACE" \
      --write-requests "$OUT/$c.$r.requests.jsonl" >"$OUT/$c.$r.txt"
  done
done
for c in $CONFIGS; do
  "$KVSPLIT" policy simulate --config "$(cfg "$c")" --trace "$TRACE" \
    --profile "$OUT/profile.json" --json --write-requests "$OUT/sim.$c.requests.jsonl" \
    >"$OUT/sim.$c.json"
done

# 5. The tables.
python3 - "$OUT" "$REPEATS" $CONFIGS <<'EOF'
import json, re, sys

out, repeats, configs = sys.argv[1], int(sys.argv[2]), sys.argv[3:]
ROW = re.compile(r"^\s+(\S+)\s+(\d+)\s+(\d+)\s+([\d.]+)\s+([\d.]+)\s+([\d.]+)\s+([\d.]+)\s+([\d.]+)%$")
runs = {}  # config -> [round] -> {class: dict}, plus "_overhead", "_decisions", "_preempt"
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
            if line.startswith("  kvm:"):
                d["_decisions"] = int(line.split()[1])
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
KVMS = [c for c in configs if c.startswith("kvm-")]
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

for kv in KVMS:
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

print("\nSimulator (policy simulate, this run's profile) vs measured (mean of the rounds), p99 ms:")
print(f"  {'config':22} {'class':12} {'TTFT pred':>10} {'meas':>9} {'err':>7} {'ITL pred':>10}"
      f" {'meas':>9} {'err':>7} {'goodput pred':>12} {'meas':>7}")
within = total = 0
for c in configs:
    sim = json.loads(open(f"{out}/sim.{c}.json").read())["classes"]
    for k in classes:
        if k == "all" or k not in sim:
            continue
        mt = sum(run[k]["ttft_p99"] for run in runs[c]) / repeats
        mi = sum(run[k]["itl_p99"] for run in runs[c]) / repeats
        mg = sum(run[k]["good"] for run in runs[c]) / repeats
        pt, pi = sim[k]["ttft_p99_ms"], sim[k]["itl_p99_ms"]
        et, ei = (pt - mt) / mt, (pi - mi) / mi
        within += (abs(et) <= 0.25) + (abs(ei) <= 0.25)
        total += 2
        print(f"  {c:22} {k:12} {pt:10.1f} {mt:9.1f} {100 * et:+6.0f}% {pi:10.2f}"
              f" {mi:9.2f} {100 * ei:+6.0f}% {100 * sim[k]['attainment']:11.1f}% {mg:6.1f}%")
print(f"  within 25 %: {within} of {total}")

for c in KVMS:
    print(f"\nKVM overhead ({c} runs):")
    for r, run in enumerate(runs[c], 1):
        print(f"  round {r}: {run.get('_decisions', 0)} decisions; "
              f"{run.get('_overhead', '(no overhead line)')[len('kvm overhead: '):]}")
EOF
