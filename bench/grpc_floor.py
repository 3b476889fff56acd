#!/usr/bin/env python3
"""The floor of a one-process Python gRPC front end: a grpc.aio server (as `kiln serve` runs, in
a process of its own, on 127.0.0.1 only) that answers every ModelInfer with the same small
response, decoding nothing and running no model, loaded by Triton's gRPC client from N threads
of this process (each loop bounded in count and time). Prints requests/s and the server's CPU
time per request: what grpc.aio alone costs, against which `kiln serve`'s front end
(bench/serve_cpu.sh) compares.

  python3 bench/grpc_floor.py [--clients 128] [--duration 5] [--server aio|sync] [--raw]
      [--option grpc.optimization_target=throughput ...]

--server sync: grpc's synchronous server (a thread per call from a pool of --threads) instead of
grpc.aio's. --raw: ModelInfer registered without protobuf's (de)serialization, taking and
returning bytes, as `kiln serve` registers it (the response serialized once). --option NAME=VALUE
(repeatable): a server channel argument (an integer value where it parses as one).
--interceptors N: N grpc.aio interceptors that pass every call on (kiln serve installs none: it
wraps KServe's two around each method but ModelInfer, serving._intercepted).
"""
from __future__ import annotations

import argparse
import asyncio
import os
import socket
import subprocess
import sys
import threading
import time


def parse_option(text: str) -> tuple:
    name, _, value = text.partition("=")
    try:
        return name, int(value)
    except ValueError:
        return name, value


def serve(port: int, seconds: float, mode: str = "aio", raw: bool = False, options=(),
          threads: int = 16, interceptors: int = 0) -> None:
    import grpc
    import numpy as np
    from grpc import aio
    from kserve.protocol.grpc import grpc_predict_v2_pb2 as pb

    response = pb.ModelInferResponse(model_name="m")
    t = response.outputs.add(name="y", datatype="FP32")
    t.shape.extend([1, 10])
    response.raw_output_contents.append(np.zeros(10, np.float32).tobytes())
    if raw:
        response = response.SerializeToString()
        kw = {}
    else:
        kw = {"request_deserializer": pb.ModelInferRequest.FromString,
              "response_serializer": pb.ModelInferResponse.SerializeToString}
    options = [("grpc.so_reuseport", 0)] + [parse_option(o) for o in options]

    def add(server, behaviour):
        handler = grpc.unary_unary_rpc_method_handler(behaviour, **kw)
        server.add_generic_rpc_handlers([grpc.method_handlers_generic_handler(
            "inference.GRPCInferenceService", {"ModelInfer": handler})])
        server.add_insecure_port(f"127.0.0.1:{port}")

    if mode == "sync":
        from concurrent import futures

        server = grpc.server(futures.ThreadPoolExecutor(max_workers=threads), options=options)
        add(server, lambda request, context: response)
        server.start()
        time.sleep(seconds)
        server.stop(0)
        return

    async def infer(request, context):
        return response

    class PassOn(aio.ServerInterceptor):
        async def intercept_service(self, continuation, details):
            return await continuation(details)

    async def main():
        server = aio.server(options=options,
                            interceptors=[PassOn() for _ in range(interceptors)] or None)
        add(server, infer)
        await server.start()
        await asyncio.sleep(seconds)
        await server.stop(0)

    asyncio.run(main())


def cpu_seconds(pid: int) -> float:
    with open(f"/proc/{pid}/stat") as f:
        fields = f.read().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--clients", type=int, default=128)
    ap.add_argument("--duration", type=float, default=5.0, help="seconds measured")
    ap.add_argument("--max-requests", type=int, default=100000, help="per client")
    ap.add_argument("--server", choices=["aio", "sync"], default="aio")
    ap.add_argument("--threads", type=int, default=16, help="--server sync's thread pool")
    ap.add_argument("--raw", action="store_true", help="ModelInfer takes and returns bytes")
    ap.add_argument("--interceptors", type=int, default=0,
                    help="grpc.aio interceptors that pass every call on")
    ap.add_argument("--option", action="append", default=[], metavar="NAME=VALUE",
                    help="a server channel argument (repeatable)")
    ap.add_argument("--serve", type=int, default=0, help=argparse.SUPPRESS)  # the server process
    ap.add_argument("--serve-seconds", type=float, default=0, help=argparse.SUPPRESS)
    a = ap.parse_args()
    if a.serve:
        serve(a.serve, a.serve_seconds, a.server, a.raw, a.option, a.threads, a.interceptors)
        return 0
    import numpy as np
    import tritonclient.grpc as grpcclient

    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    server = subprocess.Popen(
        [sys.executable, __file__, "--serve", str(port), "--serve-seconds", str(a.duration + 60),
         "--server", a.server, "--threads", str(a.threads), "--interceptors", str(a.interceptors)]
        + (["--raw"] if a.raw else [])
        + [f"--option={o}" for o in a.option])
    try:
        x = np.zeros((1, 64), np.float32)
        clients = []
        for _ in range(a.clients):
            c = grpcclient.InferenceServerClient(f"127.0.0.1:{port}")
            i = grpcclient.InferInput("x", [1, 64], "FP32")
            i.set_data_from_numpy(x)
            clients.append((c, i))
        deadline = time.time() + 30
        while True:  # the server is up when a request is answered
            try:
                clients[0][0].infer("m", [clients[0][1]])
                break
            except Exception:  # noqa: BLE001 - not listening yet
                if time.time() > deadline or server.poll() is not None:
                    raise SystemExit("grpc_floor: the server did not start")
                time.sleep(0.2)
        counts = [0] * a.clients
        barrier = threading.Barrier(a.clients + 1)
        state = {}

        def run(k):
            c, i = clients[k]
            barrier.wait()
            n = 0
            while n < a.max_requests and time.perf_counter() < state["end"]:
                c.infer("m", [i])
                n += 1
            counts[k] = n

        threads = [threading.Thread(target=run, args=(k,), daemon=True) for k in range(a.clients)]
        for t in threads:
            t.start()
        cpu0, t0 = cpu_seconds(server.pid), time.perf_counter()
        state["end"] = t0 + a.duration
        barrier.wait()
        for t in threads:
            t.join(timeout=a.duration + 60)
        cpu1, t1 = cpu_seconds(server.pid), time.perf_counter()
        n = sum(counts)
        what = " ".join([a.server] + (["raw"] if a.raw else []) + a.option
                        + ([f"{a.interceptors} interceptors"] if a.interceptors else [])
                        + ([f"{a.threads} threads"] if a.server == "sync" else []))
        print(f"grpc_floor ({what}): {a.clients} clients, {n / (t1 - t0):.0f} requests/s, server "
              f"{(cpu1 - cpu0) / (t1 - t0):.2f} cores, {(cpu1 - cpu0) / n * 1e6:.0f} us of server "
              f"CPU per request")
    finally:
        server.terminate()
        server.wait(timeout=30)
    return 0


if __name__ == "__main__":
    sys.exit(main())
