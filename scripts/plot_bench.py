#!/usr/bin/python3
"""Plots kvsplit-bench-serving results (the --json-out files).

  scripts/plot_bench.py RESULT.json [RESULT.json ...] --out-dir plots/

Writes latency_cdf.png (TTFT, ITL and E2E CDFs, one line per result file) and, when the files
cover more than one --rate, throughput_vs_rate.png (tokens/s and goodput against the offered
rate). Needs matplotlib (Debian: python3-matplotlib).
"""
import argparse
import json
import os

import matplotlib

matplotlib.use("Agg")
import matplotlib.pyplot as plt  # noqa: E402


def cdf(values):
    xs = sorted(values)
    n = len(xs)
    return xs, [(i + 1) / n for i in range(n)]


def label(r, path):
    return f"{r.get('mode', '?')} rate={r.get('rate', 0):g} c={r.get('concurrency', 0)} ({os.path.basename(path)})"


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("results", nargs="+")
    ap.add_argument("--out-dir", default=".")
    a = ap.parse_args()
    os.makedirs(a.out_dir, exist_ok=True)
    runs = []
    for path in a.results:
        r = json.load(open(path))
        runs.append((path, r))
        if "in_process" in r:
            runs.append((path, r["in_process"]))

    fig, axes = plt.subplots(1, 3, figsize=(15, 4.2))
    for ax, key, title in zip(axes, ["ttft_ms", "itl_ms", "e2e_ms"], ["TTFT", "inter-token latency", "end-to-end"]):
        for path, r in runs:
            samples = r.get("samples", {}).get(key, [])
            if samples:
                xs, ys = cdf(samples)
                ax.plot(xs, ys, label=label(r, path))
        ax.set_xscale("log")
        ax.set_xlabel(f"{title} (ms)")
        ax.set_ylabel("fraction of samples")
        ax.grid(True, which="both", alpha=0.3)
    axes[0].legend(fontsize=7)
    fig.tight_layout()
    out = os.path.join(a.out_dir, "latency_cdf.png")
    fig.savefig(out, dpi=120)
    print("wrote", out)

    rated = sorted(((r["rate"], r) for _, r in runs if r.get("rate", 0) > 0 and r.get("mode") == "grpc"),
                   key=lambda x: x[0])
    if len({x[0] for x in rated}) > 1:
        fig, ax = plt.subplots(figsize=(6, 4.2))
        rates = [x[0] for x in rated]
        ax.plot(rates, [x[1]["tokens_per_s"] for x in rated], "o-", label="tokens/s")
        ax.set_xlabel("offered rate (requests/s)")
        ax.set_ylabel("generated tokens/s")
        ax2 = ax.twinx()
        ax2.plot(rates, [x[1]["goodput_rps"] for x in rated], "s--", color="tab:green", label="goodput (req/s)")
        ax2.set_ylabel("goodput (requests/s meeting their SLO)")
        ax.grid(True, alpha=0.3)
        fig.legend(loc="upper left", fontsize=8)
        fig.tight_layout()
        out = os.path.join(a.out_dir, "throughput_vs_rate.png")
        fig.savefig(out, dpi=120)
        print("wrote", out)


if __name__ == "__main__":
    main()
