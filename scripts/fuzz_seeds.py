#!/usr/bin/env python3
"""Writes small seed corpora for the fuzz targets (scripts/fuzz.sh) from the shared fixtures.

Seeds are made small (a fuzzer mutates a 4 KB input far faster than a 7 MB one) but stay valid:
safetensors files keep a few tensors back to back, tokenizer.json files keep a slice of the vocab
with the merges that stay inside it, configs are the shipped ones. HF config.json seeds are the
shared models' (with their generation_config.json after a NUL byte) and variants of them; HTTP
requests and request traces are written here.
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


def hf_config_seeds():
    # hf_config_fuzz: config.json, optionally followed by a NUL byte and generation_config.json.
    files = sorted(glob.glob(os.path.join(a.models, "**", "config.json"), recursive=True))
    for i, path in enumerate(files):
        text = open(path, "rb").read()
        put("hf_config", f"{i}", text)
        gen = os.path.join(os.path.dirname(path), "generation_config.json")
        if os.path.exists(gen):
            put("hf_config", f"{i}_gen", text + b"\0" + open(gen, "rb").read())
    # Variants that reach the RoPE forms, layer types and sliding windows.
    base = {"architectures": ["LlamaForCausalLM"], "hidden_size": 64, "intermediate_size": 96,
            "num_hidden_layers": 2, "num_attention_heads": 4, "num_key_value_heads": 2,
            "vocab_size": 32, "max_position_embeddings": 64, "eos_token_id": [2, 3]}
    variants = {
        "llama3": {"rope_theta": 500000.0, "rope_scaling": {
            "rope_type": "llama3", "factor": 8.0, "low_freq_factor": 1.0,
            "high_freq_factor": 4.0, "original_max_position_embeddings": 16}},
        "yarn": {"rope_parameters": {"rope_type": "yarn", "rope_theta": 10000.0, "factor": 4.0,
                                     "original_max_position_embeddings": 16}},
        "yarn_mscale": {"rope_scaling": {"type": "yarn", "factor": 4.0, "mscale": 0.707,
                                         "mscale_all_dim": 0.707, "beta_fast": 32, "beta_slow": 1,
                                         "original_max_position_embeddings": 16},
                        "rope_theta": 10000.0},
        "yarn_attention": {"rope_scaling": {"rope_type": "yarn", "factor": 2.0,
                                            "attention_factor": 1.25,
                                            "original_max_position_embeddings": 32}},
        "linear": {"rope_scaling": {"type": "linear", "factor": 2.0}},
        "dynamic": {"rope_scaling": {"type": "dynamic", "factor": 2.0}},
        "qwen2_sliding": {"architectures": ["Qwen2ForCausalLM"], "use_sliding_window": True,
                          "sliding_window": 16, "max_window_layers": 1,
                          "layer_types": ["full_attention", "sliding_attention"]},
        "mistral_window": {"architectures": ["MistralForCausalLM"], "sliding_window": 8,
                           "head_dim": 16, "tie_word_embeddings": True},
        "model_type": {"architectures": None, "model_type": "qwen2", "bos_token_id": None},
    }
    for name, extra in variants.items():
        put("hf_config", f"variant_{name}", json.dumps(dict(base, **extra), indent=2))


def metrics_http_seeds():
    # metrics_http_fuzz: what a client sends the /metrics listener, answered and not.
    requests = [
        b"GET /metrics HTTP/1.1\r\nHost: localhost:9090\r\nUser-Agent: Prometheus/2.48.0\r\n"
        b"Accept: text/plain;version=0.0.4;q=1,*/*;q=0.1\r\nAccept-Encoding: gzip\r\n\r\n",
        b"HEAD /metrics HTTP/1.0\r\n\r\n",
        b"GET /metrics?name[]=up HTTP/1.1\n\n",
        b"GET http://127.0.0.1:9090/metrics HTTP/1.1\r\nHost: 127.0.0.1\r\n\r\n",
        b"\r\nGET /metrics HTTP/1.1\r\n\r\n",
        b"GET /metrics HTTP/1.1\n\r\n",
        b"GET / HTTP/1.1\r\nHost: x\r\n\r\n",
        b"POST /metrics HTTP/1.1\r\nContent-Length: 0\r\n\r\n",
        b"GET /metrics\r\n\r\n",
        b"GET /metrics SPDY/3\r\n\r\n",
        b"\x16\x03\x01garbage\r\n\r\n",
        b"GET /metr",
        b"GET /metrics HTTP/1.1 x",
        b"GET /" + b"a" * 3000,
        b"GET /metrics HTTP/1.1\r\nX: " + b"a" * 9000 + b"\r\n\r\n",
    ]
    for i, r in enumerate(requests):
        put("metrics_http", f"{i}", r)


def trace_seeds():
    # trace_fuzz: a phased trace as kvm::make_phased_trace writes it (Poisson arrivals per class,
    # a spike of long prompts), plus hand-written lines (blank, CRLF, no class, errors).
    import math, random
    rng = random.Random(1)
    length = lambda m: rng.randint(max(1, m // 2), m + m // 2)
    reqs = []
    for cls, rate, prompt, output, t0, t1 in [("interactive", 4, 32, 32, 0, 3000),
                                              ("batch", 0.5, 128, 64, 0, 1000),
                                              ("batch", 6, 384, 96, 1000, 2000),
                                              ("batch", 0.5, 128, 64, 2000, 3000)]:
        t = t0
        while True:
            t += -math.log(rng.random() or 0.5) * 1000.0 / rate
            if t >= t1:
                break
            reqs.append({"arrival_ms": round(t, 3), "prompt_tokens": length(prompt),
                         "output_tokens": length(output), "class": cls})
    reqs.sort(key=lambda r: r["arrival_ms"])
    lines = [json.dumps(r, separators=(",", ":"), sort_keys=True) for r in reqs]
    put("trace", "phased", "\n".join(lines) + "\n")
    put("trace", "mixed", '{"arrival_ms": 0, "prompt_tokens": 10, "output_tokens": 5, '
        '"class": "voice"}\r\n\n   \r\n{"arrival_ms": 12.5, "prompt_tokens": 3.0, '
        '"output_tokens": 1, "class": null}\n')
    put("trace", "unknown_field", lines[0] + "\n" + '{"arrival_ms": 1, "prompt_tokens": 2, '
        '"output_tokens": 1, "clas": "x"}\n')
    put("trace", "duplicate_key", '{"arrival_ms": 5, "prompt_tokens": 3, "output_tokens": 2, '
        '"arrival_ms": 7}\n')


def guide_seeds():
    # guide_fuzz: byte 0 % 3: 1 a regex, 2 a GBNF grammar, 0 a JSON schema; then the constraint,
    # a NUL, and the bytes that steer a generation through it.
    regexes = [r"[0-9]{3}-[a-z]{2}", r"(yes|no|maybe( not)?)!{0,2}", r"[^\"]*\.?(?:ab|c)+",
               r"\d+(\.\d+)?[eE]?", r"(?<n>\w+)@\w+\.com", r"[\u00e0-\u00ff]{2,}|x*",
               r"(a|b)*a(a|b){12}"]
    schemas = ['{"type":"object","properties":{"name":{"type":"string","maxLength":8},'
               '"age":{"type":"integer","minimum":0},"tags":{"type":"array","items":'
               '{"enum":["a","b"]},"maxItems":3}},"required":["name"]}',
               '{"anyOf":[{"type":"null"},{"$ref":"#/$defs/n"}],"$defs":{"n":{"type":"object",'
               '"properties":{"next":{"$ref":"#/$defs/n"}}}}}',
               '{"type":"string","format":"date-time"}', '{}']
    grammars = ['root ::= "(" root ")" | [a-z]*',
                'root ::= expr\nexpr ::= term (("+" | "-") term)*\nterm ::= [0-9]+ | "(" expr ")"',
                '# json\nroot ::= value\nvalue ::= obj | arr | str | [0-9]+ | "true" | "null"\n'
                'obj ::= "{" (str ":" value ("," str ":" value)*)? "}"\n'
                'arr ::= "[" (value ("," value)*)? "]"\nstr ::= "\\"" [^"\\\\]* "\\""',
                'root ::= a{2,4} b?\na ::= "x" | "\\u00e9"\nb ::= [^\\n]+ "\\n"']
    steer = bytes(range(0, 256, 7)) * 3
    for i, r in enumerate(regexes):
        put("guide", f"regex{i}", b"\x01" + r.encode() + b"\x00" + steer)
    for i, g in enumerate(grammars):
        put("guide", f"grammar{i}", b"\x02" + g.encode() + b"\x00" + steer)
    for i, sc in enumerate(schemas):
        put("guide", f"schema{i}", b"\x00" + sc.encode() + b"\x00" + steer)


safetensors_seeds()
tokenizer_seeds()
tokenizer_bin_seeds()
encode_seeds()
request_seeds()
config_seeds()
hf_config_seeds()
metrics_http_seeds()
trace_seeds()
guide_seeds()
for kind in sorted(os.listdir(a.out)):
    print(f"fuzz_seeds: {kind}: {len(os.listdir(os.path.join(a.out, kind)))} seeds", file=sys.stderr)
