#!/usr/bin/env python3
"""The Python package's numbers (docs/perf.md), on one engine:

1. What ctx.run adds to `kiln bench`'s latency, both as they run by default (CUDA graphs on a
   cuda engine): median wall time of ctx.run (PyTorch CUDA tensors in and out on a cuda engine,
   waited for with torch.cuda.synchronize; NumPy arrays on a cpu engine) against `kiln bench`'s
   median latency without data transfers (on the cpu backend there are none), per batch; on a
   cuda engine also timed as kiln bench times (CUDA events around the call), back to back
   (against kiln bench's throughput run), and both without CUDA graphs (`--no-cuda-graph`,
   set_use_cuda_graph(False): every layer launched at every call).
   Measured in --rounds interleaved rounds (kiln bench, then ctx.run): the medians of each time
   and of the rounds' ratios, as a host-bound time drifts on a shared machine.
2. With --serve: `kiln serve`'s throughput over gRPC (tritonclient, --clients concurrent clients
   each sending --requests requests of --serve-batch samples) against `kiln bench`'s throughput at
   that batch (with its host<->device copies, as the server has them too).

  python3 bench/python_numbers.py --engine E.kiln --batch 1,32 [--serve --serve-batch 32]
      [--json OUT.json]

The engine needs a dynamic batch profile covering the batches. Everything runs on 127.0.0.1.
"""
import argparse
import json
import os
import signal
import socket
import statistics
import subprocess
import sys
import threading
import time
import urllib.request

import numpy as np

import kiln


def input_shape(engine, batch):
    (inp,) = engine.inputs
    return inp.name, [batch] + [int(d) for d in inp.shape[1:]]


def ctx_run_call(engine, batch, use_torch, graph=None):
    """A warmed-up ctx.run on one input as a function of no arguments, and how to wait for it.
    Each call's outputs are new tensors and the last call's are held while the next one runs, as
    a caller that keeps its result does (PyTorch's allocator then alternates between addresses).
    `graph`: None, the context's default (CUDA graphs on the GPU, a graph per repeated address
    set); False, every layer launched at every call."""
    name, shape = input_shape(engine, batch)
    ctx = engine.create_context()
    if graph is not None:
        ctx.set_use_cuda_graph(graph)
    if use_torch:
        import torch

        x = torch.randn(shape, device="cuda", dtype=getattr(torch, engine.inputs[0].dtype))
        sync = torch.cuda.synchronize
    else:
        x = np.random.default_rng(0).standard_normal(shape).astype(engine.inputs[0].dtype)
        sync = lambda: None  # noqa: E731 - the cpu backend returns when done
    held = {}

    def call():
        held["out"] = ctx.run({name: x})

    for _ in range(20):
        call()
    sync()
    return call, sync


def median_synced(call, sync, iterations):
    """Median wall time (ms) of a call and the wait for it."""
    times = []
    for _ in range(iterations):
        t0 = time.perf_counter()
        call()
        sync()
        times.append((time.perf_counter() - t0) * 1e3)
    return statistics.median(times)


def median_events(call, iterations):
    """Median time (ms) between CUDA events recorded on the idle stream before and after the
    call, as kiln bench times enqueue (everything from the call to the last kernel's end, Python
    included)."""
    import torch

    start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
    times = []
    for _ in range(iterations):
        start.record()
        call()
        end.record()
        end.synchronize()
        times.append(start.elapsed_time(end))
    return statistics.median(times)


def back_to_back(call, sync, iterations):
    """Time per call (ms) of `iterations` calls queued back to back with one wait at the end (as
    kiln bench's throughput run queues inferences), and the median host time of one call (until
    it returns, the GPU still working)."""
    host = []
    t0 = time.perf_counter()
    for _ in range(iterations):
        a = time.perf_counter()
        call()
        host.append((time.perf_counter() - a) * 1e3)
    sync()
    return (time.perf_counter() - t0) * 1e3 / iterations, statistics.median(host)


