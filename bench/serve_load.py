#!/usr/bin/env python3
"""Load and soak tests of `kiln serve` with Triton's clients (tritonclient), over gRPC and HTTP,
to a server on this machine only (127.0.0.1 / [::1] / localhost).

  load: N concurrent clients (1, 8, 32, 128 by default) each sending batch-1 requests in a loop
        bounded in count (--max-requests per client) and time (--duration after --warmup);
        throughput and p50/p99 latency per protocol and client count, the batch the server
        formed (its /metrics: kiln_samples_total / kiln_inferences_total, and the batch size
        that ran most samples, kiln_batch_inferences_total{batch}), and `kiln bench` (the C++
        CLI, --kiln) on the same engine at that batch beside it.
  soak: --clients (64) clients for --duration seconds, --bad-rate (5%) of the requests bad,
        one of six kinds in turn: wrong shape, wrong datatype, unknown input name, truncated
        body, a 100 MB body, a model that does not exist. Every good answer is checked against
        the engine run directly on the same input (kiln.load + Context.run, here); every bad
        one must be a 4xx (gRPC: a client-error status) with a message, never a 5xx. The
        server's resident memory (--server-pid, with any process under it) and the GPUs' memory
        (nvidia-smi) are
        sampled every --sample-every seconds into a CSV and a PNG plot (matplotlib).

The soak's verdict (PASSED: exit status 0, else 2):
  answers  An answer may differ from the engine's own batch-1 output on that input by a rel L2
        of max(--tolerance (2e-2), k x e), e the engine's own error on that input against an FP32
        engine of the same model (--reference-engine; without one, e = 0), k = --k-fp16 = 3:
        the server runs a request at another batch size (padded to a power of two), whose
        tactics round differently; with f the FP32 answer, |server - ref| <= |server - f| +
        |f - ref|, the second term e and the first the engine's error at the server's batch,
        which we allow to be twice its batch-1 error: 3e. An FP16 ResNet-50 with random weights
        has near-cancelling logits on some inputs, where e (relative) is large. Independently
        of the widened tolerance, an answer over --tolerance that is nearer to another
        reference input's outputs than to its own is mixed up (another request's answer) and
        fails (random weights can make outputs of different inputs close: 'min_separation' in
        the summary says how close; below 2 x --tolerance the soak says it cannot tell a
        mixed-up answer within --tolerance from a right one). Every answer over --tolerance
        (failing or not) is kept, up to --keep-mismatches, in --mismatches (.npz): the input,
        the server's and the reference outputs, the rel L2, and the batch size at which the
        engine run directly gives the nearest answer to the server's (~0: the server's answer
        is the engine's own at that batch, FP16 batch-size variation; about the rel L2 itself
        at every size: not explained).
  memory  Flat means the least-squares slope of the server's RSS (its process tree) over the
        last half of the samples after --settle is at most --rss-slope (5 MB/min), judged only
        when that half spans --min-memory-window (60 s) or more; the GPUs' memory likewise. Why
        5 MB/min: a leak of b bytes a request at R requests/s grows 60 R b bytes a minute, so at
        the GPU soak's 2,000 requests/s the bound is 44 bytes a request: anything a request
        leaves behind (a bytes object, an array, a future: 100 B and up) exceeds it, and a
        leaked 602 KB input in one request of 1,000 is 72 MB/min. What stays under it is the
        allocator settling (glibc's arenas reaching their high-water marks, bounded). The
        summary gives the slope in bytes per request too (rss_bytes_per_request). The slope over
        the last half, not the growth since --settle: the first minutes after the warm-up
        still fill caches and arenas.

Clients run as threads in --procs processes (spawned; the GIL of one process would be the
bottleneck at 128 clients), each client on its own connection: gRPC's clients in one process
would otherwise share one (grpc's global subchannel pool; --grpc-shared-connection: as
before). --server-pid counts any process under the server too (its process tree). Results go
to --json (and a Markdown table on stdout / --md).

--shm, or the protocols grpc-shm and http-shm (beside grpc and http in one run, for rows with
and without it): Triton's system shared memory extension. Each client thread makes its own input
and output regions in /dev/shm (tritonclient.utils.shared_memory) and registers them with the
server once; each request then names the region, offset and size of its inputs and outputs
(ShmClient). A load client sends one input, placed once; a soak client writes each request's
input into its region first. Answers are read from the output region and checked as any
other. The regions are unregistered and removed when the clients end.
The driver on the GPU machine is bench/serve_gpu.sh.
"""
from __future__ import annotations

import argparse
import http.client
import json
import math
import multiprocessing as mp
import os
import re
import select
import shutil
import socket
import subprocess
import sys
import threading
import time
import urllib.request
from typing import Optional

import numpy as np

LOCAL_HOSTS = {"127.0.0.1", "::1", "[::1]", "localhost"}
# gRPC statuses that are the caller's fault (HTTP 4xx's counterparts); anything else is a
# server error (5xx's).
GRPC_CLIENT_ERRORS = {"INVALID_ARGUMENT", "NOT_FOUND", "OUT_OF_RANGE", "FAILED_PRECONDITION",
                      "RESOURCE_EXHAUSTED", "ALREADY_EXISTS", "PERMISSION_DENIED",
                      "UNAUTHENTICATED", "UNIMPLEMENTED"}
BAD_KINDS = ["wrong_shape", "wrong_datatype", "unknown_input", "truncated_body", "huge_body",
             "unknown_model"]
HUGE_BYTES = 100 << 20
PROTOCOLS = ("grpc", "http", "grpc-shm", "http-shm")
NP_OF_V2 = {"BOOL": np.bool_, "UINT8": np.uint8, "UINT16": np.uint16, "UINT32": np.uint32,
            "UINT64": np.uint64, "INT8": np.int8, "INT16": np.int16, "INT32": np.int32,
            "INT64": np.int64, "FP16": np.float16, "FP32": np.float32, "FP64": np.float64}


# ---- addresses, metadata, inputs ------------------------------------------------------------
def local_address(addr: str) -> str:
    """HOST:PORT, refused unless HOST is this machine (the load goes nowhere else)."""
    host, _, port = addr.rpartition(":")
    if host not in LOCAL_HOSTS or not port.isdigit():
        raise SystemExit(f"serve_load: '{addr}' is not a local address (127.0.0.1:PORT, "
                         "[::1]:PORT or localhost:PORT): this tool sends traffic to this "
                         "machine only")
    return addr


def http_get(http: str, path: str, timeout: float = 10.0) -> str:
    with urllib.request.urlopen(f"http://{http}{path}", timeout=timeout) as r:
        return r.read().decode()


def wait_ready(http: str, timeout: float) -> None:
    deadline = time.time() + timeout
    while True:
        try:
            if json.loads(http_get(http, "/v2/health/ready", 2)).get("ready", True):
                return
        except Exception:  # noqa: BLE001 - not up yet
            pass
        if time.time() > deadline:
            raise SystemExit(f"serve_load: the server at {http} is not ready after {timeout:.0f} s")
        time.sleep(0.5)


def model_inputs(http: str, model: str, seq: int) -> list[tuple[str, str, list[int]]]:
    """(name, v2 datatype, batch-1 shape) per input, from the model's metadata: the first
    dimension 1, other dynamic ones `seq`."""
    meta = json.loads(http_get(http, f"/v2/models/{model}"))
    out = []
    for t in meta["inputs"]:
        shape = [d if d >= 0 else (1 if i == 0 else seq) for i, d in enumerate(t["shape"])]
        if t["shape"] and t["shape"][0] < 0:
            shape[0] = 1
        out.append((t["name"], t["datatype"], shape))
    return out


