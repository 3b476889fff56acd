"""`kiln serve --workers N`: N worker processes, each a whole `kiln serve` (gRPC and REST on the
same ports, its own engines, contexts and dynamic batcher), under the process `kiln serve` was
started as, which supervises them (uvicorn's and gunicorn's workers, for kiln). One process's
front end (its event loop: grpc.aio's per-call work, decoding, encoding) bounds `kiln serve` at
about 1,100-1,400 requests/s whatever the GPU does (docs/perf.md); N processes have N of them.

The supervisor (supervise):
- checks that the ports are free, starts the workers (`python -m kiln.cli serve` with the same
  arguments; KILN_SERVE_WORKER tells each which worker it is and which devices it serves), and
  lets them take connections only once every one has loaded its models ('go'), so that
  connections opened as soon as the server is ready spread over all of them;
- forwards SIGINT, SIGTERM and SIGQUIT to the workers as SIGTERM and waits for them (a second
  signal, or STOP_GRACE_S, kills them); exits 0;
- exits 1 with one line (the worker's own message) when a worker fails to start, after
  stopping the others;
- restarts a worker that dies after it was ready, saying so on stderr (its open connections
  are lost; new ones go to the workers alive); stops every worker and exits 1 when a restarted
  worker does not start, or when workers die more than MAX_RESTARTS times in RESTART_WINDOW_S.
A worker stops by itself when its supervisor goes away (its socket to it closes), so none is
left behind even when the supervisor is killed.

Every worker listens on the ports with SO_REUSEPORT, and Linux gives each new connection to one
of them by a hash of its addresses; a connection (a gRPC channel, a keep-alive HTTP connection)
stays with its worker, so one client uses one worker.

Devices: with D devices (--devices) and N >= D workers, worker i serves device i mod D, with
--contexts contexts on it; with N < D, every N-th device from device i. `--worker-devices all`
gives every worker contexts on every device instead: each GPU then runs N processes' work,
time-sliced between their CUDA contexts (without MPS), and holds N copies of the weights,
against N/D with the default.

--batcher device: the supervisor first starts one batcher process per device (one for cpu
engines: run_batcher), which loads the models there, listens on a Unix socket in a temporary
folder of the supervisor's and tells it 'loaded'/'ready' like a worker; then the workers, which
are front ends only (no engine, no GPU): each connects to every batcher (BatcherLink), hands it
an Arena (a memfd of shared memory) and forwards each decoded request's tensors through it
(RemoteBatcher); the batcher's BatcherService joins the requests of every front end in the
model's Batcher and answers on the socket. The supervisor restarts a batcher that dies as it
restarts a worker, and stops the workers before the batchers.

/metrics: prometheus_client's multiprocess mode (PROMETHEUS_MULTIPROC_DIR, a temporary folder
of the supervisor's): each worker counts into files there (SharedStats), and a scrape, whichever
worker answers it, sums them over every worker that ran (a restarted worker's predecessor
included): kiln's families as with one process, plus kiln_worker_requests_total{model,worker},
and KServe's histograms; per-process families (process_*, python_*) are not shown.
"""
from __future__ import annotations

import asyncio
import bisect
import functools
import json
import mmap
import os
import pickle
import selectors
import shutil
import signal
import socket
import struct
import subprocess
import sys
import tempfile
import time
from dataclasses import dataclass, field
from typing import Optional

import numpy as np

from kiln.batching import RequestError, Stats

WORKER_ENV = "KILN_SERVE_WORKER"
SHM_DIR_ENV = "KILN_SERVE_SHM_DIR"  # kiln.shm.REGISTRY_ENV (not imported: the supervisor
                                    # imports no more than it needs)
MAX_RESTARTS, RESTART_WINDOW_S = 5, 60.0
STOP_GRACE_S = 30.0  # how long the workers may take to stop before they are killed
WORKER_DEVICE_MODES = ("split", "all")


# ---- how many workers, on which devices ---------------------------------------------------------
def cpu_cores() -> int:
    try:
        return len(os.sched_getaffinity(0))
    except AttributeError:  # not Linux
        return os.cpu_count() or 1


