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

/metrics: prometheus_client's multiprocess mode (PROMETHEUS_MULTIPROC_DIR, a temporary folder
of the supervisor's): each worker counts into files there (SharedStats), and a scrape, whichever
worker answers it, sums them over every worker that ran (a restarted worker's predecessor
included): kiln's families as with one process, plus kiln_worker_requests_total{model,worker},
and KServe's histograms; per-process families (process_*, python_*) are not shown.
"""
from __future__ import annotations

import functools
import json
import os
import selectors
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import time
from dataclasses import dataclass, field
from typing import Optional

from kiln.batching import Stats

WORKER_ENV = "KILN_SERVE_WORKER"
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

    @classmethod
    def from_env(cls) -> Optional["WorkerLink"]:
        """The link of a worker (KILN_SERVE_WORKER, which this takes out of the environment),
        else None."""
        text = os.environ.pop(WORKER_ENV, None)
        if not text:
            return None
        d = json.loads(text)
        return cls(d["index"], d["count"], list(d["devices"]), socket.socket(fileno=d["fd"]))

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
            print(f"kiln serve: worker {self.index}: the supervising process is gone; stopping",
                  file=sys.stderr, flush=True)
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

    def __init__(self, model: str, worker: int):
        super().__init__()
        f = _families()
        self._model = model
        self._counters = {k: f[k].labels(model) for k in (
            "requests", "inferences", "batched_requests", "samples", "padded_samples")}
        self._largest = f["largest_batch"].labels(model)
        self._worker = f["worker_requests"].labels(model, str(worker))
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
    them; run() returns the exit status."""

    def __init__(self, argv: list, count: int, devices_of: list, metrics_dir: str, where: str):
        self.argv, self.count, self.devices_of = list(argv), count, devices_of
        self.metrics_dir, self.where = metrics_dir, where
        self.workers: dict = {}
        self.selector = selectors.DefaultSelector()
        self.released = False  # every worker was loaded and told 'go'
        self.all_ready = False
        self.deaths: list = []
        self.stop_requested: Optional[int] = None
        self.force = False

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
    def spawn(self, index: int, restarted: bool = False) -> None:
        ours, theirs = socket.socketpair()
        package_root = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
        env = dict(os.environ, PROMETHEUS_MULTIPROC_DIR=self.metrics_dir,
                   PYTHONPATH=os.pathsep.join(p for p in (package_root,
                                                          os.environ.get("PYTHONPATH")) if p))
        env[WORKER_ENV] = json.dumps({"index": index, "count": self.count,
                                      "devices": self.devices_of[index], "fd": theirs.fileno()})
        # Its own session: a terminal's Ctrl-C reaches the supervisor only, which stops them.
        proc = subprocess.Popen([sys.executable, "-m", "kiln.cli", "serve", *self.argv], env=env,
                                pass_fds=(theirs.fileno(),), stdin=subprocess.DEVNULL,
                                start_new_session=True)
        theirs.close()
        w = _Worker(index, proc, ours, restarted=restarted)
        self.workers[index] = w
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
        if line == "loaded":
            w.state = "loaded"
            if self.released:
                self._go(w)
            elif all(x.state == "loaded" for x in self.workers.values()):
                self.released = True
                for x in self.workers.values():
                    self._go(x)
        elif line == "ready":
            w.state = "ready"
            if w.restarted:
                _say(f"kiln serve: worker {w.index} (pid {w.proc.pid}) restarted")
            elif not self.all_ready and all(x.state == "ready" for x in self.workers.values()):
                self.all_ready = True
                pids = ", ".join(str(x.proc.pid) for x in self.workers.values())
                _say(f"kiln serve: {self.count} workers ready (pids {pids}), {self.where}")
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
            what = f"worker {w.index} of {self.count}{', restarted,' if w.restarted else ''}"
            if w.message:
                _say(f"kiln: error: {w.message} ({what} did not start; stopped the others)")
            else:
                _say(f"kiln: error: {what} exited with {_describe(rc)} while starting (its "
                     "output is above); stopped the others")
            return 1
        now = time.monotonic()
        self.deaths = [t for t in self.deaths if now - t < RESTART_WINDOW_S] + [now]
        if len(self.deaths) > MAX_RESTARTS:
            _say(f"kiln: error: worker {w.index} (pid {w.proc.pid}) exited with {_describe(rc)}, "
                 f"the {len(self.deaths)}th worker to die within {RESTART_WINDOW_S:.0f} s; "
                 "stopping")
            return 1
        _say(f"kiln serve: worker {w.index} (pid {w.proc.pid}) exited with {_describe(rc)}; "
             "restarting it")
        self.spawn(w.index, restarted=True)
        return None

    def stop(self) -> None:
        """SIGTERM to every worker alive; waits STOP_GRACE_S (or until a second signal) and
        kills those left."""
        for w in self.workers.values():
            if w.proc.poll() is None:
                try:
                    w.proc.send_signal(signal.SIGTERM)
                except ProcessLookupError:
                    pass
        deadline = time.monotonic() + STOP_GRACE_S
        while any(w.proc.poll() is None for w in self.workers.values()):
            if self.force or time.monotonic() > deadline:
                for w in self.workers.values():
                    if w.proc.poll() is None:
                        _say(f"kiln serve: worker {w.index} (pid {w.proc.pid}) did not stop; "
                             "killing it")
                        w.proc.kill()
                for w in self.workers.values():
                    w.proc.wait()
                break
            time.sleep(0.05)
        for w in self.workers.values():
            self._close(w)

    def run(self) -> int:
        self.install_signal_handlers()
        try:
            for i in range(self.count):
                self.spawn(i)
            while self.stop_requested is None:
                for key, _ in self.selector.select(timeout=0.2):
                    self._read(key.data)
                for w in list(self.workers.values()):
                    rc = w.proc.poll()
                    if rc is not None and self.stop_requested is None:
                        status = self._exited(w, rc)
                        if status is not None:
                            self.stop()
                            return status
            name = signal.Signals(self.stop_requested).name
            _say(f"kiln serve: {name}: stopping {self.count} workers")
            self.stop()
            return 0
        except BaseException:
            self.stop()
            raise


def supervise(argv: list, host: str, http_port: int, grpc_port: Optional[int],
              devices_of: list) -> int:
    """`kiln serve ARGV` as len(devices_of) workers on `host`:`http_port` (REST) and
    `grpc_port` (gRPC; None without): the exit status."""
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
    try:
        return Supervisor(argv, len(devices_of), devices_of, metrics_dir, where).run()
    finally:
        shutil.rmtree(metrics_dir, ignore_errors=True)
