#!/usr/bin/env python3
"""Writes small seed corpora for the fuzz targets (scripts/fuzz.sh) from the shared fixtures.

Seeds are made small (a fuzzer mutates a 4 KB input far faster than a 7 MB one) but stay valid:
safetensors files keep a few tensors back to back, tokenizer.json files keep a slice of the vocab
with the merges that stay inside it, configs are the shipped ones.
usage: fuzz_seeds.py --models DIR --configs DIR --out DIR
"""
import argparse, glob, json, os, struct, sys

ap = argparse.ArgumentParser()
ap.add_argument("--models", required=True)
ap.add_argument("--configs", required=True)
ap.add_argument("--out", required=True)
ap.add_argument("--proto-dir", default=None, help="proto/ of the project: GenerateRequest seeds")
a = ap.parse_args()


def put(kind, name, data):
    d = os.path.join(a.out, kind)
    os.makedirs(d, exist_ok=True)
    with open(os.path.join(d, name), "wb") as f:
        f.write(data if isinstance(data, bytes) else data.encode())


def safetensors_seeds():
    files = sorted(glob.glob(os.path.join(a.models, "**", "*.safetensors"), recursive=True))
    for i, path in enumerate(files):
        raw = open(path, "rb").read()
        (n,) = struct.unpack("<Q", raw[:8])
        header = json.loads(raw[8:8 + n])
        data = raw[8 + n:]
        tensors = sorted((k for k in header if k != "__metadata__"),
                         key=lambda k: header[k]["data_offsets"][1] - header[k]["data_offsets"][0])
        for keep in (1, 3):
            h, blob = {"__metadata__": header.get("__metadata__", {})}, b""
            for k in tensors[:keep]:
                b, e = header[k]["data_offsets"]
                h[k] = {"dtype": header[k]["dtype"], "shape": header[k]["shape"],
                        "data_offsets": [len(blob), len(blob) + e - b]}
                blob += data[b:e]
            text = json.dumps(h).encode()
            text += b" " * ((8 - len(text) % 8) % 8)
            put("safetensors", f"{i}_{keep}", struct.pack("<Q", len(text)) + text + blob)


def tokenizer_seeds():
    files = sorted(glob.glob(os.path.join(a.models, "**", "tokenizer.json"), recursive=True))
    for i, path in enumerate(files):
        j = json.load(open(path, encoding="utf-8"))
        m = j.get("model") or {}
        vocab = m.get("vocab")
        if isinstance(vocab, dict):
            keep = {t: v for t, v in vocab.items() if v < 400}
            merges = []
            for mg in m.get("merges", []):
                parts = mg.split(" ", 1) if isinstance(mg, str) else mg
                if len(parts) == 2 and all(p in keep for p in parts) and "".join(parts) in keep:
                    merges.append(mg)
                if len(merges) >= 200:
                    break
            m = dict(m, vocab=keep, merges=merges)
            j = dict(j, model=m, added_tokens=[t for t in j.get("added_tokens", []) if t["id"] < 400])
        put("tokenizer_json", f"{i}", json.dumps(j, ensure_ascii=False))


def tokenizer_bin_seeds():
    path = os.path.join(a.models, "tok512.bin")
    if os.path.exists(path):
        put("tokenizer_json", "tok512.bin", open(path, "rb").read())


def encode_seeds():
    n = 0
    for path in sorted(glob.glob(os.path.join(a.models, "tokenizers", "*", "encode_shared.jsonl"))):
        for line in open(path, encoding="utf-8"):
            put("tokenizer_encode", f"{n}", json.loads(line)["text"].encode("utf-8", "surrogatepass"))
            n += 1
    sample = os.path.join(a.models, "..", "data", "tinystories_sample.txt")
    if os.path.exists(sample):
        text = open(sample, "rb").read()
        for i in range(0, min(len(text), 8192), 1024):
            put("tokenizer_encode", f"story{i}", text[i:i + 1024])


def request_seeds():
    # Serialized kvsplit.v1.GenerateRequest messages built from the golden prompts, with the
    # Python protobuf runtime over a module protoc generates here (skipped when either is missing).
    import shutil, subprocess, tempfile
    if not a.proto_dir or not shutil.which("protoc"):
        print("fuzz_seeds: no protoc: request seeds skipped", file=sys.stderr)
        return
    tmp = tempfile.mkdtemp()
    protos = glob.glob(os.path.join(a.proto_dir, "kvsplit", "v1", "*.proto"))
    subprocess.run(["protoc", "-I", a.proto_dir, "--python_out", tmp, *protos], check=True)
    sys.path.insert(0, tmp)
    try:
        from kvsplit.v1 import generation_pb2 as pb
    except ImportError as e:
        print(f"fuzz_seeds: no python protobuf ({e}): request seeds skipped", file=sys.stderr)
        return
    cases = [json.loads(l) for l in open(os.path.join(a.models, "golden", "stories260K_greedy.jsonl"))]
    for i, c in enumerate(cases):
        r = pb.GenerateRequest(prompt=c["prompt"], max_tokens=c["steps"] - len(c["prompt_token_ids"]) + 1)
        if i % 2:
            r.sampling.temperature = 0.7
            r.sampling.top_p = 0.9
            r.sampling.top_k = 40
            r.stop.append(".")
            r.top_logprobs = 3
            r.sla_class = "interactive"
        if i % 3 == 0:
            r.ClearField("prompt")
            r.prompt_token_ids.ids.extend(c["prompt_token_ids"])
            r.request_id = f"client-{i}"
        put("request_convert", f"{i}", r.SerializeToString())


def config_seeds():
    for path in sorted(glob.glob(os.path.join(a.configs, "*.yaml"))):
        put("config_yaml", os.path.basename(path), open(path, "rb").read())


safetensors_seeds()
tokenizer_seeds()
tokenizer_bin_seeds()
encode_seeds()
request_seeds()
config_seeds()
for kind in sorted(os.listdir(a.out)):
    print(f"fuzz_seeds: {kind}: {len(os.listdir(os.path.join(a.out, kind)))} seeds", file=sys.stderr)
