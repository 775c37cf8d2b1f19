#!/usr/bin/env python3
"""Tests scripts/check_layers.py: the real tree is clean, and each kind of wrong include fails.

usage: check_layers_test.py PROJECT_ROOT      (exit 0 when every case behaves)
"""
import os, shutil, subprocess, sys, tempfile

root = os.path.abspath(sys.argv[1])
script = os.path.join(root, "scripts", "check_layers.py")
failures = []


def run(tree):
    return subprocess.run([sys.executable, script, "--root", tree], capture_output=True, text=True)


def fake_tree(files):
    tree = tempfile.mkdtemp()
    os.makedirs(os.path.join(tree, "docs"))
    shutil.copy(os.path.join(root, "docs", "architecture.md"), os.path.join(tree, "docs"))
    for rel, text in files.items():
        path = os.path.join(tree, rel)
        os.makedirs(os.path.dirname(path), exist_ok=True)
        open(path, "w").write(text)
    return tree


def expect(name, files, code, needle):
    tree = fake_tree(files)
    r = run(tree)
    shutil.rmtree(tree)
    if r.returncode != code or needle not in r.stdout + r.stderr:
        failures.append(f"{name}: exit {r.returncode} (want {code}), output:\n{r.stdout}{r.stderr}")


r = run(root)
if r.returncode != 0:
    failures.append(f"the project tree: exit {r.returncode}:\n{r.stdout}{r.stderr}")

ok = {"src/kv/a.cpp": '#include "backend/backend.h"\n#include "kvsplit/status.h"\n#include "kv/b.h"\n'}
expect("allowed includes", ok, 0, "0 violation")
expect("upward include (kv -> sched)", {"src/kv/a.cpp": '#include "sched/worker.h"\n'}, 1,
       "src/kv/a.cpp:1: \"sched/worker.h\": kv must not include sched")
expect("sub-folder counts as its module", {"src/backend/cpu/x.cpp": '\n#include "model/loader.h"\n'},
       1, "src/backend/cpu/x.cpp:2: \"model/loader.h\": backend must not include model")
expect("kernels include nothing from src", {"kernels/ops/x.cuh": '#include "common/log.h"\n'}, 1,
       "kernels must not include common")
expect("an include root as a prefix", {"src/model/x.cpp": '#include "src/kv/kv_pool.h"\n'}, 1,
       "include roots are src/ and include/ themselves")
expect("unknown module", {"src/model/x.cpp": '#include "nosuch/x.h"\n'}, 1, "nosuch/ is not a module")
expect("module folder missing from the graph", {"src/newmod/x.cpp": "\n"}, 1,
       "module newmod is not in the graph")

for f in failures:
    print("FAIL", f)
print(f"check_layers_test: {len(failures)} failure(s)")
sys.exit(1 if failures else 0)
