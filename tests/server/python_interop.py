#!/usr/bin/python3
"""Interop: a Python grpcio client (Debian python3-grpcio) with stubs generated here from our proto
talks to the real kvsplit-server. Checks the greedy goldens (concurrently), INVALID_ARGUMENT for
bad sampling values, GetModelInfo / GetServerStats, and that a cancelled stream frees all KV.

usage: python_interop.py PATH/TO/kvsplit-server PROJECT_ROOT   (exit 77 = skipped)
"""
import concurrent.futures as cf
import importlib
import json
import os
import shutil
import subprocess
import sys
import tempfile
import time

SKIP = 77


def main():
    server_bin, root = sys.argv[1], sys.argv[2]
    models = os.environ.get("KVSPLIT_MODELS") or os.path.normpath(os.path.join(root, "..", "shared", "models"))
    if not os.path.exists(os.path.join(models, "stories260K.bin")):
        print(f"skip: no models under {models}")
        return SKIP
    try:
        import grpc
    except ImportError:
        print("skip: python3-grpcio is not installed")
        return SKIP
    plugin = shutil.which("grpc_python_plugin")
    if not plugin or not shutil.which("protoc"):
        print("skip: protoc / grpc_python_plugin not found")
        return SKIP
    gen = tempfile.mkdtemp()
    subprocess.run(["protoc", "-I" + os.path.join(root, "proto"), "--python_out=" + gen, "--grpc_out=" + gen,
                    "--plugin=protoc-gen-grpc=" + plugin,
                    os.path.join(root, "proto", "kvsplit", "v1", "generation.proto")], check=True)
    sys.path.insert(0, gen)
    pb = importlib.import_module("kvsplit.v1.generation_pb2")
    stubs = importlib.import_module("kvsplit.v1.generation_pb2_grpc")

    log = open(os.path.join(gen, "server.log"), "w")
    srv = subprocess.Popen([server_bin, "--model", os.path.join(models, "stories260K-hf"), "--host", "127.0.0.1",
                            "--port", "0", "--metrics-port", "-1"], stdout=subprocess.PIPE, stderr=log, text=True)
    try:
        line = srv.stdout.readline()
        if "listening on" not in line:
            print("server did not start:", line, open(log.name).read())
            return 1
        addr = line.split("listening on ")[1].split()[0]
        ch = grpc.insecure_channel(addr)
        grpc.channel_ready_future(ch).result(timeout=30)
        stub = stubs.GenerationStub(ch)
        failures = []

        cases = [json.loads(l) for l in open(os.path.join(models, "golden", "stories260K_greedy.jsonl"))]

        def run(c):
            req = pb.GenerateRequest(prompt=c["prompt"], max_tokens=c["steps"] - len(c["prompt_token_ids"]) + 1)
            req.sampling.temperature = 0.0
            ids, text, last = [], "", None
            for r in stub.Generate(req, timeout=120):
                ids += list(r.token_ids)
                text += r.text
                last = r
            return ids, text, last

        with cf.ThreadPoolExecutor(len(cases)) as ex:
            results = list(ex.map(run, cases))
        for c, (ids, text, last) in zip(cases, results):
            if ids != c["output_token_ids"]:
                failures.append(f"golden {c['prompt']!r} steps {c['steps']}: ids differ")
            if last.usage.completion_tokens != len(ids) or last.finish_reason == pb.FINISH_REASON_UNSPECIFIED:
                failures.append(f"golden {c['prompt']!r}: bad final message {last}")

        for field, value in [("temperature", -1.0), ("top_p", 0.0), ("min_p", 1.5)]:
            req = pb.GenerateRequest(prompt="Tom", max_tokens=4)
            setattr(req.sampling, field, value)
            try:
                list(stub.Generate(req, timeout=10))
                failures.append(f"sampling.{field}={value} accepted")
            except grpc.RpcError as e:
                if e.code() != grpc.StatusCode.INVALID_ARGUMENT or f"sampling.{field}" not in e.details():
                    failures.append(f"sampling.{field}: got {e.code()} {e.details()}")

        info = stub.GetModelInfo(pb.GetModelInfoRequest(), timeout=10)
        if info.vocab_size != 512 or info.max_context != 512:
            failures.append(f"GetModelInfo: {info}")

        # Cancel mid-stream: every pool returns to all blocks free. Eight long streams at once, each
        # cancelled after its first message, so that the engine cannot finish them all first.
        before = stub.GetServerStats(pb.GetServerStatsRequest(), timeout=10)
        calls = [stub.Generate(pb.GenerateRequest(prompt="Once upon a time", max_tokens=500, ignore_eos=True),
                               timeout=60) for _ in range(8)]
        for call in calls:
            next(call)
            call.cancel()
        for _ in range(250):
            s = stub.GetServerStats(pb.GetServerStatsRequest(), timeout=10)
            if all(p.kv_blocks_free == p.kv_blocks_total for p in s.pools) and s.num_running == 0:
                break
            time.sleep(0.02)
        else:
            failures.append(f"KV not freed after cancel: {s}")
        if s.requests_cancelled <= before.requests_cancelled:
            failures.append("cancel not counted in GetServerStats")

        print(f"{len(cases)} goldens, 3 invalid requests, info, cancel: {len(failures)} failures")
        for f in failures:
            print("FAIL:", f)
        return 0 if not failures else 1
    finally:
        srv.terminate()
        try:
            srv.wait(timeout=20)
        except subprocess.TimeoutExpired:
            srv.kill()


if __name__ == "__main__":
    sys.exit(main())
