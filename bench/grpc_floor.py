#!/usr/bin/env python3
"""The floor of a one-process Python gRPC front end: a grpc.aio server (as `kiln serve` runs, in
a process of its own, on 127.0.0.1 only) that answers every ModelInfer with the same small
response, decoding nothing and running no model, loaded by Triton's gRPC client from N threads
of this process (each loop bounded in count and time). Prints requests/s and the server's CPU
time per request: what grpc.aio alone costs, against which `kiln serve`'s front end
(bench/serve_cpu.sh) compares.

  python3 bench/grpc_floor.py [--clients 128] [--duration 5]
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


def serve(port: int, seconds: float) -> None:
    import grpc
    import numpy as np
    from grpc import aio
    from kserve.protocol.grpc import grpc_predict_v2_pb2 as pb

    response = pb.ModelInferResponse(model_name="m")
    t = response.outputs.add(name="y", datatype="FP32")
    t.shape.extend([1, 10])
    response.raw_output_contents.append(np.zeros(10, np.float32).tobytes())

    async def infer(request, context):
        return response

    async def main():
        server = aio.server(options=[("grpc.so_reuseport", 0)])
        handler = grpc.unary_unary_rpc_method_handler(
            infer, request_deserializer=pb.ModelInferRequest.FromString,
            response_serializer=pb.ModelInferResponse.SerializeToString)
        server.add_generic_rpc_handlers([grpc.method_handlers_generic_handler(
            "inference.GRPCInferenceService", {"ModelInfer": handler})])
        server.add_insecure_port(f"127.0.0.1:{port}")
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
    ap.add_argument("--serve", type=int, default=0, help=argparse.SUPPRESS)  # the server process
    ap.add_argument("--serve-seconds", type=float, default=0, help=argparse.SUPPRESS)
    a = ap.parse_args()
    if a.serve:
        serve(a.serve, a.serve_seconds)
        return 0
    import numpy as np
    import tritonclient.grpc as grpcclient

    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    server = subprocess.Popen([sys.executable, __file__, "--serve", str(port), "--serve-seconds",
                               str(a.duration + 60)])
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
        print(f"grpc_floor: {a.clients} clients, {n / (t1 - t0):.0f} requests/s, server "
              f"{(cpu1 - cpu0) / (t1 - t0):.2f} cores, {(cpu1 - cpu0) / n * 1e6:.0f} us of server "
              f"CPU per request")
    finally:
        server.terminate()
        server.wait(timeout=30)
    return 0


if __name__ == "__main__":
    sys.exit(main())
