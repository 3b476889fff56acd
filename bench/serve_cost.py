#!/usr/bin/env python3
"""What `kiln serve`'s front end costs per request, on this machine, no GPU needed: a model with
ResNet-50's input (float32 [N,3,224,224], 602 KB a sample) and next to no compute (one Slice
keeps a pixel: ~30 us an inference on the cpu backend, at any batch), made here with the onnx
package and built for the cpu backend; `kiln serve` started on 127.0.0.1 only, then N Triton
gRPC clients (batch-1 requests, each on its own connection, each loop bounded in count and
time) for every N of --clients. Per N, over a steady window after --warmup (not the clients'
start-up): requests/s, the server's CPU seconds per request (user and system, from
/proc/PID/stat of the server and every process under it), the
requests an inference joined on average (its /metrics), and whether every answer was right.

  PYTHONPATH=build/python python3 bench/serve_cost.py [--clients 1,8,32]
      [--duration 5] [--server-path DIR] [--serve-args '--pad-batches'] [--json F]

--server-path runs the server from another copy of the kiln package (a folder holding kiln/),
e.g. the commit before a change, for a before/after on the same machine. On the GPU machine
bench/serve_gpu.sh measures the real model (KILN_SERVE_PARTS=tables).
"""
from __future__ import annotations

import argparse
import json
import multiprocessing as mp
import os
import re
import socket
import subprocess
import sys
import tempfile
import threading
import time
import urllib.request

import numpy as np

from serve_load import process_tree  # bench/: the server and any process under it

SHAPE = [3, 224, 224]


def make_engine(folder: str) -> str:
    """slice224.onnx and repo/slice224.kiln (cpu, batch 1-64) in `folder`; the repository."""
    import onnx
    from onnx import TensorProto, helper, numpy_helper

    import kiln

    def ints(n, v):
        return numpy_helper.from_array(np.array(v, np.int64), n)

    g = helper.make_graph(
        [helper.make_node("Slice", ["input", "starts", "ends", "axes"], ["output"])], "slice224",
        [helper.make_tensor_value_info("input", TensorProto.FLOAT, ["N"] + SHAPE)],
        [helper.make_tensor_value_info("output", TensorProto.FLOAT, ["N", 3, 1, 1])],
        initializer=[ints("starts", [0, 0]), ints("ends", [1, 1]), ints("axes", [2, 3])])
    path = os.path.join(folder, "slice224.onnx")
    onnx.save(helper.make_model(g, opset_imports=[helper.make_opsetid("", 13)]), path)
    repo = os.path.join(folder, "repo")
    os.makedirs(repo, exist_ok=True)
    kiln.build(path, backend="cpu", min_shapes={"input": [1] + SHAPE},
               opt_shapes={"input": [8] + SHAPE}, max_shapes={"input": [64] + SHAPE}
               ).save(os.path.join(repo, "slice224.kiln"))
    return repo


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def cpu(pid: int) -> tuple[float, float]:
    """(user, system) CPU seconds of `pid` and its descendants."""
    user = system = 0.0
    tick = os.sysconf("SC_CLK_TCK")
    for p in process_tree(pid):
        try:
            with open(f"/proc/{p}/stat") as f:
                fields = f.read().rsplit(")", 1)[1].split()
            user += int(fields[11]) / tick
            system += int(fields[12]) / tick
        except (OSError, ValueError, IndexError):
            pass
    return user, system


def counters(http: str) -> dict:
    with urllib.request.urlopen(f"http://{http}/metrics", timeout=10) as r:
        text = r.read().decode()
    out = {}
    for name in ("kiln_requests_total", "kiln_inferences_total", "kiln_samples_total"):
        out[name] = sum(float(v) for v in re.findall(rf'^{name}\{{[^}}]*\}}\s+(\S+)$', text, re.M))
    return out


def clients(grpc: str, n: int, seconds: float, max_requests: int, ready, results) -> None:
    """`n` client threads, each on its own connection, sending batch-1 requests until
    `seconds` have passed (or max_requests each); puts (answers, wrong answers, errors)."""
    import tritonclient.grpc as grpcclient

    rng = np.random.default_rng(0)
    x = rng.standard_normal([1] + SHAPE).astype(np.float32)
    want = x[:, :, :1, :1]
    counts = [[0, 0, 0] for _ in range(n)]
    conns = []
    for _ in range(n):
        c = grpcclient.InferenceServerClient(
            grpc, channel_args=[("grpc.use_local_subchannel_pool", 1)])
        i = grpcclient.InferInput("input", [1] + SHAPE, "FP32")
        i.set_data_from_numpy(x)
        conns.append((c, i))
    ready.set()
    end = time.monotonic() + seconds

    def run(k):
        c, i = conns[k]
        for _ in range(max_requests):
            if time.monotonic() > end:
                break
            try:
                r = c.infer("slice224", [i])
                ok = np.array_equal(r.as_numpy("output"), want)
                counts[k][0 if ok else 1] += 1
            except Exception:  # noqa: BLE001 - counted
                counts[k][2] += 1

    ts = [threading.Thread(target=run, args=(k,)) for k in range(n)]
    for t in ts:
        t.start()
    for t in ts:
        t.join()
    results.put([sum(c[j] for c in counts) for j in range(3)])