def make_inputs(specs, seed: int, int_high: int) -> dict[str, np.ndarray]:
    rng = np.random.default_rng(seed)
    feeds = {}
    for name, dt, shape in specs:
        t = NP_OF_V2[dt]
        if np.issubdtype(t, np.floating):
            a = rng.standard_normal(shape).astype(t)
        elif "mask" in name.lower():
            a = np.ones(shape, t)
        elif t is np.bool_:
            a = rng.integers(0, 2, shape).astype(t)
        else:
            a = rng.integers(0, int_high, shape).astype(t)
        feeds[name] = a
    return feeds


# ---- /metrics ---------------------------------------------------------------------------------
_METRIC = re.compile(r'^(kiln_[a-z_]+)\{([^}]*)\}\s+([0-9.eE+-]+)$')


def scrape(http: str, model: str) -> dict:
    """kiln's counters for `model`: {name: value} and {name: {label: value}} for the
    per-batch and per-device families."""
    out: dict = {"batch": {}, "device": {}}
    try:
        text = http_get(http, "/metrics")
    except Exception:  # noqa: BLE001 - metrics are optional for the numbers
        return out
    for line in text.splitlines():
        m = _METRIC.match(line)
        if not m:
            continue
        labels = dict(re.findall(r'(\w+)="([^"]*)"', m.group(2)))
        if labels.get("model") != model:
            continue
        name, value = m.group(1), float(m.group(3))
        if name == "kiln_batch_inferences_total":
            out["batch"][int(labels["batch"])] = value
        elif name == "kiln_device_inferences_total":
            out["device"][labels["device"]] = value
        else:
            out[name] = value
    return out


def formed(before: dict, after: dict) -> dict:
    """What the server did between two scrapes: mean samples per inference, the batch size
    (padded) that ran the most samples, and inferences per batch size and per device."""
    d = lambda k: after.get(k, 0.0) - before.get(k, 0.0)  # noqa: E731
    inf, samples = d("kiln_inferences_total"), d("kiln_samples_total")
    per_batch = {b: n - before["batch"].get(b, 0.0) for b, n in after["batch"].items()}
    per_batch = {b: int(n) for b, n in sorted(per_batch.items()) if n > 0}
    per_device = {k: int(v - before["device"].get(k, 0.0)) for k, v in after["device"].items()}
    mode = max(per_batch, key=lambda b: b * per_batch[b]) if per_batch else None
    return {"inferences": int(inf), "formed_batch_mean": round(samples / inf, 2) if inf else None,
            "padded_samples": int(d("kiln_padded_samples_total")), "run_batch_mode": mode,
            "requests_served": int(d("kiln_requests_total")),
            "per_batch": per_batch, "per_device": per_device}


# ---- clients ----------------------------------------------------------------------------------
def _client(proto: str, addr: str, shared_connection: bool = False):
    """A Triton client on its own connection (HTTP: always; gRPC: unless `shared_connection`,
    where the clients of a process share one, as grpc does by default)."""
    if proto == "grpc":
        import tritonclient.grpc as mod

        kwargs = {} if shared_connection else {"channel_args": grpc_channel_args(mod)}
    else:
        import tritonclient.http as mod

        kwargs = {"connection_timeout": 120.0, "network_timeout": 120.0}
    return mod, mod.InferenceServerClient(addr, **kwargs)


def grpc_channel_args(mod) -> list:
    """tritonclient.grpc's default channel arguments, and a subchannel pool of the channel's
    own, so that it opens its own connection instead of sharing the process's one."""
    k = mod.KeepAliveOptions()
    return [("grpc.max_send_message_length", mod.MAX_GRPC_MESSAGE_SIZE),
            ("grpc.max_receive_message_length", mod.MAX_GRPC_MESSAGE_SIZE),
            ("grpc.keepalive_time_ms", k.keepalive_time_ms),
            ("grpc.keepalive_timeout_ms", k.keepalive_timeout_ms),
            ("grpc.keepalive_permit_without_calls", k.keepalive_permit_without_calls),
            ("grpc.http2.max_pings_without_data", k.http2_max_pings_without_data),
            ("grpc.use_local_subchannel_pool", 1)]


def _infer(mod, client, model, feeds, dtypes=None, timeout=None):
    ins = []
    for name, a in feeds.items():
        dt = (dtypes or {}).get(name) or _v2(a.dtype)
        i = mod.InferInput(name, list(a.shape), dt)
        i.set_data_from_numpy(a)
        ins.append(i)
    return client.infer(model, ins)


class ShmClient:
    """--shm (protocols grpc-shm, http-shm): one client thread's input and output regions in
    POSIX shared memory, made with tritonclient.utils.shared_memory and registered with the
    server once; a request carries the region, offset and size of each input and output and no
    tensor bytes. The input region holds one request's inputs, written by the client before a
    request whose inputs differ from the last one's (load: a client sends one input, written
    once, so the rows measure the server's side; soak: each request's, as a producer would);
    the output region holds every output at batch 1 (sized from one ordinary inference,
    `probe`). 602 KB a client for ResNet-50: /dev/shm must hold clients x that."""

    def __init__(self, mod, client, feeds: dict, probe: dict, tag: str):
        import tritonclient.utils.shared_memory as shm

        self.shm, self.mod, self.client = shm, mod, client
        self.names, self.handles = [], []
        self.inputs, self.outputs = {}, {}  # name -> (offset in its region, nbytes, dtype)
        self.h_in = self._region(f"{tag}_in", self._layout(feeds, self.inputs))
        self.h_out = self._region(f"{tag}_out", self._layout(probe, self.outputs))
        self.ins = []
        for name, (off, nbytes, dtype) in self.inputs.items():
            i = mod.InferInput(name, list(feeds[name].shape), _v2(dtype))
            i.set_shared_memory(f"{tag}_in", nbytes, offset=off)
            self.ins.append(i)
        self.outs = []
        for name, (off, nbytes, _) in self.outputs.items():
            o = mod.InferRequestedOutput(name)
            o.set_shared_memory(f"{tag}_out", nbytes, offset=off)
            self.outs.append(o)
        self.last = None  # the inputs in the region now

    @staticmethod
    def _layout(arrays: dict, places: dict) -> int:
        off = 0
        for name, a in arrays.items():
            places[name] = (off, a.nbytes, a.dtype)
            off += (a.nbytes + 63) // 64 * 64
        return max(off, 64)

    def _region(self, name: str, size: int):
        key = f"/{name}"
        h = self.shm.create_shared_memory_region(name, key, size)
        self.handles.append(h)
        self.client.register_system_shared_memory(name, key, size)
        self.names.append(name)
        return h

    def infer(self, model: str, feeds: dict):
        if feeds is not self.last:
            for name, (off, _, _) in self.inputs.items():
                self.shm.set_shared_memory_region(self.h_in, [np.ascontiguousarray(feeds[name])],
                                                  offset=off)
            self.last = feeds
        return self.client.infer(model, self.ins, outputs=self.outs)

    def answer(self, res) -> dict:
        """The outputs of the last request, read (copied) from the output region."""
        got = {}
        for name, (off, _, dtype) in self.outputs.items():
            o = res.get_output(name)
            shape = list(o["shape"] if isinstance(o, dict) else o.shape)
            got[name] = np.array(self.shm.get_contents_as_numpy(self.h_out, dtype, shape,
                                                                offset=off))
        return got

    def close(self) -> None:
        for name in self.names:
            try:
                self.client.unregister_system_shared_memory(name)
            except Exception:  # noqa: BLE001 - the server may be gone; the objects go below
                pass
        for h in self.handles:
            self.shm.destroy_shared_memory_region(h)
        self.names, self.handles = [], []


