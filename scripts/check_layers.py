#!/usr/bin/env python3
"""Fails when an #include goes against the module layering.

The allowed graph is written once, in docs/architecture.md between the lines
`<!-- layers:begin -->` and `<!-- layers:end -->`, as `module: allowed modules...`.
Every module may include itself and the public API ("kvsplit/..."). Files under src/<module>/
(sub-folders belong to their top folder: backend/cpu is backend) and kernels/ (module `kernels`)
are checked; a quoted include "<x>/..." names module x ("kernels/..." is the kernels module).
An include of "src/..." or "include/..." is an error (one meaning per include root).

usage: check_layers.py [--root DIR]      exit 0 clean, 1 violations (listed), 2 bad graph
"""
import argparse, os, re, sys

ap = argparse.ArgumentParser()
ap.add_argument("--root", default=os.path.join(os.path.dirname(os.path.abspath(__file__)), ".."))
a = ap.parse_args()
root = os.path.abspath(a.root)

doc = open(os.path.join(root, "docs", "architecture.md"), encoding="utf-8").read()
m = re.search(r"<!-- layers:begin -->(.*?)<!-- layers:end -->", doc, re.S)
if not m:
    print("check_layers: docs/architecture.md has no <!-- layers:begin --> block", file=sys.stderr)
    sys.exit(2)
allowed = {}
for line in m.group(1).splitlines():
    line = line.strip().strip("`")
    mm = re.match(r"^([a-z_]+):\s*(.*)$", line)
    if mm:
        allowed[mm.group(1)] = set(mm.group(2).split())
for mod, deps in allowed.items():
    for d in deps:
        if d not in allowed:
            print(f"check_layers: module {mod} lists unknown module {d}", file=sys.stderr)
            sys.exit(2)

include_re = re.compile(r'^[ \t]*#[ \t]*include[ \t]+"([^"]+)"', re.M)
violations = []


def check_file(path, mod):
    text = open(path, encoding="utf-8", errors="replace").read()
    for mm in include_re.finditer(text):
        inc = mm.group(1)
        line = text.count("\n", 0, mm.start()) + 1
        rel = os.path.relpath(path, root)
        if inc.startswith(("src/", "include/")):
            violations.append(f"{rel}:{line}: \"{inc}\": include roots are src/ and include/ themselves")
            continue
        if "/" not in inc:
            continue  # a header beside the file
        target = inc.split("/", 1)[0]
        if target == "kvsplit" or target == mod:
            continue
        if target not in allowed:
            violations.append(f"{rel}:{line}: \"{inc}\": {target}/ is not a module")
        elif target not in allowed[mod]:
            violations.append(f"{rel}:{line}: \"{inc}\": {mod} must not include {target} "
                              f"(allowed: {' '.join(sorted(allowed[mod])) or 'nothing'})")


def walk(top, mod_of):
    for dp, dn, fn in os.walk(top):
        for f in fn:
            if f.endswith((".h", ".cpp", ".cu", ".cuh")):
                p = os.path.join(dp, f)
                mod = mod_of(p)
                if mod not in allowed:
                    violations.append(f"{os.path.relpath(p, root)}: module {mod} is not in the graph")
                    continue
                check_file(p, mod)


walk(os.path.join(root, "src"), lambda p: os.path.relpath(p, os.path.join(root, "src")).split(os.sep)[0])
walk(os.path.join(root, "kernels"), lambda p: "kernels")
for v in violations:
    print(v)
print(f"check_layers: {len(violations)} violation(s)", file=sys.stderr)
sys.exit(1 if violations else 0)