def measure(a, grpc: str, http: str, server: int, n: int) -> dict:
    ctx = mp.get_context("spawn")
    procs = max(1, min(a.procs, n))
    per = [n // procs + (1 if i < n % procs else 0) for i in range(procs)]
    results = ctx.Queue()
    readies = [ctx.Event() for _ in per]
    total = a.warmup + a.duration + 0.5
    ps = [ctx.Process(target=clients, args=(grpc, k, total, a.max_requests, r, results))
          for k, r in zip(per, readies)]
    for p in ps:
        p.start()
    for r in readies:
        r.wait(60)
    time.sleep(a.warmup)
    c0, u0, t0 = counters(http), cpu(server), time.monotonic()
    time.sleep(a.duration)
    c1, u1, t1 = counters(http), cpu(server), time.monotonic()
    answers = [0, 0, 0]
    for _ in ps:
        for j, v in enumerate(results.get(timeout=120)):
            answers[j] += v
    for p in ps:
        p.join(30)
    reqs = c1["kiln_requests_total"] - c0["kiln_requests_total"]
    inf = c1["kiln_inferences_total"] - c0["kiln_inferences_total"]
    user, system = u1[0] - u0[0], u1[1] - u0[1]
    row = {"clients": n, "req_per_s": round(reqs / (t1 - t0), 1),
           "server_cores": round((user + system) / (t1 - t0), 2),
           "cpu_us_per_request": round((user + system) / reqs * 1e6) if reqs else None,
           "user_us": round(user / reqs * 1e6) if reqs else None,
           "system_us": round(system / reqs * 1e6) if reqs else None,
           "requests_per_inference": round(reqs / inf, 2) if inf else None,
           "answers_ok": answers[0], "wrong": answers[1], "errors": answers[2]}
    print(f"  {n:4d} clients: {row['req_per_s']:8.1f} req/s, server {row['server_cores']} cores, "
          f"{row['cpu_us_per_request']} us CPU/request (user {row['user_us']}, system "
          f"{row['system_us']}), {row['requests_per_inference']} requests/inference, "
          f"{answers[0]} right, {answers[1]} wrong, {answers[2]} errors", flush=True)
    return row


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--clients", default="1,8,32")
    p.add_argument("--duration", type=float, default=5.0, help="seconds measured per row")
    p.add_argument("--warmup", type=float, default=1.5)
    p.add_argument("--procs", type=int, default=1, help="client processes")
    p.add_argument("--max-requests", type=int, default=100000, help="per client and row")
    p.add_argument("--server-path", default="", help="a folder holding the kiln package the "
                   "server runs from (default: this one's)")
    p.add_argument("--serve-args", default="", help="more `kiln serve` flags")
    p.add_argument("--json")
    a = p.parse_args(argv)
    folder = tempfile.mkdtemp(prefix="kiln-serve-cost-")
    repo = make_engine(folder)
    hp, gp = free_port(), free_port()
    env = dict(os.environ)
    if a.server_path:
        env["PYTHONPATH"] = os.pathsep.join(x for x in (a.server_path, env.get("PYTHONPATH")) if x)
    log = open(os.path.join(folder, "serve.log"), "w")
    budget = 120 + len(a.clients.split(",")) * (a.warmup + a.duration + 30)
    srv = subprocess.Popen(["timeout", str(int(budget)), sys.executable, "-m", "kiln.cli", "serve",
                            repo, "--host", "127.0.0.1", "--http-port", str(hp), "--grpc-port",
                            str(gp), *a.serve_args.split()],
                           env=env, stdout=log, stderr=subprocess.STDOUT)
    http, grpc = f"127.0.0.1:{hp}", f"127.0.0.1:{gp}"
    rows = []
    try:
        deadline = time.monotonic() + 120
        while True:
            try:
                with urllib.request.urlopen(f"http://{http}/v2/health/ready", timeout=2):
                    break
            except OSError:
                if time.monotonic() > deadline or srv.poll() is not None:
                    print(open(log.name).read()[-2000:])
                    raise SystemExit("serve_cost: the server did not start")
                time.sleep(0.3)
        time.sleep(0.5)
        server = int(open(f"/proc/{srv.pid}/task/{srv.pid}/children").read().split()[0])
        print(f"kiln serve {a.serve_args} (from "
              f"{a.server_path or 'this checkout'}), slice224, gRPC:")
        for n in (int(c) for c in a.clients.split(",")):
            rows.append(measure(a, grpc, http, server, n))
    finally:
        srv.terminate()
        srv.wait(30)
    if a.json:
        with open(a.json, "w") as f:
            json.dump({"serve_args": a.serve_args, "rows": rows}, f, indent=1)
    return 0 if all(r["wrong"] == 0 and r["errors"] == 0 for r in rows) else 1


if __name__ == "__main__":
    sys.exit(main())