def breakdown(engine, batch, iterations, rounds):
    """Where a synchronized ctx.run call's time goes beyond the engine's, with CUDA graphs (one
    launch an inference) and without: ctx.run on PyTorch's default stream and on a side stream,
    and TensorRT's execute_async (addresses set once) on both, against kiln bench in the same
    mode; medians of wall time per call, synchronizing the stream used, in `rounds` interleaved
    rounds. Each row: the median time over rounds and the median of the rounds' percent over
    kiln bench."""
    import torch

    name, shape = input_shape(engine, batch)
    x = torch.randn(shape, device="cuda", dtype=getattr(torch, engine.inputs[0].dtype))
    side = torch.cuda.Stream()
    default = torch.cuda.current_stream()

    def timed(call, stream):
        for _ in range(20):
            call()
        stream.synchronize()
        return median_synced(call, stream.synchronize, iterations)

    calls = {}
    for graph in (False, True):
        ctx = engine.create_context()
        ctx.set_use_cuda_graph(graph)
        outs = ctx.run({name: x})
        torch.cuda.synchronize()
        low = engine.create_context()
        low.set_use_cuda_graph(graph)
        low.set_input_shape(name, shape)
        low.set_tensor_address(name, x.data_ptr())
        for k, t in outs.items():
            low.set_tensor_address(k, t.data_ptr())
        g = "graph" if graph else "direct"
        calls[g] = {
            "ctx.run, default stream": (lambda c=ctx, o=outs: c.run({name: x}, outputs=o), default),
            "ctx.run, side stream": (lambda c=ctx, o=outs: c.run({name: x}, outputs=o,
                                                             stream=side.cuda_stream), side),
            "execute_async, default stream": (lambda c=low: c.execute_async(default.cuda_stream),
                                              default),
            "execute_async, side stream": (lambda c=low: c.execute_async(side.cuda_stream), side),
        }
    samples = []
    for _ in range(rounds):
        r = {}
        for g, graph in (("direct", False), ("graph", True)):
            r[f"{g}: kiln bench"] = kiln.bench(engine, shapes={name: shape}, no_data_transfers=True,
                                               use_cuda_graph=graph, iterations=iterations,
                                               duration=1)["latency_ms"]["median"]
            for k, (call, stream) in calls[g].items():
                r[f"{g}: {k}"] = timed(call, stream)
        samples.append(r)
    rows = {}
    for k in samples[0]:
        base = k.split(":")[0] + ": kiln bench"
        ms = statistics.median(r[k] for r in samples)
        pct = statistics.median(100 * (r[k] - r[base]) / r[base] for r in samples)
        rows[k] = {"median_ms": ms, "over_kiln_bench_percent": pct}
        print(f"batch {batch:>4}, {k}: {ms:.4f} ms ({pct:+.1f}% over kiln bench)", flush=True)
    return rows


def host_cost(engine, batch, iterations):
    """What a call costs the host with CUDA graphs (microseconds, median wall time of the call
    alone, the GPU waited for after each): ctx.run holding the previous call's outputs, TensorRT's
    execute_async with the addresses set once, ctx.run's Python part and its call into kiln
    timed apart, and two pieces of the Python part, torch.empty for the output and PyTorch's
    stream lookup."""
    import torch

    name, shape = input_shape(engine, batch)
    x = torch.randn(shape, device="cuda", dtype=getattr(torch, engine.inputs[0].dtype))
    ctx = engine.create_context()
    ctx.set_use_cuda_graph(True)
    held = {}

    def run():
        held["out"] = ctx.run({name: x})

    low = engine.create_context()
    low.set_use_cuda_graph(True)
    low.set_input_shape(name, shape)
    low.set_tensor_address(name, x.data_ptr())
    outs = {o.name: torch.empty(low.get_tensor_shape(o.name), device="cuda",
                                dtype=getattr(torch, o.dtype)) for o in engine.outputs}
    for k, t in outs.items():
        low.set_tensor_address(k, t.data_ptr())
    stream = torch.cuda.current_stream().cuda_stream
    first = outs[engine.outputs[0].name]
    out_shape, out_dtype = list(first.shape), first.dtype
    # ctx.run's two halves: its Python part (a context whose core enqueues nothing) and the
    # one call into kiln it makes on a repeat (the addresses and the enqueue).
    class _NoCore:
        def _run_addresses(self, *args):
            pass

    py_ctx = engine.create_context()
    py_ctx.run({name: x})
    py_ctx._core = _NoCore()
    held_py = {}

    def run_python():
        held_py["out"] = py_ctx.run({name: x})

    names = [name]
    in_ptr = [x.data_ptr()]
    out_ptr = [t.data_ptr() for t in outs.values()]
    calls = {"ctx.run": run, "execute_async": lambda: low.execute_async(stream),
             "ctx.run's Python part (no enqueue)": run_python,
             "ctx.run's call into kiln (_run_addresses)":
                 lambda: ctx._core._run_addresses(names, in_ptr, out_ptr, stream or 1),
             "torch.empty (one output)": lambda: torch.empty(out_shape, dtype=out_dtype, device="cuda"),
             "stream lookup": lambda: torch._C._cuda_getCurrentRawStream(x.device.index)}
    rows = {}
    for label, call in calls.items():
        for _ in range(30):
            call()
        torch.cuda.synchronize()
        times = []
        for _ in range(iterations):
            t0 = time.perf_counter()
            call()
            times.append((time.perf_counter() - t0) * 1e6)
            torch.cuda.synchronize()
        rows[label] = statistics.median(times)
        print(f"batch {batch:>4}, host time of a call with CUDA graphs, {label}: {rows[label]:.1f} us",
              flush=True)
    return rows


