#!/usr/bin/env python3
"""Quality of the KV policies on recall-llama (docs/kv-cuts.md, "Measured").

For each policy setting: teacher-forced NLL over recall_eval_docs.jsonl (`kvsplit perplexity`) and
recall accuracy over recall_eval.jsonl (`kvsplit generate`, greedy, one token after each prompt),
both fed as generation (a --prefill chunk, then one token per decode step, the policy acting
between steps), against the average resident KV bytes relative to full precision.

  scripts/semantic_quality.py [--kvsplit build/kvsplit] [--models ../shared/models]
                              [--data ../shared/data] [--block-size 8] [--quick]
"""
import argparse
import json
import os
import subprocess
import sys


def run(cmd):
    p = subprocess.run(cmd, capture_output=True, text=True)
    if p.returncode != 0:
        sys.exit(f"failed ({p.returncode}): {' '.join(cmd)}\n{p.stderr}")
    return p.stdout


def main():
    root = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
    ap = argparse.ArgumentParser()
    ap.add_argument("--kvsplit", default=os.path.join(root, "build", "kvsplit"))
    ap.add_argument("--models", default=os.environ.get("KVSPLIT_MODELS",
                                                       os.path.join(root, "..", "shared", "models")))
    ap.add_argument("--data", default=None)
    ap.add_argument("--block-size", type=int, default=8)
    ap.add_argument("--prefill", type=int, default=16)
    ap.add_argument("--quick", action="store_true", help="a few settings only")
    args = ap.parse_args()
    data = args.data or os.path.join(args.models, "..", "data")
    model = os.path.join(args.models, "recall-llama")
    docs = os.path.join(data, "recall_eval_docs.jsonl")
    queries = [json.loads(l) for l in open(os.path.join(data, "recall_eval.jsonl"))]
    common = ["--model", model, "--threads", "1", "--block-size", str(args.block_size),
              "--prefill", str(args.prefill)]

    bs = args.block_size
    settings = [("full", [])]
    recents = [bs, 2 * bs, 4 * bs] if not args.quick else [2 * bs]
    for recent in recents:
        settings.append((f"streaming recent {recent}",
                         ["--kv-policy", "streaming", "--recent-tokens", str(recent)]))
        for heavy in ([bs, 2 * bs, 4 * bs] if not args.quick else [2 * bs]):
            settings.append((f"h2o recent {recent} heavy {heavy}",
                             ["--kv-policy", "h2o", "--recent-tokens", str(recent),
                              "--heavy-tokens", str(heavy), "--score-interval", "1"]))
        # (demote threshold, evict threshold, recall rung, max recalls per step)
        ladders = [(0.9, 0.0, "full", 0), (0.99, 0.0, "full", 0), (0.99, 0.5, "full", 0),
                   (0.99, 0.8, "full", 0), (0.99, 0.8, "full", 1), (0.99, 0.8, "int4", 0),
                   (0.99, 0.8, "int4", 1), (0.99, 0.8, "int4", 2)]
        for sem, ev, rung, k in (ladders if not args.quick else [(0.99, 0.0, "full", 0)]):
            name = f"semantic recent {recent} thr {sem} evict {ev}"
            if ev > 0:
                name += f" {rung}" + (f" top{k}" if k else "")
            settings.append((name,
                             ["--kv-policy", "semantic", "--recent-tokens", str(recent),
                              "--semantic-threshold", str(sem), "--evict-threshold", str(ev),
                              "--recall-threshold", "1", "--score-interval", "1",
                              "--demote-after-steps", "1", "--recall-precision", rung,
                              "--max-recalls-per-step", str(k)]))

    print(f"recall-llama, block size {bs}, prefill {args.prefill}; NLL over "
          f"{os.path.basename(docs)}, accuracy over {len(queries)} queries")
    print(f"{'setting':56s} {'resident':>8s} {'nll':>8s} {'dNLL%':>7s} {'acc':>7s} "
          f"{'demote':>7s} {'evict':>7s} {'recall':>7s}")
    base_nll = None
    for name, flags in settings:
        ppl = json.loads(run([args.kvsplit, "perplexity", "--jsonl", docs, "--json"] + common +
                             flags))
        gen = run([args.kvsplit, "generate", "--json", "--temperature", "0", "--max-tokens", "1",
                   "--ignore-eos"] + common + flags +
                  sum((["--prompt", q["prompt"]] for q in queries), []))
        outs = [json.loads(l) for l in gen.splitlines() if l.strip()]
        hits = sum(1 for q, o in zip(queries, outs) if o["text"].strip() == q["expect"])
        if base_nll is None:
            base_nll = ppl["nll"]
        d = 100.0 * (ppl["nll"] - base_nll) / base_nll
        print(f"{name:56s} {ppl['avg_resident_kv_fraction']:8.3f} {ppl['nll']:8.4f} {d:+7.1f} "
              f"{hits:3d}/{len(queries)} {ppl['demotions']:7d} {ppl['evictions']:7d} "
              f"{ppl['recalls']:7d}", flush=True)


if __name__ == "__main__":
    main()