def parse_workers(text: str, devices: int, cores: Optional[int] = None) -> int:
    """`--workers`: a number >= 1, or 'auto': half the cores this process may run on (a worker
    keeps its event loop busy and grpc's and the inference threads need cores too), at least 1
    and at most 8, and with several devices a multiple of their number, so that each serves as
    many workers. ValueError says what is wrong."""
    if text.strip().lower() == "auto":
        n = max(1, min(8, (cores or cpu_cores()) // 2))
        if devices > 1 and n > 1:
            n = max(devices, n - n % devices)
        return n
    try:
        n = int(text)
    except ValueError:
        raise ValueError(f"--workers takes a number of processes or 'auto', not '{text}'") from None
    if n < 1:
        raise ValueError(f"--workers: at least 1 process, not {n}")
    return n


def worker_devices(devices: list, workers: int, index: int, mode: str = "split") -> list:
    """The devices worker `index` of `workers` serves: all of them with one worker or mode
    'all'; else device index mod D, or with fewer workers than devices every workers-th one."""
    if not devices or workers == 1 or mode == "all":
        return list(devices)
    if workers >= len(devices):
        return [devices[index % len(devices)]]
    return list(devices[index::workers])


# ---- sockets ------------------------------------------------------------------------------------
def _addresses(host: str, port: int) -> list:
    """(family, protocol, sockaddr) of every address `host` listens on, as asyncio's
    create_server binds them (an IPv6 socket takes IPv6 only)."""
    seen, out = set(), []
    for family, _, proto, _, addr in socket.getaddrinfo(
            host or None, port, type=socket.SOCK_STREAM, flags=socket.AI_PASSIVE):
        if (family, addr) not in seen:
            seen.add((family, addr))
            out.append((family, proto, addr))
    return out


def _socket(family, proto: int, reuse_port: bool) -> socket.socket:
    # The protocol as getaddrinfo gives it (IPPROTO_TCP, not 0): asyncio sets TCP_NODELAY only
    # on connections whose socket says so, and without it every small HTTP answer waited for
    # the client's delayed ACK (40 ms).
    s = socket.socket(family, socket.SOCK_STREAM, proto)
    s.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    if reuse_port:
        s.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEPORT, 1)
    if family == socket.AF_INET6:
        s.setsockopt(socket.IPPROTO_IPV6, socket.IPV6_V6ONLY, 1)
    return s


def port_problem(host: str, port: int, what: str) -> Optional[str]:
    """Why `host`:`port` cannot be listened on (another process listens there, with or without
    SO_REUSEPORT; a bad address), or None."""
    try:
        for family, proto, addr in _addresses(host, port):
            with _socket(family, proto, reuse_port=False) as s:
                s.bind(addr)
    except OSError as e:
        return f"cannot listen on {host}:{port} ({what}): {e.strerror or e}"
    return None


def reuseport_sockets(host: str, port: int) -> list:
    """Sockets bound to `host`:`port` with SO_REUSEPORT, for uvicorn to listen on (OSError when
    they cannot be bound)."""
    socks = []
    try:
        for family, proto, addr in _addresses(host, port):
            socks.append(_socket(family, proto, reuse_port=True))
            socks[-1].bind(addr)
    except OSError:
        for s in socks:
            s.close()
        raise
    return socks


# ---- the worker's side --------------------------------------------------------------------------
@dataclass
class WorkerLink:
    """A worker's side of its supervisor: which worker it is, the devices it serves, and the
    socket to the supervisor. Lines to it: 'loaded', 'ready', 'error MESSAGE'; from it: 'go'."""
    index: int
    count: int
    devices: list
    sock: socket.socket
    role: str = "worker"  # or "batcher" (--batcher device: one per device)
    path: str = ""        # a batcher's: the Unix socket it listens on
    batchers: list = field(default_factory=list)  # a front end's: the batchers' sockets

    @classmethod
    def from_env(cls) -> Optional["WorkerLink"]:
        """The link of a worker (KILN_SERVE_WORKER, which this takes out of the environment),
        else None."""
        text = os.environ.pop(WORKER_ENV, None)
        if not text:
            return None
        d = json.loads(text)
        return cls(d["index"], d["count"], list(d["devices"]), socket.socket(fileno=d["fd"]),
                   d.get("role", "worker"), d.get("path", ""), list(d.get("batchers", [])))

    def send(self, line: str) -> None:
        try:
            self.sock.sendall(line.encode() + b"\n")
        except OSError:  # the supervisor is gone; the worker stops at its next wait
            pass

    def error(self, message: str) -> None:
        """This worker cannot start: the supervisor says why (one line) and stops the others."""
        self.send("error " + " ".join(message.split()))

    def loaded(self) -> bool:
        """Tells the supervisor that the models are loaded and waits until every worker's are
        ('go'); False when the supervisor is gone."""
        self.send("loaded")
        buf = b""
        while b"\n" not in buf:
            try:
                chunk = self.sock.recv(64)
            except OSError:
                return False
            if not chunk:
                return False
            buf += chunk
        return buf.startswith(b"go")

    def ready(self, loop) -> None:
        """Tells the supervisor that this worker takes requests; from then on the worker stops
        (as on SIGTERM) when the supervisor goes away."""
        self.send("ready")
        self.sock.setblocking(False)
        loop.add_reader(self.sock.fileno(), self._readable, loop)

    def _readable(self, loop) -> None:
        try:
            data = self.sock.recv(64)
        except (BlockingIOError, InterruptedError):
            return
        except OSError:
            data = b""
        if not data:
            loop.remove_reader(self.sock.fileno())
            print(f"kiln serve: {self.role} {self.index}: the supervising process is gone; "
                  "stopping", file=sys.stderr, flush=True)
            os.kill(os.getpid(), signal.SIGTERM)


@functools.lru_cache(maxsize=None)
def _families() -> dict:
    """kiln's metric families as prometheus_client metrics (multiprocess mode: the values live
    in PROMETHEUS_MULTIPROC_DIR), the names and help of serving.StatsCollector's."""
    from prometheus_client import Counter, Gauge

    def counter(name, doc, labels=("model",)):
        return Counter(name, doc, list(labels), registry=None)

    return {
        "requests": counter("kiln_requests", "Inference requests taken"),
        "inferences": counter("kiln_inferences", "Engine inferences run"),
        "batched_requests": counter("kiln_batched_requests",
                                    "Requests that shared an inference with others"),
        "largest_batch": Gauge("kiln_largest_batch", "Samples in the largest inference so far",
                               ["model"], registry=None, multiprocess_mode="max"),
        "samples": counter("kiln_samples", "Samples the requests brought"),
        "padded_samples": counter("kiln_padded_samples", "Samples added by --pad-batches"),
        "batch": counter("kiln_batch_inferences", "Inferences run per batch size (padded)",
                         ("model", "batch")),
        "device": counter("kiln_device_inferences", "Inferences run per device",
                          ("model", "device")),
        "worker_requests": counter("kiln_worker_requests",
                                   "Inference requests taken by each worker process",
                                   ("model", "worker")),
    }


class SharedStats(Stats):
    """A worker's batcher counters, also counted into prometheus_client's files, which /metrics
    sums over the workers (scrape). Counted on the event loop, as Stats is."""

    def __init__(self, model: str, worker: Optional[int]):
        super().__init__()
        f = _families()
        self._model = model
        self._counters = {k: f[k].labels(model) for k in (
            "requests", "inferences", "batched_requests", "samples", "padded_samples")}
        self._largest = f["largest_batch"].labels(model)
        # worker None: a batcher process of --batcher device, whose requests the front ends
        # count (RemoteBatcher)
        self._worker = f["worker_requests"].labels(model, str(worker)) if worker is not None \
            else None
        self._per_batch: dict = {}
        self._per_device: dict = {}

    def declare_devices(self, labels) -> None:
        """Every device of the batcher shows on /metrics, with 0 until it runs an inference."""
        for d in labels:
            self._device(d)

    def _device(self, label: str):
        child = self._per_device.get(label)
        if child is None:
            child = self._per_device[label] = _families()["device"].labels(self._model, label)
        return child

    def took_request(self) -> None:
        super().took_request()
        if self._worker is not None:
            self._counters["requests"].inc()
            self._worker.inc()

    def count(self, batches: list, run_batch: Optional[int] = None, device: str = "0") -> None:
        largest = self.largest_batch
        super().count(batches, run_batch, device)
        total = sum(batches)
        run = run_batch or total
        c = self._counters
        c["inferences"].inc()
        c["samples"].inc(total)
        if run > total:
            c["padded_samples"].inc(run - total)
        if len(batches) > 1:
            c["batched_requests"].inc(len(batches))
        if self.largest_batch > largest:
            self._largest.set(self.largest_batch)
        child = self._per_batch.get(run)
        if child is None:
            child = self._per_batch[run] = _families()["batch"].labels(self._model, str(run))
        child.inc()
        self._device(device).inc()


# ---- --batcher device: the front ends forward requests to one batcher process per device -------
FRAME = struct.Struct("<I")  # each message: its header's length, the header (pickle), raw bytes
ALIGN = 64                   # tensors in a front end's shared memory start at multiples of this
ARENA_BYTES = 256 << 20      # a front end's shared memory per batcher (address space; pages are
                             # used only as requests fill them, lowest offsets first)
RECONNECT_S = 0.5            # how soon a front end tries a batcher again after a failure
BATCHER_STOP_S = 10.0        # how long a stopping batcher lets its inferences finish


class BatcherGone(RuntimeError):
    """The batcher process a request went to stopped before it answered (a 500)."""


def _aligned(n: int) -> int:
    return (max(n, 1) + ALIGN - 1) // ALIGN * ALIGN


def _frame(header) -> bytes:
    h = pickle.dumps(header, protocol=5)
    return FRAME.pack(len(h)) + h


class Arena:
    """A front end's shared memory for request tensors, one per connection to a batcher: an
    anonymous memfd (no name in /dev/shm, so no process that dies, however it dies, leaves one
    behind; the memory goes once the last process holding it closes it), mapped here and, by
    its descriptor sent on the connection (SCM_RIGHTS), in the batcher process. Blocks are
    64-byte aligned, first fit (the lowest offsets are reused, so the pages touched stay about
    what the requests in flight need), freed blocks merged. Used from the event loop only."""

    def __init__(self, size: int):
        self.size = size
        self.fd = os.memfd_create("kiln-serve-requests", os.MFD_CLOEXEC)
        try:
            os.ftruncate(self.fd, size)
            self.mm = mmap.mmap(self.fd, size)
        except OSError:
            os.close(self.fd)
            raise
        self._free = [(0, size)]  # (offset, size), sorted, never touching

    def alloc(self, n: int) -> Optional[tuple]:
        """(offset, size) of a block of at least n bytes, or None when none is free."""
        n = _aligned(n)
        for i, (off, size) in enumerate(self._free):
            if size >= n:
                if size == n:
                    del self._free[i]
                else:
                    self._free[i] = (off + n, size - n)
                return off, n
        return None

    def free(self, block: tuple) -> None:
        off, n = block
        i = bisect.bisect(self._free, (off, 0))
        if i < len(self._free) and off + n == self._free[i][0]:  # merge with the next
            n += self._free[i][1]
            del self._free[i]
        if i > 0 and self._free[i - 1][0] + self._free[i - 1][1] == off:  # with the previous
            off, n = self._free[i - 1][0], self._free[i - 1][1] + n
            del self._free[i - 1]
            i -= 1
        self._free.insert(i, (off, n))

    def free_bytes(self) -> int:
        return sum(n for _, n in self._free)

    def close(self) -> None:
        if self.fd >= 0:
            os.close(self.fd)
            self.fd = -1


@dataclass
class TensorMeta:
    """An engine input or output as a front end knows it (kiln.TensorInfo's fields)."""
    name: str
    dtype: str
    shape: list


class EngineInfo:
    """What a front end of `kiln serve --batcher device` knows of a model's engine, from its
    batcher process: inputs, outputs, profile (what check_request, batch_limit and the model
    metadata read). It loads no engine and touches no GPU."""

    def __init__(self, meta: dict):
        self.inputs = [TensorMeta(*t) for t in meta["inputs"]]
        self.outputs = [TensorMeta(*t) for t in meta["outputs"]]
        self.profile = meta["profile"]
        self.backend = meta["backend"]
        self.device = None


def model_meta(engine, batcher) -> dict:
    """A batcher process's description of one model, for the front ends (EngineInfo)."""
    return {"inputs": [(t.name, t.dtype, list(t.shape)) for t in engine.inputs],
            "outputs": [(t.name, t.dtype, list(t.shape)) for t in engine.outputs],
            "profile": dict(engine.profile), "backend": engine.backend,
            "max_batch": batcher.max_batch, "pad_sizes": list(batcher.pad_sizes),
            "devices": list(batcher.devices)}


def _recv_exactly(sock: socket.socket, n: int) -> bytes:
    buf = b""
    while len(buf) < n:
        chunk = sock.recv(n - len(buf))
        if not chunk:
            raise ConnectionError("the connection closed during the handshake")
        buf += chunk
    return buf


def _recv_frame(sock: socket.socket):
    (n,) = FRAME.unpack(_recv_exactly(sock, FRAME.size))
    return pickle.loads(_recv_exactly(sock, n))


class BatcherLink:
    """A front end's connection to one batcher process: requests go out as a header (request
    id, model, each input's name, type, shape and place in the Arena, or its bytes after the
    header when the arena has no room) and come back as a header and the outputs' bytes.
    Connected at start (connect(), blocking); on the event loop from the first request on; a
    batcher that goes away fails the requests waiting on it (BatcherGone) and is connected
    again at a later request (RECONNECT_S apart)."""

    def __init__(self, path: str, worker: int, arena_bytes: int = ARENA_BYTES):
        self.path, self.worker, self.arena_bytes = path, worker, arena_bytes
        self.sock: Optional[socket.socket] = None
        self.arena: Optional[Arena] = None
        self.models: dict = {}
        self.label = path
        self.reader = self.writer = None
        self.pending: dict = {}  # request id -> (future, arena block or None)
        self.in_flight = 0       # samples sent and not yet answered
        self.next_id = 0
        self.retry_at = 0.0
        self._task = None
        self._connecting = None

    def connect(self, timeout: float = 30.0) -> None:
        """Connects and hands the batcher this connection's shared memory (blocking); reads
        its models. OSError/ConnectionError when it cannot."""
        sock = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        arena = None
        try:
            sock.settimeout(timeout)
            sock.connect(self.path)
            arena = Arena(self.arena_bytes)
            socket.send_fds(sock, [_frame({"worker": self.worker, "arena": arena.size})],
                            [arena.fd])
            reply = _recv_frame(sock)
        except BaseException:
            sock.close()
            if arena is not None:
                arena.close()
            raise
        arena.close()  # the mapping stays; the batcher has its own descriptor
        sock.settimeout(None)
        sock.setblocking(False)
        self.sock, self.arena = sock, arena
        self.models, self.label = reply["models"], reply["device"]

    def usable(self, now: float) -> bool:
        return self.writer is not None or now >= self.retry_at

    async def _ensure(self) -> None:
        if self.writer is not None:
            return
        if self._connecting is None:  # one connection attempt at a time; the others wait for it
            self._connecting = asyncio.ensure_future(self._open())
        connecting = self._connecting
        try:
            await asyncio.shield(connecting)
        finally:
            if self._connecting is connecting and connecting.done():
                self._connecting = None

    async def _open(self) -> None:
        loop = asyncio.get_running_loop()
        if self.sock is None:
            if loop.time() < self.retry_at:
                raise BatcherGone(f"the batcher process of {self.label} is not reachable")
            try:
                await loop.run_in_executor(None, self.connect, 5.0)
            except (OSError, ConnectionError, EOFError, pickle.UnpicklingError) as e:
                self.retry_at = loop.time() + RECONNECT_S
                raise BatcherGone(f"the batcher process of {self.label} is not reachable "
                                  f"({e})") from None
        self.reader, self.writer = await asyncio.open_unix_connection(sock=self.sock)
        self._task = asyncio.ensure_future(self._read_loop())

    async def _read_loop(self) -> None:
        reader = self.reader
        why = "it closed the connection"
        try:
            while True:
                (n,) = FRAME.unpack(await reader.readexactly(FRAME.size))
                rid, status, payload = pickle.loads(await reader.readexactly(n))
                if status == 0:
                    out = {}
                    for name, dtype, shape, nbytes in payload:
                        data = await reader.readexactly(nbytes) if nbytes else b""
                        out[name] = np.frombuffer(data, dtype).reshape(shape)
                    result = out
                elif status == 1:
                    result = RequestError(payload)
                else:
                    result = RuntimeError(payload)
                fut, block = self.pending.pop(rid, (None, None))
                if block is not None:
                    self.arena.free(block)
                if fut is not None and not fut.done():
                    if isinstance(result, Exception):
                        fut.set_exception(result)
                    else:
                        fut.set_result(result)
        except asyncio.IncompleteReadError:
            pass
        except Exception as e:  # noqa: BLE001 - a broken stream: every waiting request fails
            why = f"{type(e).__name__}: {e}"
        self._broken(why)

    def _broken(self, why: str) -> None:
        """The batcher went away: every request waiting on it fails; the connection, and its
        shared memory (used by no one once the batcher has gone too), are dropped."""
        pending, self.pending = self.pending, {}
        for fut, _ in pending.values():
            if not fut.done():
                fut.set_exception(BatcherGone(
                    f"the batcher process of {self.label} stopped before it answered ({why})"))
        if self.writer is not None:
            self.writer.close()
        self.reader = self.writer = self.sock = None
        self.arena = None
        self.in_flight = 0
        loop = asyncio.get_running_loop()
        self.retry_at = loop.time() + RECONNECT_S

    async def infer(self, model: str, feeds: dict, samples: int) -> dict:
        await self._ensure()
        arena = self.arena
        total = sum(_aligned(a.nbytes) for a in feeds.values())
        block = arena.alloc(total) if total else None
        inputs, extra = [], []
        off = block[0] if block is not None else -1
        for name, a in feeds.items():
            if block is not None:
                np.copyto(np.ndarray(a.shape, a.dtype, buffer=arena.mm, offset=off), a)
                inputs.append((name, a.dtype.str, a.shape, off, a.nbytes))
                off += _aligned(a.nbytes)
            else:  # no room: its bytes follow the header
                a = np.ascontiguousarray(a)
                inputs.append((name, a.dtype.str, a.shape, -1, a.nbytes))
                if a.nbytes:
                    extra.append(memoryview(a).cast("B"))
        rid = self.next_id = self.next_id + 1
        fut = asyncio.get_running_loop().create_future()
        self.pending[rid] = (fut, block)
        self.writer.write(_frame((rid, model, inputs)))
        for b in extra:
            self.writer.write(b)
        self.in_flight += samples
        try:
            if extra:
                await self.writer.drain()
            return await fut
        finally:
            self.in_flight = max(0, self.in_flight - samples)


class RemoteBatcher:
    """A model's batcher as a front end of `kiln serve --batcher device` sees it: requests are
    counted here (kiln_requests_total, kiln_worker_requests_total) and forwarded to the batcher
    process with the fewest of this front end's samples in flight, which joins them with every
    other front end's (Batcher) and counts the inferences."""

    def __init__(self, name: str, links: list, meta: dict, stats: Stats):
        self.name, self.links, self.stats = name, links, stats
        self.max_batch = meta["max_batch"]
        self.pad_sizes = meta["pad_sizes"]
        self.devices = [d for link in links for d in link.models[name]["devices"]]

    async def infer(self, feeds: dict) -> dict:
        self.stats.took_request()
        samples = next(iter(feeds.values())).shape[0] if feeds and self.max_batch > 1 else 1
        now = asyncio.get_running_loop().time()
        link = min(self.links, key=lambda x: (not x.usable(now), x.in_flight))
        return await link.infer(self.name, feeds, samples)

    def warm(self, sample=None) -> int:
        return 0  # the batcher processes warm their contexts

    def close(self) -> None:
        pass


def connect_batchers(paths: list, worker: int) -> list:
    """A front end's links to every batcher process (blocking; OSError when one cannot be
    reached)."""
    links = []
    for p in paths:
        link = BatcherLink(p, worker)
        link.connect()
        links.append(link)
    return links


class BatcherService:
    """A batcher process's side: listens on a Unix socket; each front end's connection brings
    its shared memory (an Arena's descriptor) and then requests, which run through the model's
    Batcher (joined with every other front end's) and are answered on the same connection."""

    def __init__(self, batchers: dict, meta: dict, label: str):
        self.batchers, self.meta, self.label = batchers, meta, label
        self.tasks: set = set()        # inferences running
        self.readers: set = set()      # a task per front end's connection
        self.connections: set = set()  # their writers
        self.listener: Optional[socket.socket] = None

    def listen(self, path: str) -> None:
        if os.path.exists(path):
            os.unlink(path)  # a predecessor's
        s = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        s.bind(path)
        s.listen(128)
        s.setblocking(False)
        self.listener = s

    def _handshake(self, conn: socket.socket):
        conn.settimeout(10.0)
        head, fds, _, _ = socket.recv_fds(conn, FRAME.size, 1)
        if len(head) < FRAME.size:
            head += _recv_exactly(conn, FRAME.size - len(head))
        if len(fds) != 1:
            for fd in fds:
                os.close(fd)
            raise ConnectionError("a front end connected without its shared memory")
        try:
            (n,) = FRAME.unpack(head)
            hello = pickle.loads(_recv_exactly(conn, n))
            mm = mmap.mmap(fds[0], int(hello["arena"]))
        finally:
            os.close(fds[0])
        conn.sendall(_frame({"models": self.meta, "device": self.label}))
        conn.settimeout(None)
        conn.setblocking(False)
        return mm

    async def serve(self, stop: asyncio.Event) -> None:
        accept = asyncio.ensure_future(self._accept_loop())
        await stop.wait()
        accept.cancel()
        self.listener.close()
        # Front ends stop first (the supervisor stops them before the batchers): let the
        # inferences still running answer, for at most BATCHER_STOP_S.
        if self.tasks:
            await asyncio.wait(list(self.tasks), timeout=BATCHER_STOP_S)
        for w in list(self.connections):
            w.close()
        for t in list(self.readers):
            t.cancel()
        if self.readers:
            await asyncio.wait(list(self.readers), timeout=1.0)

    async def _accept_loop(self) -> None:
        loop = asyncio.get_running_loop()
        while True:
            conn, _ = await loop.sock_accept(self.listener)
            t = asyncio.ensure_future(self._connection(conn))
            self.readers.add(t)
            t.add_done_callback(self.readers.discard)

    async def _connection(self, conn: socket.socket) -> None:
        loop = asyncio.get_running_loop()
        try:
            mm = await loop.run_in_executor(None, self._handshake, conn)
            reader, writer = await asyncio.open_unix_connection(sock=conn)
        except (OSError, ConnectionError, EOFError, ValueError, pickle.UnpicklingError) as e:
            _say(f"kiln serve: batcher {self.label}: a front end's connection failed: {e}")
            conn.close()
            return
        out = _Answers(writer)
        self.connections.add(writer)
        try:
            while True:
                try:
                    (n,) = FRAME.unpack(await reader.readexactly(FRAME.size))
                    rid, model, inputs = pickle.loads(await reader.readexactly(n))
                    feeds = {}
                    for name, dtype, shape, off, nbytes in inputs:
                        if off >= 0:
                            feeds[name] = np.ndarray(shape, np.dtype(dtype), buffer=mm,
                                                     offset=off)
                        else:
                            data = await reader.readexactly(nbytes) if nbytes else b""
                            feeds[name] = np.frombuffer(data, dtype).reshape(shape)
                except (asyncio.IncompleteReadError, OSError):
                    break  # the front end is gone
                except Exception as e:  # noqa: BLE001 - a message that makes no sense
                    _say(f"kiln serve: batcher {self.label}: dropped a front end's connection "
                         f"({type(e).__name__}: {e})")
                    break
                batcher = self.batchers.get(model)
                if batcher is None:
                    out.add(rid, RequestError(f"model '{model}' is not served by this batcher"))
                    continue
                try:
                    # no task per request: the answer goes from the future's callback
                    fut = batcher.submit(feeds)
                except Exception as e:  # noqa: BLE001 - answered as the request's error
                    out.add(rid, e)
                    continue
                del feeds
                self.tasks.add(fut)
                fut.add_done_callback(functools.partial(self._answer, out, rid))
        finally:
            self.connections.discard(writer)
            writer.close()
            # `mm` goes when the last inference holding a view of it ends (nothing closes it
            # under them); the front end's memory goes with it.
            del mm

    def _answer(self, out: "_Answers", rid: int, fut: asyncio.Future) -> None:
        self.tasks.discard(fut)
        if fut.cancelled():
            out.add(rid, RuntimeError("the inference was cancelled"))
        elif fut.exception() is not None:
            out.add(rid, fut.exception())
        else:
            out.add(rid, fut.result())


class _Answers:
    """A batcher's answers on one front end's connection: the answers that come in one turn of
    the event loop (a batch's requests are answered together) go out in one write."""

    BIG = 65536  # an output over this many bytes is written by itself, not copied into a join

    def __init__(self, writer):
        self.writer = writer
        self.parts: list = []
        self.scheduled = False

    def add(self, rid: int, result) -> None:
        if isinstance(result, RequestError):
            self.parts.append(_frame((rid, 1, str(result))))
        elif isinstance(result, BaseException):
            self.parts.append(_frame((rid, 2, f"{type(result).__name__}: {result}")))
        else:
            arrays = [(n, np.ascontiguousarray(v)) for n, v in result.items()]
            self.parts.append(_frame((rid, 0, [(n, a.dtype.str, a.shape, a.nbytes)
                                               for n, a in arrays])))
            self.parts.extend(memoryview(a).cast("B") for _, a in arrays if a.nbytes)
        if not self.scheduled:
            self.scheduled = True
            asyncio.get_running_loop().call_soon(self.flush)

    def flush(self) -> None:
        self.scheduled = False
        parts, self.parts = self.parts, []
        if self.writer.is_closing():
            return
        small: list = []
        for p in parts:
            if len(p) > self.BIG:
                if small:
                    self.writer.write(b"".join(small))
                    small = []
                self.writer.write(p)
            else:
                small.append(p)
        if small:
            self.writer.write(b"".join(small))


def run_batcher(args, link: "WorkerLink", models: dict) -> int:
    """A batcher process of `kiln serve --batcher device` (args: kiln serve's parsed options):
    loads every model on its device, listens on link.path, tells the supervisor, and serves
    until SIGTERM or SIGINT (or the supervisor going away). The exit status."""
    from kiln.serving import load_batcher

    batchers, meta, errors = {}, {}, []
    for name, path in models.items():
        try:
            engine, batcher, runs = load_batcher(
                name, path, link.devices, args.contexts, args.max_batch_size,
                args.batch_delay_ms / 1000.0, args.pad_batches, not args.no_warmup,
                SharedStats(name, worker=None))
        except Exception as e:  # noqa: BLE001 - one model that fails to load is reported
            errors.append(f"model {name}: {e}")
            continue
        batchers[name], meta[name] = batcher, model_meta(engine, batcher)
    if not batchers:
        link.error("no model could be loaded (" + "; ".join(errors) + ")")
        return 1
    if link.index == 0:  # the models the others could not load either
        for e in errors:
            print(f"kiln: error: {e}", file=sys.stderr)
    labels = sorted({d for m in meta.values() for d in m["devices"]})
    label = ",".join(labels) or "cpu"
    service = BatcherService(batchers, meta, label)
    try:
        service.listen(link.path)
    except OSError as e:
        link.error(f"batcher {label}: cannot listen on {link.path}: {e.strerror or e}")
        return 1
    if not link.loaded():
        return 1

    async def main() -> None:
        from kiln.serving import background

        loop = asyncio.get_running_loop()
        stop = asyncio.Event()
        for sig in (signal.SIGTERM, signal.SIGINT):
            loop.add_signal_handler(sig, stop.set)
        # KILN_SERVE_MEMORY_LOG's lines and KILN_SERVE_TRIM_S's trims, as in a worker
        tasks = [loop.create_task(c) for c in background()]
        link.ready(loop)
        try:
            await service.serve(stop)
        finally:
            for t in tasks:
                t.cancel()

    try:
        asyncio.run(main())
    finally:
        for b in batchers.values():
            b.close()
    return 0


def scrape(accept: Optional[str]) -> tuple:
    """/metrics summed over the workers: (body, content type)."""
    from prometheus_client import CollectorRegistry, exposition, multiprocess

    registry = CollectorRegistry()
    multiprocess.MultiProcessCollector(registry)
    encoder, content_type = exposition.choose_encoder(accept)
    return encoder(registry), content_type


# ---- the supervisor -----------------------------------------------------------------------------
@dataclass
class _Worker:
    index: int
    proc: subprocess.Popen
    sock: socket.socket
    role: str = "worker"     # or "batcher"
    state: str = "starting"  # starting -> loaded -> ready
    message: str = ""        # its 'error' line
    buf: bytes = b""
    restarted: bool = False
    started: float = field(default_factory=time.monotonic)


def _describe(rc: int) -> str:
    if rc < 0:
        try:
            return f"signal {signal.Signals(-rc).name}"
        except ValueError:
            return f"signal {-rc}"
    return f"status {rc}"


def _say(line: str) -> None:
    print(line, file=sys.stderr, flush=True)


class Supervisor:
    """Starts `count` workers of `kiln serve ARGV` (worker i on devices_of[i]) and watches
    them; run() returns the exit status. With `batcher_devices` (--batcher device), first one
    batcher process per entry (its devices), each listening on a Unix socket in `run_dir`, and
    the workers (front ends, no devices) once every batcher is ready."""

    def __init__(self, argv: list, count: int, devices_of: list, metrics_dir: str, where: str,
                 batcher_devices: Optional[list] = None, run_dir: str = "", shm_dir: str = ""):
        self.argv, self.count, self.devices_of = list(argv), count, devices_of
        self.metrics_dir, self.where = metrics_dir, where
        self.shm_dir = shm_dir  # the workers' shared memory registrations (kiln.shm)
        self.batcher_devices = batcher_devices or []
        self.batcher_paths = [os.path.join(run_dir, f"batcher{i}.sock")
                              for i in range(len(self.batcher_devices))]
        self.workers: dict = {}  # (role, index) -> _Worker
        self.selector = selectors.DefaultSelector()
        self.released: set = set()  # roles whose every process was loaded and told 'go'
        self.all_ready = False
        self.deaths: list = []
        self.stop_requested: Optional[int] = None
        self.force = False

    def _group(self, role: str) -> list:
        return [w for w in self.workers.values() if w.role == role]

    def _counts(self, role: str) -> int:
        return self.count if role == "worker" else len(self.batcher_devices)

    # -- signals
    def _on_signal(self, signum, frame) -> None:
        if self.stop_requested is None:
            self.stop_requested = signum
        else:
            self.force = True

    def install_signal_handlers(self) -> None:
        for sig in (signal.SIGINT, signal.SIGTERM, signal.SIGQUIT):
            signal.signal(sig, self._on_signal)

    # -- workers
    def spawn(self, index: int, restarted: bool = False, role: str = "worker") -> None:
        ours, theirs = socket.socketpair()
        package_root = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
        env = dict(os.environ, PROMETHEUS_MULTIPROC_DIR=self.metrics_dir,
                   PYTHONPATH=os.pathsep.join(p for p in (package_root,
                                                          os.environ.get("PYTHONPATH")) if p))
        if self.shm_dir:
            env[SHM_DIR_ENV] = self.shm_dir
        link = {"index": index, "count": self._counts(role), "fd": theirs.fileno(),
                "role": role}
        if role == "batcher":
            link.update(devices=self.batcher_devices[index], path=self.batcher_paths[index])
        else:
            link.update(devices=self.devices_of[index], batchers=self.batcher_paths)
        env[WORKER_ENV] = json.dumps(link)
        # Its own session: a terminal's Ctrl-C reaches the supervisor only, which stops them.
        proc = subprocess.Popen([sys.executable, "-m", "kiln.cli", "serve", *self.argv], env=env,
                                pass_fds=(theirs.fileno(),), stdin=subprocess.DEVNULL,
                                start_new_session=True)
        theirs.close()
        w = _Worker(index, proc, ours, role=role, restarted=restarted)
        self.workers[(role, index)] = w
        self.selector.register(ours, selectors.EVENT_READ, w)

    def _read(self, w: _Worker) -> None:
        try:
            data = w.sock.recv(4096)
        except OSError:
            data = b""
        if not data:
            self.selector.unregister(w.sock)
            return
        w.buf += data
        while b"\n" in w.buf:
            line, w.buf = w.buf.split(b"\n", 1)
            self._message(w, line.decode(errors="replace"))

    def _message(self, w: _Worker, line: str) -> None:
        group = self._group(w.role)
        if line == "loaded":
            w.state = "loaded"
            if w.role in self.released:
                self._go(w)
            elif len(group) == self._counts(w.role) and all(x.state == "loaded" for x in group):
                self.released.add(w.role)
                for x in group:
                    self._go(x)
        elif line == "ready":
            w.state = "ready"
            if w.restarted:
                _say(f"kiln serve: {w.role} {w.index} (pid {w.proc.pid}) restarted")
            elif w.role == "batcher":
                if not self._group("worker") and all(x.state == "ready" for x in group):
                    for i in range(self.count):  # the front ends, once every batcher serves
                        self.spawn(i)
            elif not self.all_ready and all(x.state == "ready" for x in group):
                self.all_ready = True
                pids = ", ".join(str(x.proc.pid) for x in group)
                batchers = self._group("batcher")
                extra = (f"; {len(batchers)} batcher processes (pids "
                         f"{', '.join(str(x.proc.pid) for x in batchers)}) on "
                         f"{', '.join(str(d) if d else 'cpu' for d in self.batcher_devices)}"
                         if batchers else "")
                _say(f"kiln serve: {self.count} workers ready (pids {pids}){extra}, "
                     f"{self.where}")
        elif line.startswith("error "):
            w.message = line[len("error "):]

    def _go(self, w: _Worker) -> None:
        try:
            w.sock.sendall(b"go\n")
        except OSError:
            pass

    def _drain(self, w: _Worker) -> None:
        """Reads what an exited worker still said (its error line)."""
        w.sock.setblocking(False)
        try:
            while True:
                data = w.sock.recv(4096)
                if not data:
                    break
                w.buf += data
        except OSError:
            pass
        while b"\n" in w.buf:
            line, w.buf = w.buf.split(b"\n", 1)
            if line.startswith(b"error "):
                w.message = line[len(b"error "):].decode(errors="replace")

    def _close(self, w: _Worker) -> None:
        try:
            self.selector.unregister(w.sock)
        except (KeyError, ValueError):
            pass
        w.sock.close()

    def _exited(self, w: _Worker, rc: int) -> Optional[int]:
        """A worker exited (not asked to): None when it is restarted, else the exit status."""
        self._drain(w)
        self._close(w)
        if w.state != "ready":
            what = (f"{w.role} {w.index} of {self._counts(w.role)}"
                    f"{', restarted,' if w.restarted else ''}")
            if w.message:
                _say(f"kiln: error: {w.message} ({what} did not start; stopped the others)")
            else:
                _say(f"kiln: error: {what} exited with {_describe(rc)} while starting (its "
                     "output is above); stopped the others")
            return 1
        now = time.monotonic()
        self.deaths = [t for t in self.deaths if now - t < RESTART_WINDOW_S] + [now]
        if len(self.deaths) > MAX_RESTARTS:
            _say(f"kiln: error: {w.role} {w.index} (pid {w.proc.pid}) exited with "
                 f"{_describe(rc)}, the {len(self.deaths)}th process to die within "
                 f"{RESTART_WINDOW_S:.0f} s; stopping")
            return 1
        _say(f"kiln serve: {w.role} {w.index} (pid {w.proc.pid}) exited with {_describe(rc)}; "
             "restarting it")
        self.spawn(w.index, restarted=True, role=w.role)
        return None

    def _stop_group(self, group: list, deadline: float) -> None:
        for w in group:
            if w.proc.poll() is None:
                try:
                    w.proc.send_signal(signal.SIGTERM)
                except ProcessLookupError:
                    pass
        while any(w.proc.poll() is None for w in group):
            if self.force or time.monotonic() > deadline:
                for w in group:
                    if w.proc.poll() is None:
                        _say(f"kiln serve: {w.role} {w.index} (pid {w.proc.pid}) did not stop; "
                             "killing it")
                        w.proc.kill()
                for w in group:
                    w.proc.wait()
                break
            time.sleep(0.05)

    def stop(self) -> None:
        """SIGTERM to every worker alive, then (once they are gone: their requests in flight
        are answered) to every batcher; waits STOP_GRACE_S in all (or until a second signal)
        and kills those left."""
        deadline = time.monotonic() + STOP_GRACE_S
        self._stop_group(self._group("worker"), deadline)
        self._stop_group(self._group("batcher"), deadline)
        for w in self.workers.values():
            self._close(w)

    def run(self) -> int:
        self.install_signal_handlers()
        try:
            if self.batcher_devices:
                for i in range(len(self.batcher_devices)):
                    self.spawn(i, role="batcher")
            else:
                for i in range(self.count):
                    self.spawn(i)
            while self.stop_requested is None:
                for key, _ in self.selector.select(timeout=0.2):
                    self._read(key.data)
                for w in list(self.workers.values()):
                    rc = w.proc.poll()
                    if rc is not None and self.stop_requested is None and \
                            self.workers.get((w.role, w.index)) is w:
                        status = self._exited(w, rc)
                        if status is not None:
                            self.stop()
                            return status
            name = signal.Signals(self.stop_requested).name
            batchers = len(self.batcher_devices)
            _say(f"kiln serve: {name}: stopping {self.count} workers"
                 f"{f' and {batchers} batchers' if batchers else ''}")
            self.stop()
            return 0
        except BaseException:
            self.stop()
            raise


def supervise(argv: list, host: str, http_port: int, grpc_port: Optional[int],
              devices_of: list, batcher_devices: Optional[list] = None) -> int:
    """`kiln serve ARGV` as len(devices_of) workers on `host`:`http_port` (REST) and
    `grpc_port` (gRPC; None without): the exit status. `batcher_devices` (--batcher device):
    one batcher process per entry, on those devices, which the workers forward to."""
    if not hasattr(socket, "SO_REUSEPORT"):
        _say("kiln: error: --workers needs SO_REUSEPORT, which this system does not have")
        return 1
    for port, what, flag in ((http_port, "REST", "--http-port"),
                             (grpc_port, "gRPC", "--grpc-port")):
        if port is None:
            continue
        if port == 0:
            _say(f"kiln: error: --workers needs a fixed {flag} (0 would give each worker another)")
            return 1
        problem = port_problem(host, port, what)
        if problem:
            _say(f"kiln: error: {problem}")
            return 1
    where = f"REST on {host}:{http_port}" + (f", gRPC on {host}:{grpc_port}" if grpc_port else "")
    metrics_dir = tempfile.mkdtemp(prefix="kiln-serve-metrics-")
    run_dir = tempfile.mkdtemp(prefix="kiln-serve-run-") if batcher_devices else ""
    # Shared memory regions registered through any worker, for every worker (kiln.shm's
    # records; the folder outlives a worker that dies, so its successor sees them too).
    shm_dir = tempfile.mkdtemp(prefix="kiln-serve-shm-")
    try:
        return Supervisor(argv, len(devices_of), devices_of, metrics_dir, where,
                          batcher_devices, run_dir, shm_dir).run()
    finally:
        shutil.rmtree(metrics_dir, ignore_errors=True)
        shutil.rmtree(shm_dir, ignore_errors=True)
        if run_dir:
            shutil.rmtree(run_dir, ignore_errors=True)