def free_port():
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def serve_throughput(engine_path, batch, clients, requests, contexts):
    import tritonclient.grpc as grpcclient

    repo = os.path.join(os.path.dirname(os.path.abspath(engine_path)), "serve-repo")
    os.makedirs(repo, exist_ok=True)
    link = os.path.join(repo, "model.kiln")
    if not os.path.exists(link):
        os.symlink(os.path.abspath(engine_path), link)
    http, grpc = free_port(), free_port()
    proc = subprocess.Popen([sys.executable, "-m", "kiln.cli", "serve", repo, "--host", "127.0.0.1",
                             "--http-port", str(http), "--grpc-port", str(grpc), "--contexts",
                             str(contexts), "--batch-delay-ms", "1"],
                            stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    try:
        deadline = time.time() + 120
        while True:
            try:
                with urllib.request.urlopen(f"http://127.0.0.1:{http}/v2/health/ready", timeout=2):
                    break
            except OSError:
                if time.time() > deadline or proc.poll() is not None:
                    raise RuntimeError("kiln serve did not start")
                time.sleep(0.5)
        engine = kiln.load(engine_path)
        name, shape = input_shape(engine, batch)
        x = np.random.default_rng(0).standard_normal(shape).astype(engine.inputs[0].dtype)
        datatype = {"float32": "FP32", "float16": "FP16"}[engine.inputs[0].dtype]

        def client_loop(n, out):
            c = grpcclient.InferenceServerClient(f"127.0.0.1:{grpc}")
            inp = grpcclient.InferInput(name, shape, datatype)
            inp.set_data_from_numpy(x)
            for _ in range(n):
                c.infer("model", [inp])
            out.append(n)

        client_loop(3, [])  # warm-up
        done = []
        threads = [threading.Thread(target=client_loop, args=(requests, done)) for _ in range(clients)]
        t0 = time.perf_counter()
        for t in threads:
            t.start()
        for t in threads:
            t.join(timeout=600)
        seconds = time.perf_counter() - t0
        return sum(done) * batch / seconds
    finally:
        proc.send_signal(signal.SIGTERM)
        try:
            proc.wait(timeout=60)
        except subprocess.TimeoutExpired:
            proc.kill()


def latency_row(engine, batch, use_torch, iterations, rounds):
    """ctx.run against `kiln bench` at one batch, in `rounds` interleaved rounds (each side's
    median per round): host-bound timings drift over seconds on a shared machine, so each round
    compares the two sides measured back to back, and the row gives the median of each time and
    of the rounds' ratios (as percent added)."""
    name, shape = input_shape(engine, batch)
    call, sync = ctx_run_call(engine, batch, use_torch)
    if use_torch:
        dcall, dsync = ctx_run_call(engine, batch, use_torch, graph=False)
    samples = []
    for _ in range(rounds):
        r = {}
        b = kiln.bench(engine, shapes={name: shape}, no_data_transfers=use_torch,
                       iterations=iterations, duration=1)
        r["kiln_bench_median_ms"] = b["latency_ms"]["median"]
        r["ctx_run_median_ms"] = median_synced(call, sync, iterations)
        if use_torch:
            # timed as kiln bench times: CUDA events around the call on an idle stream
            r["ctx_run_events_median_ms"] = median_events(call, iterations)
            # back to back: kiln bench's throughput run against ctx.run's
            r["kiln_bench_back_to_back_ms"] = 1000.0 * batch / b["throughput_per_s"]
            r["ctx_run_back_to_back_ms"], r["ctx_run_host_ms"] = back_to_back(call, sync, iterations)
            # both without CUDA graphs: kiln bench --no-cuda-graph, ctx.run launching each layer
            r["kiln_bench_direct_median_ms"] = kiln.bench(
                engine, shapes={name: shape}, no_data_transfers=True, use_cuda_graph=False,
                iterations=iterations, duration=1)["latency_ms"]["median"]
            r["ctx_run_direct_median_ms"] = median_synced(dcall, dsync, iterations)
            r["ctx_run_direct_events_median_ms"] = median_events(dcall, iterations)
        samples.append(r)
    row = {"batch": batch, "rounds": rounds,
           "inputs": "torch cuda tensors" if use_torch else "numpy arrays"}
    for k in samples[0]:
        row[k] = statistics.median(r[k] for r in samples)

    def added(run, base):  # the median over rounds of what ctx.run adds, in percent
        return statistics.median(100 * (r[run] - r[base]) / r[base] for r in samples)

    row["added_percent"] = added("ctx_run_median_ms", "kiln_bench_median_ms")
    if use_torch:
        row["events_added_percent"] = added("ctx_run_events_median_ms", "kiln_bench_median_ms")
        row["back_to_back_added_percent"] = added("ctx_run_back_to_back_ms",
                                                  "kiln_bench_back_to_back_ms")
        row["direct_events_added_percent"] = added("ctx_run_direct_events_median_ms",
                                                   "kiln_bench_direct_median_ms")
        row["direct_added_percent"] = added("ctx_run_direct_median_ms", "kiln_bench_direct_median_ms")
    row["added_percent_rounds"] = [100 * (r["ctx_run_median_ms"] - r["kiln_bench_median_ms"]) /
                                   r["kiln_bench_median_ms"] for r in samples]
    return row


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--engine", required=True)
    ap.add_argument("--batch", default="1,32")
    ap.add_argument("--iterations", type=int, default=200)
    ap.add_argument("--rounds", type=int, default=5,
                    help="interleaved rounds of kiln bench and ctx.run (medians over rounds)")
    ap.add_argument("--serve", action="store_true")
    ap.add_argument("--serve-batch", type=int, default=32)
    ap.add_argument("--clients", type=int, default=4)
    ap.add_argument("--requests", type=int, default=50)
    ap.add_argument("--contexts", type=int, default=2)
    ap.add_argument("--breakdown", action="store_true",
                    help="also time ctx.run and execute_async on the default and a side stream")
    ap.add_argument("--host-cost", action="store_true",
                    help="also time what a call costs the host with CUDA graphs (ctx.run, execute_async)")
    ap.add_argument("--json")
    a = ap.parse_args()
    engine = kiln.load(a.engine)
    use_torch = engine.backend == "cuda"
    report = {"engine": a.engine, "backend": engine.backend, "latency": []}
    for batch in [int(b) for b in a.batch.split(",")]:
        row = latency_row(engine, batch, use_torch, a.iterations, a.rounds)
        report["latency"].append(row)
        print(f"batch {batch:>4}: kiln bench {row['kiln_bench_median_ms']:.4f} ms, ctx.run "
              f"{row['ctx_run_median_ms']:.4f} ms ({row['added_percent']:+.1f}%)", flush=True)
        if not use_torch:
            continue
        print(f"batch {batch:>4}, CUDA events around the call: kiln bench "
              f"{row['kiln_bench_median_ms']:.4f} ms, ctx.run {row['ctx_run_events_median_ms']:.4f} ms "
              f"({row['events_added_percent']:+.1f}%)", flush=True)
        print(f"batch {batch:>4}, back to back: kiln bench {row['kiln_bench_back_to_back_ms']:.4f} ms, "
              f"ctx.run {row['ctx_run_back_to_back_ms']:.4f} ms ({row['back_to_back_added_percent']:+.1f}%; "
              f"ctx.run returns after {row['ctx_run_host_ms']:.4f} ms of host time)", flush=True)
        print(f"batch {batch:>4}, no CUDA graphs, CUDA events around the call: kiln bench "
              f"{row['kiln_bench_direct_median_ms']:.4f} ms, ctx.run {row['ctx_run_direct_events_median_ms']:.4f} ms "
              f"({row['direct_events_added_percent']:+.1f}%)", flush=True)
        print(f"batch {batch:>4}, no CUDA graphs: kiln bench {row['kiln_bench_direct_median_ms']:.4f} ms, "
              f"ctx.run {row['ctx_run_direct_median_ms']:.4f} ms ({row['direct_added_percent']:+.1f}%)",
              flush=True)
    if a.breakdown and use_torch:
        report["breakdown"] = {b: breakdown(engine, int(b), a.iterations, a.rounds)
                               for b in a.batch.split(",")}
    if a.host_cost and use_torch:
        report["host_cost_us"] = {b: host_cost(engine, int(b), a.iterations) for b in a.batch.split(",")}
    if a.serve:
        name, shape = input_shape(engine, a.serve_batch)
        b = kiln.bench(engine, shapes={name: shape}, iterations=a.iterations, duration=1)
        served = serve_throughput(a.engine, a.serve_batch, a.clients, a.requests, a.contexts)
        report["serving"] = {"batch": a.serve_batch, "clients": a.clients,
                             "requests_per_client": a.requests, "contexts": a.contexts,
                             "kiln_bench_samples_per_s": b["throughput_per_s"],
                             "grpc_samples_per_s": served,
                             "ratio": served / b["throughput_per_s"]}
        print(f"serving batch {a.serve_batch}: kiln bench {b['throughput_per_s']:.1f} samples/s, "
              f"kiln serve over gRPC {served:.1f} samples/s ({100 * served / b['throughput_per_s']:.1f}%)",
              flush=True)
    if a.json:
        with open(a.json, "w") as f:
            json.dump(report, f, indent=2)


if __name__ == "__main__":
    main()
