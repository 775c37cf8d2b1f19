#!/usr/bin/python3
"""Plots kvsplit-bench-serving results (the --json-out files).

  scripts/plot_bench.py RESULT.json [RESULT.json ...] [--out-dir plots/] [--title TEXT]

Writes
  latency_cdf.png         TTFT, ITL and E2E CDFs, one line per run (every file; with an
                          in-process comparison, its in-process pass too), ordered by rate;
  throughput_vs_rate.png  when the gRPC runs cover two or more --rate values: generated tokens/s,
                          and achieved requests/s and goodput (requests/s that met their class's
                          max_ttft_ms and max_itl_ms) against the offered rate, with the y = x line.
Needs matplotlib (Debian: python3-matplotlib). Exit status 2 on an unreadable result file.
"""
import argparse
import json
import os
import sys

import matplotlib

matplotlib.use("Agg")
import matplotlib.pyplot as plt  # noqa: E402


def cdf(values):
    xs = sorted(values)
    n = len(xs)
    return xs, [(i + 1) / n for i in range(n)]


def rate_label(r):
    rate = r.get("rate", 0)
    return f"rate {rate:g}/s" if rate > 0 else f"closed loop c={r.get('concurrency', 0)}"


def fail(message):
    print(f"plot_bench.py: {message}", file=sys.stderr)
    sys.exit(2)


def load(paths):
    runs = []  # (path, summary)
    for path in paths:
        try:
            with open(path) as f:
                r = json.load(f)
        except (OSError, ValueError) as e:
            fail(f"{path}: {e}")
        if "tokens_per_s" not in r:
            fail(f"{path}: not a kvsplit-bench-serving result (no tokens_per_s)")
        runs.append((path, r))
        if "in_process" in r:
            runs.append((path, r["in_process"]))
    # By mode, then offered rate (closed-loop runs, rate 0, last), then file name.
    runs.sort(key=lambda x: (x[1].get("mode", ""), x[1].get("rate", 0) <= 0, x[1].get("rate", 0), x[0]))
    return runs


def plot_latency(runs, out_dir, title):
    fig, axes = plt.subplots(1, 3, figsize=(16, 4.6))
    cmap = plt.get_cmap("viridis")
    for ax, key, name in zip(axes, ["ttft_ms", "itl_ms", "e2e_ms"],
                             ["time to first token", "inter-token latency", "end-to-end latency"]):
        for i, (path, r) in enumerate(runs):
            samples = [v for v in r.get("samples", {}).get(key, []) if v > 0]
            if not samples:
                continue
            xs, ys = cdf(samples)
            style = "-" if r.get("mode") == "grpc" else "--"
            ax.plot(xs, ys, style, color=cmap(i / max(1, len(runs) - 1)),
                    label=f"{r.get('mode', '?')} {rate_label(r)}")
        ax.set_xscale("log")
        ax.set_xlabel(f"{name} (ms, log scale)")
        ax.set_ylabel("fraction of samples")
        ax.grid(True, which="both", alpha=0.3)
    axes[0].legend(fontsize=8, loc="lower right")
    if title:
        fig.suptitle(title)
    fig.tight_layout()
    out = os.path.join(out_dir, "latency_cdf.png")
    fig.savefig(out, dpi=120)
    plt.close(fig)
    return out


def plot_throughput(runs, out_dir, title):
    rated = [r for _, r in runs if r.get("mode") == "grpc" and r.get("rate", 0) > 0]
    if len({r["rate"] for r in rated}) < 2:
        return None
    rated.sort(key=lambda r: r["rate"])
    rates = [r["rate"] for r in rated]
    fig, (ax1, ax2) = plt.subplots(1, 2, figsize=(12, 4.6))
    ax1.plot(rates, [r["tokens_per_s"] for r in rated], "o-")
    ax1.set_xlabel("offered rate (requests/s)")
    ax1.set_ylabel("generated tokens/s")
    ax1.set_title("throughput")
    ax2.plot(rates, [r["requests_per_s"] for r in rated], "o-", label="completed requests/s")
    ax2.plot(rates, [r["goodput_rps"] for r in rated], "s--", color="tab:green",
             label="goodput (met TTFT and ITL targets)")
    ax2.plot([0, max(rates)], [0, max(rates)], ":", color="gray", label="offered (y = x)")
    ax2.set_xlabel("offered rate (requests/s)")
    ax2.set_ylabel("requests/s")
    ax2.set_title("completed and good requests")
    ax2.legend(fontsize=8, loc="upper left")
    for ax in (ax1, ax2):
        ax.set_xlim(left=0)
        ax.set_ylim(bottom=0)
        ax.grid(True, alpha=0.3)
    if title:
        fig.suptitle(title)
    fig.tight_layout()
    out = os.path.join(out_dir, "throughput_vs_rate.png")
    fig.savefig(out, dpi=120)
    plt.close(fig)
    return out


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("results", nargs="+", help="kvsplit-bench-serving --json-out files")
    ap.add_argument("--out-dir", default=".", help="where the PNGs go (created)")
    ap.add_argument("--title", default="", help="figure title")
    a = ap.parse_args()
    runs = load(a.results)
    os.makedirs(a.out_dir, exist_ok=True)
    print("wrote", plot_latency(runs, a.out_dir, a.title))
    out = plot_throughput(runs, a.out_dir, a.title)
    if out:
        print("wrote", out)
    else:
        print("throughput_vs_rate.png skipped: the gRPC results cover fewer than two --rate values")


if __name__ == "__main__":
    main()