def shm_room(feeds: dict, clients: int) -> Optional[str]:
    """Why /dev/shm cannot hold `clients` clients' input regions (ShmClient), or None."""
    need = clients * sum(a.nbytes for a in feeds.values())
    try:
        st = os.statvfs("/dev/shm")
    except OSError as e:
        return f"/dev/shm: {e}"
    free = st.f_bavail * st.f_frsize
    if need > free:
        return (f"{clients} shared-memory clients need about {need / 2**20:.0f} MB of /dev/shm, "
                f"which has {free / 2**20:.0f} MB free")
    return None


def _v2(dtype) -> str:
    for k, v in NP_OF_V2.items():
        if np.dtype(v) == np.dtype(dtype):
            return k
    raise ValueError(f"no v2 datatype for {dtype}")


def _output_names(res, proto: str) -> list:
    """The output names of a tritonclient result."""
    r = res.get_response()
    return [o["name"] for o in r["outputs"]] if proto == "http" else [o.name for o in r.outputs]


def _status(e) -> tuple[str, str]:
    """(class, text) of a tritonclient exception: '4xx', '5xx' or 'other'."""
    status = str(e.status() if hasattr(e, "status") and e.status() is not None else "")
    msg = e.message() if hasattr(e, "message") else str(e)
    if status.isdigit():
        code = int(status)
        return ("4xx" if 400 <= code < 500 else "5xx" if code >= 500 else "other"), f"{code} {msg}"
    name = status.replace("StatusCode.", "")
    if name in GRPC_CLIENT_ERRORS:
        return "4xx", f"{name} {msg}"
    if name:
        return "5xx", f"{name} {msg}"
    return "other", msg or repr(e)


def _raw_http(http: str, path: str, headers: dict, body_parts, timeout: float = 60.0):
    """POSTs a body (an iterable of byte chunks, Content-Length given in headers) on a raw
    socket, stopping early when the server answers first (a 413 before the body is read);
    returns (status, body text)."""
    host, _, port = http.rpartition(":")
    host = host.strip("[]")
    s = socket.create_connection((host, int(port)), timeout=timeout)
    try:
        head = f"POST {path} HTTP/1.1\r\nHost: {http}\r\nConnection: close\r\n"
        head += "".join(f"{k}: {v}\r\n" for k, v in headers.items()) + "\r\n"
        s.sendall(head.encode())
        s.setblocking(False)
        deadline = time.time() + timeout
        answered = False
        for part in body_parts:
            view = memoryview(part)
            while view and time.time() < deadline:
                r, w, _ = select.select([s], [s], [], 1.0)
                if r:
                    answered = True
                    break
                if w:
                    try:
                        n = s.send(view[:1 << 20])
                    except (BlockingIOError, InterruptedError):
                        continue
                    except (BrokenPipeError, ConnectionResetError):
                        answered = True
                        break
                    view = view[n:]
            if answered:
                break
        s.setblocking(True)
        s.settimeout(max(1.0, deadline - time.time()))
        data = b""
        while True:
            try:
                chunk = s.recv(65536)
            except (ConnectionResetError, socket.timeout):
                break
            if not chunk:
                break
            data += chunk
            if b"\r\n\r\n" in data:
                head_end = data.index(b"\r\n\r\n")
                m = re.search(rb"content-length:\s*(\d+)", data[:head_end], re.I)
                if m and len(data) >= head_end + 4 + int(m.group(1)):
                    break
        if not data.startswith(b"HTTP/"):
            return 0, data[:200].decode(errors="replace")
        status = int(data.split(b" ", 2)[1])
        body = data.split(b"\r\n\r\n", 1)[1] if b"\r\n\r\n" in data else b""
        return status, body.decode(errors="replace")
    finally:
        s.close()


def _bad_request(kind, proto, mod, client, http, model, feeds, huge):
    """Sends one bad request of `kind`; returns (class, text) of the answer."""
    from tritonclient.utils import InferenceServerException

    name0 = next(iter(feeds))
    try:
        if kind == "wrong_shape":
            bad = dict(feeds)
            bad[name0] = np.zeros(list(feeds[name0].shape) + [2], feeds[name0].dtype)
            _infer(mod, client, model, bad)
        elif kind == "wrong_datatype":
            bad = dict(feeds)
            a = feeds[name0]
            bad[name0] = a.astype(np.float64 if a.dtype != np.float64 else np.float32)
            _infer(mod, client, model, bad)
        elif kind == "unknown_input":
            bad = dict(feeds)
            bad["no_such_input"] = bad.pop(name0)
            _infer(mod, client, model, bad)
        elif kind == "unknown_model":
            _infer(mod, client, "no_such_model", feeds)
        elif kind == "truncated_body":
            # A binary-tensor request whose header promises more tensor bytes than follow.
            a = feeds[name0]
            header = json.dumps({"inputs": [
                {"name": n, "shape": list(v.shape), "datatype": _v2(v.dtype),
                 "parameters": {"binary_data_size": v.nbytes}} for n, v in feeds.items()]}).encode()
            payload = b"".join(np.ascontiguousarray(v).tobytes() for v in feeds.values())
            payload = payload[: max(1, len(payload) // 2 - a.itemsize)]
            body = header + payload
            return _http_answer(*_raw_http(http, f"/v2/models/{model}/infer", {
                "Content-Type": "application/octet-stream", "Content-Length": len(body),
                "Inference-Header-Content-Length": len(header)}, [body]))
        elif kind == "huge_body" and proto == "grpc":
            # 100 MB in one tensor: over the server's gRPC message limit (RESOURCE_EXHAUSTED)
            _infer(mod, client, model, {name0: np.frombuffer(huge, np.uint8).view(np.float32)})
        elif kind == "huge_body":
            return _http_answer(*_raw_http(http, f"/v2/models/{model}/infer", {
                "Content-Type": "application/json", "Content-Length": len(huge)}, [huge]))
        else:
            raise ValueError(kind)
    except InferenceServerException as e:
        return _status(e)
    except Exception as e:  # noqa: BLE001 - a broken connection is an 'other'
        return "other", f"{type(e).__name__}: {e}"
    return "ok", "the server took a bad request"


def _http_answer(status: int, text: str) -> tuple[str, str]:
    cls = "4xx" if 400 <= status < 500 else "5xx" if status >= 500 else "other"
    try:
        msg = json.loads(text).get("error", "") if text else ""
    except (ValueError, AttributeError):
        msg = text
    return cls, f"{status} {msg}"


def rel_l2(got: np.ndarray, want: np.ndarray) -> float:
    got = np.asarray(got, np.float64).ravel()
    want = np.asarray(want, np.float64).ravel()
    if got.shape != want.shape:
        return math.inf
    return float(np.linalg.norm(got - want) / max(np.linalg.norm(want), 1e-30))


def mixed_up(got: dict, refs, own: int):
    """The index of another reference input whose outputs `got` is nearer to than to its own
    reference's `own` (an answer that belongs to another request), else None."""
    def dist(k):
        return math.sqrt(sum(float(np.linalg.norm(np.asarray(got[n], np.float64).ravel()
                                                  - np.asarray(w, np.float64).ravel())) ** 2
                             if np.asarray(got[n]).size == np.asarray(w).size else math.inf
                             for n, w in refs[k][1].items()))
    mine = dist(own)
    nearest = min((k for k in range(len(refs)) if k != own), key=dist, default=None)
    return nearest if nearest is not None and dist(nearest) < mine else None


def worker(args, index, threads, barrier, results):
    """One process of clients: `threads` client threads; puts one result dict on `results`."""
    protos = args["protocols"]
    specs = args["specs"]
    inputs = [make_inputs(specs, 1000 * index + k, args["int_high"]) for k in range(4)]
    refs = args.get("refs")  # soak: [(inputs, {output: array})]
    kinds = args.get("bad_kinds") or BAD_KINDS
    huge = b" " * HUGE_BYTES if args["mode"] == "soak" and "huge_body" in kinds else b""
    keep = args.get("keep_mismatches", 0)  # soak: mismatching answers kept, this process
    out = {"latencies": [], "ok": 0, "errors": {}, "error_samples": [], "mismatch": 0,
           "max_rel_l2": 0.0, "bad": {k: {} for k in BAD_KINDS}, "bad_samples": [],
           "first_error_at": None, "mismatches": [], "over_base_tolerance": 0}
    lock = threading.Lock()
    clients = []
    for t in range(threads):
        proto = protos[(index * threads + t) % len(protos)]
        clients.append((proto, *_client(proto.split("-")[0], args[proto.split("-")[0]],
                                        args.get("grpc_shared_connection", False))))
    barrier.wait()
    start = time.perf_counter()
    measure_from = start + args["warmup"]
    deadline = measure_from + args["duration"]

    def run(t):
        proto, mod, client = clients[t]
        shm_client = None
        if proto.endswith("-shm"):
            # In the thread that uses the client (tritonclient.http's connections are
            # gevent's, bound to the thread that first uses them); before the measured window
            # (--warmup): one ordinary inference for the outputs' sizes, and the registrations.
            try:
                res = _infer(mod, client, args["model"], inputs[0])
                probe = {o: res.as_numpy(o) for o in _output_names(res, proto.split("-")[0])}
                shm_client = ShmClient(mod, client, inputs[0], probe,
                                       f"kiln_load_{os.getpid()}_{t}")
            except Exception as e:  # noqa: BLE001 - counted once; this client sends nothing
                with lock:
                    out["errors"]["shm_setup"] = out["errors"].get("shm_setup", 0) + 1
                    out["error_samples"].append(f"{proto}: shared memory setup: {e!r}"[:300])
                return
        rng = np.random.default_rng(7919 * index + t)
        n = 0
        bad_turn = (index * threads + t) % len(kinds)
        lat, ok, errs, samples, mism, worst, over_base = [], 0, {}, [], 0, 0.0, 0
        bad: dict = {k: {} for k in BAD_KINDS}
        bad_samples = []
        while n < args["max_requests"] and time.perf_counter() < deadline:
            n += 1
            if args["mode"] == "soak" and rng.random() < args["bad_rate"]:
                kind = kinds[bad_turn % len(kinds)]
                bad_turn += 1
                feeds = refs[n % len(refs)][0] if refs else inputs[n % len(inputs)]
                cls, text = _bad_request(kind, proto.split("-")[0], mod, client, args["http"],
                                         args["model"], feeds, huge)
                has_msg = len(text.split(" ", 1)[-1].strip()) > 0 and cls == "4xx"
                key = cls if cls != "4xx" or has_msg else "4xx_no_message"
                bad[kind][key] = bad[kind].get(key, 0) + 1
                if key != "4xx" and len(bad_samples) < 5:
                    bad_samples.append(f"{kind} over {proto}: {key}: {text[:300]}")
                continue
            if refs:
                ref = n % len(refs)
                feeds, want = refs[ref][0], refs[ref][1]
                allowed = refs[ref][2] if len(refs[ref]) > 2 else args["tolerance"]
            else:  # (a shared-memory client sends one input: ShmClient)
                feeds = inputs[t % len(inputs)] if shm_client else inputs[n % len(inputs)]
                want = None
            t0 = time.perf_counter()
            try:
                if shm_client is not None:
                    res = shm_client.infer(args["model"], feeds)
                else:
                    res = _infer(mod, client, args["model"], feeds)
                t1 = time.perf_counter()
                if want is not None:
                    if shm_client is not None:
                        got = shm_client.answer(res)
                        got = {name: got[name] for name in want}
                    else:
                        got = {name: res.as_numpy(name) for name in want}
                    errors = {name: rel_l2(got[name], w) for name, w in want.items()}
                    e = max(errors.values())
                    worst = max(worst, e)
                    if not e <= args["tolerance"]:
                        over_base += 1
                    # Judged on the whole answer: within the input's tolerance of its own
                    # reference, and, once over --tolerance, no other reference input's
                    # output nearer (mixed_up; within --tolerance an answer is its own, as
                    # near as the check can tell: min_separation).
                    mixed = mixed_up(got, refs, ref) if not e <= args["tolerance"] else None
                    if not e <= allowed or mixed is not None:
                        mism += 1
                        if len(samples) < 5:
                            samples.append(f"rel L2 {e:.3g} (allowed {allowed:.3g}) over {proto}"
                                           + (f", nearer reference {mixed}'s output" if mixed
                                              is not None else ""))
                    if not e <= args["tolerance"] or mixed is not None:
                        with lock:
                            if len(out["mismatches"]) < keep:
                                out["mismatches"].append({
                                    "ref": ref, "protocol": proto, "rel_l2": e,
                                    "allowed": allowed, "mixed_up_with": mixed,
                                    "failed": bool(not e <= allowed or mixed is not None),
                                    "t_s": round(t1 - start, 2), "outputs": got})
                if t0 >= measure_from or args["mode"] == "soak":
                    lat.append(t1 - t0)
                    ok += 1
            except Exception as e:  # noqa: BLE001 - counted
                cls, text = _status(e) if hasattr(e, "status") else ("other", repr(e))
                errs[cls] = errs.get(cls, 0) + 1
                if len(samples) < 5:
                    samples.append(f"{proto}: {cls}: {text[:300]}")
        with lock:
            out["latencies"].extend(lat)
            out["ok"] += ok
            out["mismatch"] += mism
            out["over_base_tolerance"] += over_base
            out["max_rel_l2"] = max(out["max_rel_l2"], worst)
            for k, v in errs.items():
                out["errors"][k] = out["errors"].get(k, 0) + v
            out["error_samples"].extend(samples[: 5 - len(out["error_samples"])])
            for kind, d in bad.items():
                for k, v in d.items():
                    out["bad"][kind][k] = out["bad"][kind].get(k, 0) + v
            out["bad_samples"].extend(bad_samples[: 5 - len(out["bad_samples"])])
        if shm_client is not None:
            shm_client.close()  # in this thread (tritonclient.http's connection is bound to it)

    ts = [threading.Thread(target=run, args=(t,), daemon=True) for t in range(threads)]
    for t in ts:
        t.start()
    for t in ts:
        t.join(timeout=args["warmup"] + args["duration"] + 180)
    out["window_s"] = args["duration"] if args["mode"] == "load" else time.perf_counter() - start
    results.put(out)


def run_clients(args: dict, clients: int, procs: int) -> dict:
    """Runs `clients` client threads over `procs` processes; their results merged."""
    ctx = mp.get_context("spawn")
    procs = max(1, min(procs, clients))
    per = [clients // procs + (1 if i < clients % procs else 0) for i in range(procs)]
    barrier = ctx.Barrier(procs + 1)
    results = ctx.Queue()
    ps = [ctx.Process(target=worker, args=(args, i, per[i], barrier, results), daemon=True)
          for i in range(procs)]
    for p in ps:
        p.start()
    try:
        barrier.wait(timeout=120)
    except threading.BrokenBarrierError:
        for p in ps:
            p.kill()
        raise SystemExit("serve_load: the client processes did not start within 120 s")
    merged = {"latencies": [], "ok": 0, "errors": {}, "error_samples": [], "mismatch": 0,
              "max_rel_l2": 0.0, "bad": {k: {} for k in BAD_KINDS}, "bad_samples": [],
              "window_s": 0.0, "mismatches": [], "over_base_tolerance": 0}
    limit = time.time() + args["warmup"] + args["duration"] + 240
    for _ in ps:
        try:
            r = results.get(timeout=max(1.0, limit - time.time()))
        except Exception:  # noqa: BLE001 - a process that hangs is reported, not waited for
            merged["errors"]["lost_process"] = merged["errors"].get("lost_process", 0) + 1
            continue
        merged["latencies"].extend(r["latencies"])
        merged["ok"] += r["ok"]
        merged["mismatch"] += r["mismatch"]
        merged["over_base_tolerance"] += r.get("over_base_tolerance", 0)
        merged["mismatches"] += r.get("mismatches", [])
        merged["max_rel_l2"] = max(merged["max_rel_l2"], r["max_rel_l2"])
        merged["window_s"] = max(merged["window_s"], r["window_s"])
        for k, v in r["errors"].items():
            merged["errors"][k] = merged["errors"].get(k, 0) + v
        merged["error_samples"] += r["error_samples"]
        for kind, d in r["bad"].items():
            for k, v in d.items():
                merged["bad"][kind][k] = merged["bad"][kind].get(k, 0) + v
        merged["bad_samples"] += r["bad_samples"]
    for p in ps:
        p.join(timeout=10)
        if p.is_alive():
            p.kill()
    return merged


def percentile(xs, q):
    return float(np.percentile(np.asarray(xs), q) * 1e3) if xs else None


# ---- kiln bench -------------------------------------------------------------------------------
def kiln_bench(kiln: str, engine: str, batches: list[int], specs, duration: float) -> dict:
    """`kiln bench` throughput (samples/s) and median latency per batch, {batch: record}."""
    if not kiln or not engine or not batches:
        return {}
    shapes = ",".join(f"{n}:{'x'.join(str(d) for d in s)}" for n, _, s in specs)
    import tempfile

    out = os.path.join(tempfile.mkdtemp(prefix="serve_load_"), "bench.json")
    cmd = [kiln, "bench", "--engine", engine, "--shapes", shapes, "--batch",
           ",".join(str(b) for b in sorted(set(batches))), "--duration", str(duration),
           "--export-json", out]
    try:
        p = subprocess.run(cmd, capture_output=True, text=True, timeout=60 + 10 * len(batches) * duration)
    except (OSError, subprocess.TimeoutExpired) as e:
        print(f"serve_load: kiln bench failed: {e}", file=sys.stderr)
        return {}
    if p.returncode != 0 or not os.path.exists(out):
        print(f"serve_load: kiln bench failed ({p.returncode}): {p.stderr.strip()[-500:]}",
              file=sys.stderr)
        return {}
    with open(out) as f:
        data = json.load(f)
    records = data.get("records", [data])
    return {int(r["batch"]): {"throughput_per_s": r.get("throughput_per_s"),
                              "latency_ms_median": (r.get("latency_ms") or {}).get("median"),
                              "cuda_graph": r.get("cuda_graph")} for r in records}


# ---- the two modes ----------------------------------------------------------------------------
def base_args(a, mode: str, specs) -> dict:
    return {"mode": mode, "model": a.model, "http": a.http, "grpc": a.grpc, "specs": specs,
            "protocols": a.protocols, "int_high": a.int_high, "warmup": a.warmup,
            "duration": a.duration, "max_requests": a.max_requests, "tolerance": a.tolerance,
            "bad_rate": a.bad_rate, "grpc_shared_connection": a.grpc_shared_connection}


def process_tree(pid: int) -> list[int]:
    """`pid` and its descendants alive now (`python -m kiln.cli serve` under `timeout`, say)."""
    out, todo = [], [pid]
    while todo:
        p = todo.pop()
        out.append(p)
        try:
            for task in os.listdir(f"/proc/{p}/task"):
                with open(f"/proc/{p}/task/{task}/children") as f:
                    todo.extend(int(c) for c in f.read().split())
        except (OSError, ValueError):
            pass
    return out


def cpu_seconds(pid: int):
    """User + system CPU seconds so far of process `pid` and its descendants alive (None
    without one): a process that exits in between takes its seconds with it."""
    if not pid:
        return None
    total, seen = 0.0, False
    for p in process_tree(pid):
        try:
            with open(f"/proc/{p}/stat") as f:
                fields = f.read().rsplit(")", 1)[1].split()
            total += (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")
            seen = True
        except (OSError, ValueError, IndexError):
            pass
    return total if seen else None


def rss_mb(pid: int):
    """Resident memory of process `pid` and its descendants (MB), or None."""
    total, seen = 0.0, False
    for p in process_tree(pid):
        try:
            with open(f"/proc/{p}/status") as f:
                for line in f:
                    if line.startswith("VmRSS:"):
                        total += int(line.split()[1]) / 1024.0
                        seen = True
        except OSError:
            pass
    return total if seen else None


def load_mode(a, specs) -> dict:
    rows = []
    for proto in a.protocols:
        for n in a.clients:
            before = scrape(a.http, a.model)
            cpu0, t0 = cpu_seconds(a.server_pid), time.perf_counter()
            r = run_clients(dict(base_args(a, "load", specs), protocols=[proto]), n, a.procs)
            cpu1, t1 = cpu_seconds(a.server_pid), time.perf_counter()
            after = scrape(a.http, a.model)
            f = formed(before, after)
            # The server's CPU use over the run (warm-up and client start included), in cores,
            # and per request it took in that time (its /metrics).
            have_cpu = cpu0 is not None and cpu1 is not None
            f["server_cores"] = round((cpu1 - cpu0) / (t1 - t0), 2) if have_cpu else None
            f["server_cpu_us_per_request"] = (round((cpu1 - cpu0) / f["requests_served"] * 1e6)
                                              if have_cpu and f["requests_served"] else None)
            lat = r["latencies"]
            row = {"label": a.label, "model": a.model, "protocol": proto, "clients": n,
                   "requests": r["ok"], "errors": r["errors"], "error_samples": r["error_samples"][:3],
                   "throughput_per_s": round(len(lat) / r["window_s"], 1) if r["window_s"] else None,
                   "p50_ms": percentile(lat, 50), "p99_ms": percentile(lat, 99),
                   "mean_ms": float(np.mean(lat) * 1e3) if lat else None, **f}
            rows.append(row)
            print(f"  {a.label} {a.model} {proto} {n:4d} clients: {row['throughput_per_s']} req/s, "
                  f"p50 {fmt(row['p50_ms'])} ms, p99 {fmt(row['p99_ms'])} ms, batch "
                  f"{row['formed_batch_mean']} (runs at {row['run_batch_mode']}), server CPU "
                  f"{row['server_cores']} cores, "
                  f"{row['server_cpu_us_per_request']} us/request, "
                  f"devices {row['per_device']}, errors "
                  f"{r['errors'] or 0}", flush=True)
    bench = kiln_bench(a.kiln, a.engine, [r["run_batch_mode"] for r in rows if r["run_batch_mode"]],
                       specs, a.bench_duration)
    for r in rows:
        b = bench.get(r["run_batch_mode"] or -1)
        r["bench_batch"] = r["run_batch_mode"]
        r["bench_throughput_per_s"] = b["throughput_per_s"] if b else None
        r["bench_latency_ms"] = b["latency_ms_median"] if b else None
        r["server_over_bench"] = (round(r["throughput_per_s"] / b["throughput_per_s"], 3)
                                  if b and b["throughput_per_s"] and r["throughput_per_s"] else None)
    return {"mode": "load", "label": a.label, "model": a.model, "rows": rows, "kiln_bench": bench}


def fmt(x, nd=2):
    return "-" if x is None else f"{x:.{nd}f}"


def table(rows) -> str:
    lines = ["| setup | model | protocol | clients | req/s | p50 ms | p99 ms | batch formed (mean; runs at) "
             "| kiln bench at that batch, samples/s | server / bench | server CPU (cores) "
             "| server CPU µs/request | errors |",
             "|---|---|---|---:|---:|---:|---:|---|---:|---:|---:|---:|---|"]
    for r in rows:
        lines.append(
            f"| {r['label']} | {r['model']} | {r['protocol']} | {r['clients']} | "
            f"{fmt(r['throughput_per_s'], 1)} | {fmt(r['p50_ms'])} | {fmt(r['p99_ms'])} | "
            f"{r['formed_batch_mean']}; {r['run_batch_mode']} | {fmt(r['bench_throughput_per_s'], 0)} | "
            f"{fmt(r['server_over_bench'], 3)} | {fmt(r.get('server_cores'))} | "
            f"{fmt(r.get('server_cpu_us_per_request'), 0)} | "
            f"{sum(r['errors'].values()) if r['errors'] else 0} |")
    return "\n".join(lines)


class Sampler(threading.Thread):
    """Samples the server's RSS (/proc/PID/status), the GPUs' memory (nvidia-smi) and the
    requests served (/metrics) every `every` seconds."""

    def __init__(self, pid, http, model, every):
        super().__init__(daemon=True)
        self.pid, self.http, self.model, self.every = pid, http, model, every
        self.rows: list[dict] = []
        self.stop = threading.Event()
        self.smi = shutil.which("nvidia-smi")

    def sample(self, t0):
        row = {"t_s": round(time.time() - t0, 2), "rss_mb": None, "gpu_used_mb": None}
        if self.pid:
            row["rss_mb"] = rss_mb(self.pid)
        if self.smi:
            try:
                p = subprocess.run([self.smi, "--query-gpu=index,memory.used",
                                    "--format=csv,noheader,nounits"], capture_output=True,
                                   text=True, timeout=20)
                used = [float(line.split(",")[1]) for line in p.stdout.strip().splitlines()]
                row["gpu_used_mb"] = sum(used)
                for i, u in enumerate(used):
                    row[f"gpu{i}_mb"] = u
            except (OSError, subprocess.TimeoutExpired, ValueError, IndexError):
                pass
        row["requests"] = scrape(self.http, self.model).get("kiln_requests_total")
        return row

    def run(self):
        t0 = time.time()
        while not self.stop.is_set():
            self.rows.append(self.sample(t0))
            self.stop.wait(self.every)
        self.rows.append(self.sample(t0))


def growth(rows, key, settle):
    """The rise of `key` from its value at `settle` seconds to its maximum after (MB)."""
    pts = [(r["t_s"], r[key]) for r in rows if r.get(key) is not None]
    after = [v for t, v in pts if t >= settle]
    if len(after) < 2:
        return None
    return round(max(after) - after[0], 1)


def plot(rows, png, title, settle):
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    t = [r["t_s"] for r in rows]
    fig, axes = plt.subplots(3, 1, figsize=(8, 8), sharex=True)
    axes[0].plot(t, [r["rss_mb"] for r in rows], marker=".")
    axes[0].set_ylabel("server RSS (MB)")
    gpus = sorted(k for k in rows[0] if re.fullmatch(r"gpu\d+_mb", k)) if rows else []
    for k in gpus:
        axes[1].plot(t, [r.get(k) for r in rows], marker=".", label=k.replace("_mb", ""))
    if gpus:
        axes[1].legend()
    axes[1].set_ylabel("GPU memory used (MB)")
    req = [r.get("requests") for r in rows]
    rate = [None] + [((b - a) / (tb - ta)) if None not in (a, b) and tb > ta else None
                     for a, b, ta, tb in zip(req, req[1:], t, t[1:])]
    axes[2].plot(t, rate, marker=".")
    axes[2].set_ylabel("requests/s (kiln_requests_total)")
    axes[2].set_xlabel("seconds")
    for ax in axes:
        ax.axvline(settle, color="grey", linestyle=":")
        ax.grid(True, alpha=0.3)
    axes[0].set_title(title)
    fig.tight_layout()
    fig.savefig(png, dpi=90)


def _batch_sizes(e) -> list[int]:
    """Powers of two up to the engine's largest batch (its profile's first dimension), and
    that maximum: the sizes `kiln serve --pad-batches` runs."""
    first, prof = e.inputs[0], e.profile.get(e.inputs[0].name)
    hi = 1 if not first.shape or isinstance(first.shape[0], int) else (
        int(prof["max"][0]) if prof else 32)
    sizes, b = [], 1
    while b < hi:
        sizes.append(b)
        b *= 2
    return sizes + [hi]


def _rows(feeds: dict, b: int) -> dict:
    return {n: np.ascontiguousarray(np.repeat(v, b, axis=0)) for n, v in feeds.items()}


def _answer_error(got: dict, want: dict) -> float:
    return max(rel_l2(got[n], w) for n, w in want.items())


def allowed_error(tolerance: float, k_fp16: float, own: Optional[float]) -> float:
    """The rel L2 an answer may differ from its reference by: max(tolerance, k_fp16 x `own`),
    `own` the engine's error on that input against an FP32 engine (None: tolerance)."""
    return tolerance if own is None else max(tolerance, k_fp16 * own)


def references(engine: str, specs, k: int, int_high: int, device: int, tolerance: float = 2e-2,
               reference_engine: str = "", k_fp16: float = 3.0):
    """k inputs and their outputs from the engine run directly (kiln.Context.run), each with
    the rel L2 an answer may differ by: max(tolerance, k_fp16 x the engine's own error on that
    input against `reference_engine`, an FP32 build of the same model) (see the module's
    docstring). Also the engine's spread over batch sizes on each input (its batch-1 output
    against its output at each padded batch size, the input in every row) and the smallest
    distance between two inputs' outputs, which bounds what the check can tell apart. Returns
    ([(feeds, outputs, allowed)], diagnostics, the engine's context)."""
    import kiln

    dev = device if kiln.device_count() and device >= 0 else None
    e = kiln.load(engine, device=dev)
    ctx = e.create_context()
    fp32 = kiln.load(reference_engine, device=dev).create_context() if reference_engine else None
    sizes = _batch_sizes(e)
    refs, diag = [], {"fp16_error": [], "batch_spread": [], "allowed": [], "k_fp16": k_fp16,
                      "batch_sizes": sizes, "reference_engine": reference_engine or None}
    for i in range(k):
        feeds = make_inputs(specs, 50_000 + i, int_high)
        want = {n: np.asarray(v) for n, v in ctx.run(feeds).items()}
        own = _answer_error(want, {n: np.asarray(v) for n, v in fp32.run(feeds).items()}) \
            if fp32 is not None else None
        spread = 0.0
        for b in sizes[1:]:
            try:
                out = ctx.run(_rows(feeds, b))
            except Exception:  # noqa: BLE001 - a size the profile does not take
                continue
            row0 = {n: np.asarray(v)[:1] for n, v in out.items()}
            spread = max(spread, _answer_error(row0, want))
        allowed = allowed_error(tolerance, k_fp16, own)
        refs.append((feeds, want, allowed))
        diag["fp16_error"].append(own)
        diag["batch_spread"].append(spread)
        diag["allowed"].append(allowed)
    seps = [_answer_error(refs[i][1], refs[j][1]) for i in range(k) for j in range(k) if i != j]
    diag["min_separation"] = min(seps) if seps else None
    return refs, diag, ctx


def save_mismatches(path: str, records: list, refs, ctx) -> list:
    """Writes the kept mismatching answers to `path` (.npz): per record i, the request's inputs
    (input_i_NAME), the server's outputs (server_i_NAME), the reference outputs
    (reference_i_NAME), and in `records` (a JSON string) its rel L2, protocol, reference index,
    and the batch size at which the engine run directly (the input in every row) gives the
    nearest answer to the server's (best_batch, best_batch_rel_l2: ~0 means the server's answer
    is the engine's own at that batch). Returns the records without their arrays."""
    sizes = _batch_sizes(ctx.engine) if ctx is not None and hasattr(ctx, "engine") else [1]
    arrays, meta = {}, []
    for i, r in enumerate(records):
        feeds, want = refs[r["ref"]][0], refs[r["ref"]][1]
        got = {n: np.asarray(v) for n, v in r["outputs"].items()}
        best = None
        if ctx is not None:
            for b in sizes:
                try:
                    out = ctx.run(_rows(feeds, b))
                except Exception:  # noqa: BLE001 - a size the profile does not take
                    continue
                err = _answer_error(got, {n: np.asarray(v)[:1] for n, v in out.items()})
                if best is None or err < best[1]:
                    best = (b, err)
        for n, v in feeds.items():
            arrays[f"input_{i}_{n}"] = v
        for n, v in got.items():
            arrays[f"server_{i}_{n}"] = v
        for n, v in want.items():
            arrays[f"reference_{i}_{n}"] = v
        m = {k: v for k, v in r.items() if k != "outputs"}
        m["best_batch"], m["best_batch_rel_l2"] = (best if best else (None, None))
        meta.append(m)
    np.savez_compressed(path, records=np.array(json.dumps(meta)), **arrays)
    return meta


def memory_verdict(rows, key: str, settle: float, slope_mb_min: float, min_window: float):
    """Whether `key` (MB) is flat after `settle` s: the least-squares slope over the last half
    of the samples after it at most `slope_mb_min` MB/min. None (not judged) when that half
    spans less than `min_window` s. Returns (flat, slope MB/min, window s)."""
    pts = [(r["t_s"], r[key]) for r in rows if r.get(key) is not None and r["t_s"] >= settle]
    if len(pts) < 4:
        return None, None, 0.0
    mid = pts[0][0] + (pts[-1][0] - pts[0][0]) / 2
    half = [(t, v) for t, v in pts if t >= mid]
    window = half[-1][0] - half[0][0] if len(half) > 1 else 0.0
    if len(half) < 3 or window <= 0:
        return None, None, round(window, 1)
    t = np.array([p[0] for p in half]) / 60.0
    v = np.array([p[1] for p in half])
    slope = float(np.polyfit(t, v, 1)[0])
    if window < min_window:
        return None, round(slope, 2), round(window, 1)
    return bool(slope <= slope_mb_min), round(slope, 2), round(window, 1)


def soak_mode(a, specs) -> dict:
    refs, ref_diag, ref_ctx = references(a.engine, specs, a.references, a.int_high,
                                         a.reference_device, a.tolerance, a.reference_engine,
                                         a.k_fp16)
    sampler = Sampler(a.server_pid, a.http, a.model, a.sample_every)
    sampler.start()
    before = scrape(a.http, a.model)
    args = dict(base_args(a, "soak", specs), refs=refs, warmup=0.0, bad_kinds=a.bad_kinds,
                keep_mismatches=max(0, a.keep_mismatches // max(1, min(a.procs, a.clients[0]))))
    r = run_clients(args, a.clients[0], a.procs)
    after = scrape(a.http, a.model)
    sampler.stop.set()
    sampler.join(timeout=60)
    rows = sampler.rows
    settle = min(a.settle, a.duration / 2)
    bad_total = {k: sum(v.values()) for k, v in r["bad"].items() if k in a.bad_kinds}
    bad_fail = {k: {c: n for c, n in v.items() if c != "4xx"} for k, v in r["bad"].items()}
    lat = r["latencies"]
    good_errors = sum(r["errors"].values())
    five = sum(n for v in r["bad"].values() for c, n in v.items() if c == "5xx") + r["errors"].get("5xx", 0)
    summary = {
        "mode": "soak", "label": a.label, "model": a.model, "clients": a.clients[0],
        "duration_s": round(r["window_s"], 1), "bad_rate": a.bad_rate,
        "good_ok": r["ok"], "good_mismatch": r["mismatch"], "good_errors": r["errors"],
        "max_rel_l2": r["max_rel_l2"], "tolerance": a.tolerance,
        "over_base_tolerance": r["over_base_tolerance"], "references": ref_diag,
        "throughput_per_s": round(len(lat) / r["window_s"], 1) if r["window_s"] else None,
        "p50_ms": percentile(lat, 50), "p99_ms": percentile(lat, 99),
        "bad": r["bad"], "bad_sent": bad_total, "bad_not_4xx_with_message": bad_fail,
        "responses_5xx": five, "error_samples": r["error_samples"][:5],
        "bad_samples": r["bad_samples"][:5], **formed(before, after),
        "settle_s": settle, "rss_growth_after_settle_mb": growth(rows, "rss_mb", settle),
        "gpu_growth_after_settle_mb": growth(rows, "gpu_used_mb", settle),
        "samples": rows,
    }
    flat, slope, window = memory_verdict(rows, "rss_mb", settle, a.rss_slope, a.min_memory_window)
    gflat, gslope, _ = memory_verdict(rows, "gpu_used_mb", settle, a.rss_slope, a.min_memory_window)
    rate = summary["throughput_per_s"]
    summary.update({
        "rss_flat": flat, "rss_slope_mb_per_min": slope, "rss_slope_window_s": window,
        "rss_slope_bound_mb_per_min": a.rss_slope,
        "rss_bytes_per_request": (round(slope * 2**20 / 60 / rate, 1)
                                  if slope is not None and rate else None),
        "gpu_flat": gflat, "gpu_slope_mb_per_min": gslope})
    mism = r["mismatches"]
    if mism and a.mismatches:
        summary["mismatch_records"] = save_mismatches(a.mismatches, mism, refs, ref_ctx)
        summary["mismatch_file"] = a.mismatches
    summary["passed"] = bool(r["ok"] > 0 and r["mismatch"] == 0 and good_errors == 0 and five == 0
                             and not any(bad_fail.values()) and all(bad_total.values())
                             and flat is not False and gflat is not False)
    if a.csv:
        keys = sorted({k for row in rows for k in row}, key=lambda k: (k != "t_s", k))
        with open(a.csv, "w") as f:
            f.write(",".join(keys) + "\n")
            for row in rows:
                f.write(",".join("" if row.get(k) is None else str(row[k]) for k in keys) + "\n")
    if a.png and rows:
        try:
            plot(rows, a.png, f"kiln serve soak: {a.model}, {a.clients[0]} clients, "
                              f"{a.bad_rate:.0%} bad requests ({a.label})", settle)
        except ImportError as e:
            print(f"serve_load: no plot ({e})", file=sys.stderr)
    sep = ref_diag.get("min_separation")
    if sep is not None and sep < 2 * a.tolerance:
        print(f"  soak: the reference inputs' outputs are as close as rel L2 {sep:.3g}: an answer "
              f"mixed up with another input's within {a.tolerance:g} is not told apart",
              flush=True)
    judged = ("not judged: window too short" if flat is None else
              f"{'flat' if flat else 'GROWING'}, bound {a.rss_slope} MB/min")
    print(f"  soak {a.model}: {r['ok']} good answers ({r['mismatch']} wrong, "
          f"{r['over_base_tolerance']} over {a.tolerance:g}, max rel L2 {r['max_rel_l2']:.2e}; "
          f"{len(mism)} kept{' in ' + a.mismatches if mism and a.mismatches else ''}), errors "
          f"{r['errors'] or 0}; bad sent {bad_total}, not a 4xx with a message: {bad_fail}; "
          f"5xx: {five}; RSS +{summary['rss_growth_after_settle_mb']} MB after {settle:.0f} s, "
          f"{slope} MB/min over the last {window} s "
          f"({judged}); GPU +{summary['gpu_growth_after_settle_mb']} MB; "
          f"{'PASSED' if summary['passed'] else 'FAILED'}", flush=True)
    for m in summary.get("mismatch_records", [])[:5]:
        print(f"    kept: reference {m['ref']} over {m['protocol']}: rel L2 {m['rel_l2']:.3g} "
              f"(allowed {m['allowed']:.3g}), nearest engine batch {m['best_batch']} at rel L2 "
              f"{m['best_batch_rel_l2']}"
              + (f", MIXED UP with {m['mixed_up_with']}" if m["mixed_up_with"] is not None else ""))
    for s in summary["error_samples"] + summary["bad_samples"]:
        print("    " + s)
    return summary


def parse(argv=None):
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("mode", choices=["load", "soak"])
    p.add_argument("--http", default="127.0.0.1:8080", help="the server's REST address (local)")
    p.add_argument("--grpc", default="127.0.0.1:8081", help="the server's gRPC address (local)")
    p.add_argument("--model", required=True)
    p.add_argument("--protocols", default="grpc,http",
                   help="some of grpc, http, grpc-shm, http-shm: -shm sends the inputs and "
                        "takes the outputs through registered system shared memory regions "
                        "(Triton's extension; the server must be on this machine)")
    p.add_argument("--shm", action="store_true",
                   help="every protocol through shared memory (grpc -> grpc-shm, ...): each "
                        "client registers its own input and output regions once")
    p.add_argument("--clients", default=None, help="load: 1,8,32,128; soak: 64")
    p.add_argument("--procs", type=int, default=max(1, min(8, (os.cpu_count() or 2) // 4)),
                   help="client processes (threads spread over them)")
    p.add_argument("--duration", type=float, default=None, help="seconds measured (load: 5 per "
                   "run; soak: 120 — the issue asks 600)")
    p.add_argument("--warmup", type=float, default=1.0, help="load: seconds before measuring")
    p.add_argument("--max-requests", type=int, default=100000, help="per client, per run")
    p.add_argument("--seq", type=int, default=128, help="dynamic dimensions past the batch")
    p.add_argument("--int-high", type=int, default=1000, help="integer inputs in [0, this)")
    p.add_argument("--label", default="", help="what this server setup is, for the table")
    p.add_argument("--engine", help="the engine file the model serves (kiln bench; soak references)")
    p.add_argument("--kiln", default=os.environ.get("KILN_CLI", ""), help="the kiln CLI (kiln bench)")
    p.add_argument("--bench-duration", type=float, default=2.0)
    p.add_argument("--bad-rate", type=float, default=0.05)
    p.add_argument("--tolerance", type=float, default=2e-2, help="soak: largest relative L2 "
                   "between an answer and the engine's own output (batches run other tactics)")
    p.add_argument("--references", type=int, default=8, help="soak: distinct inputs")
    p.add_argument("--reference-engine", default="", help="soak: an FP32 engine of the same "
                   "model: each input's allowed rel L2 becomes max(--tolerance, --k-fp16 x the "
                   "engine's own error on it against this one)")
    p.add_argument("--k-fp16", type=float, default=3.0, help="soak: see --reference-engine and "
                   "the docstring (3: the engine's error at the batch the server runs, up to twice "
                   "its batch-1 error, plus the reference's own)")
    p.add_argument("--mismatches", default="", help="soak: .npz file for the answers over "
                   "--tolerance (inputs, server and reference outputs, rel L2, nearest batch)")
    p.add_argument("--keep-mismatches", type=int, default=64, help="soak: at most this many "
                   "kept for --mismatches")
    p.add_argument("--bad-kinds", default=",".join(BAD_KINDS), help="soak: the kinds of bad "
                   "request sent in turn")
    p.add_argument("--rss-slope", type=float, default=5.0, help="soak: flat means the RSS's "
                   "least-squares slope over the last half after --settle is at most this (MB/min)")
    p.add_argument("--min-memory-window", type=float, default=60.0, help="soak: memory is judged "
                   "only when that last half spans at least this many seconds")
    p.add_argument("--reference-device", type=int, default=0)
    p.add_argument("--server-pid", type=int, default=0,
                   help="the server's process: soak samples its RSS, load reports its CPU use "
                        "(with its descendants)")
    p.add_argument("--grpc-shared-connection", action="store_true",
                   help="the gRPC clients of one process share one connection (grpc's default), "
                        "instead of one each")
    p.add_argument("--sample-every", type=float, default=5.0)
    p.add_argument("--settle", type=float, default=60.0, help="soak: memory must be flat after this")
    p.add_argument("--ready-timeout", type=float, default=120.0)
    p.add_argument("--json"), p.add_argument("--md"), p.add_argument("--csv"), p.add_argument("--png")
    a = p.parse_args(argv)
    a.http, a.grpc = local_address(a.http), local_address(a.grpc)
    a.protocols = [x for x in a.protocols.split(",") if x]
    if a.shm:
        a.protocols = [x if x.endswith("-shm") else x + "-shm" for x in a.protocols]
    if any(x not in PROTOCOLS for x in a.protocols) or not a.protocols:
        p.error(f"--protocols takes some of {','.join(PROTOCOLS)}")
    if any(x.endswith("-shm") for x in a.protocols) and not os.path.isdir("/dev/shm"):
        p.error("--shm needs POSIX shared memory (/dev/shm), which this machine has not")
    default_clients = "64" if a.mode == "soak" else "1,8,32,128"
    a.clients = [int(x) for x in (a.clients or default_clients).split(",") if x]
    if a.duration is None:
        a.duration = 120.0 if a.mode == "soak" else 5.0
    if a.mode == "soak" and not a.engine:
        p.error("soak needs --engine: good answers are checked against the engine run directly")
    a.bad_kinds = [k for k in a.bad_kinds.split(",") if k]
    if not a.bad_kinds or any(k not in BAD_KINDS for k in a.bad_kinds):
        p.error(f"--bad-kinds takes some of {','.join(BAD_KINDS)}")
    if not 0 <= a.bad_rate <= 1:
        p.error("--bad-rate is a fraction in [0, 1]")
    return a


def main(argv=None) -> int:
    a = parse(argv)
    wait_ready(a.http, a.ready_timeout)
    specs = model_inputs(a.http, a.model, a.seq)
    if any(x.endswith("-shm") for x in a.protocols):
        problem = shm_room(make_inputs(specs, 0, a.int_high), max(a.clients))
        if problem:
            raise SystemExit(f"serve_load: --shm: {problem}")
    result = load_mode(a, specs) if a.mode == "load" else soak_mode(a, specs)
    if a.mode == "load":
        md = table(result["rows"])
        print(md)
        if a.md:
            with open(a.md, "a") as f:
                f.write(md + "\n\n")
    if a.json:
        with open(a.json, "w") as f:
            json.dump(result, f, indent=1, default=str)
    if a.mode == "soak":
        return 0 if result["passed"] else 2
    return 0 if all(not r["errors"] for r in result["rows"]) else 2


if __name__ == "__main__":
    sys.exit(main())
