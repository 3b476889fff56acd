"""Dynamic batching over a pool of execution contexts, on one or several GPUs, for the servers
(kiln.serving, kiln.ray_serve), and the Open Inference Protocol's element types."""
from __future__ import annotations

import asyncio
import os
import queue
import threading
import weakref
from dataclasses import dataclass, field
from typing import Optional, Sequence, Union

import numpy as np

from kiln.engine import Engine

# Open Inference Protocol (v2) datatypes per kiln element type.
V2_DATATYPES = {
    "bool": "BOOL", "uint8": "UINT8", "uint16": "UINT16", "uint32": "UINT32", "uint64": "UINT64",
    "int8": "INT8", "int16": "INT16", "int32": "INT32", "int64": "INT64", "float16": "FP16",
    "float32": "FP32", "float64": "FP64", "bfloat16": "BF16",
}


class RequestError(ValueError):
    """A request the model cannot take (unknown input, wrong datatype or shape): a 400."""


def batch_limit(engine: Engine, cap: Optional[int]) -> int:
    """The largest batch one inference may take: every input's and output's first dimension
    must be dynamic; the profile's maximum of it (at most `cap`), else `cap` (default 32); 1
    when it is fixed."""
    limit = cap or 32
    if any(not t.shape or isinstance(t.shape[0], int) for t in engine.outputs):
        return 1
    for t in engine.inputs:
        if not t.shape or isinstance(t.shape[0], int):
            return 1
        prof = engine.profile.get(t.name)
        if prof:
            limit = min(limit, int(prof["max"][0])) if cap else int(prof["max"][0])
    return max(limit, 1)


def _numpy_dtype(name: str) -> Optional[np.dtype]:
    """NumPy's dtype of a kiln element type, or None where NumPy has none (bfloat16)."""
    try:
        return np.dtype(name)
    except TypeError:
        return None


def _input_specs(engine: Engine) -> tuple:
    """(names, {name: (dtype name, NumPy dtype or None, shape with -1 for dynamic dims, profile
    min, profile max)}) of the engine's inputs, made once per engine (Engine.inputs builds its
    list anew on every call; a server checks every request against it)."""
    specs = getattr(engine, "_serve_input_specs", None)
    if specs is None:
        info = {}
        for t in engine.inputs:
            prof = engine.profile.get(t.name)
            info[t.name] = (t.dtype, _numpy_dtype(t.dtype),
                            [d if isinstance(d, int) else -1 for d in t.shape],
                            list(prof["min"]) if prof else None,
                            list(prof["max"]) if prof else None)
        specs = (list(info), info)
        try:
            engine._serve_input_specs = specs
        except AttributeError:  # an engine-like object that takes no attributes
            pass
    return specs


def check_request(engine: Engine, feeds: dict[str, np.ndarray], batching: bool) -> int:
    """Checks a request's names, element types and shapes; returns its batch (first dim)."""
    names, want = _input_specs(engine)
    for name in feeds:
        if name not in want:
            raise RequestError(f"unknown input '{name}' (the model's inputs: {', '.join(names)})")
    batch = None
    for name, (dtype, np_dtype, shape, lo, hi) in want.items():
        a = feeds.get(name)
        if a is None:
            raise RequestError(f"input '{name}' is missing")
        # dtype.name is a Python property of NumPy's (about 5 us, twice a request); the
        # decoders' arrays carry NumPy's own dtype objects, so identity answers first.
        if a.dtype is not np_dtype and a.dtype.name != dtype:
            raise RequestError(f"input '{name}': datatype {V2_DATATYPES.get(a.dtype.name, a.dtype.name)}, "
                               f"the model takes {V2_DATATYPES.get(dtype, dtype)}")
        got = a.shape
        if len(got) != len(shape) or any(w >= 0 and g != w for g, w in zip(got, shape)):
            raise RequestError(f"input '{name}': shape {list(got)}, the model takes {shape}")
        if lo is not None and any(g < mn or g > mx for g, mn, mx in zip(got, lo, hi)):
            raise RequestError(f"input '{name}': shape {list(got)} is outside the model's range "
                               f"(min {lo}, max {hi})")
        if batching:
            if batch is not None and got[0] != batch:
                raise RequestError(f"input '{name}': batch {got[0]}, other inputs have {batch}")
            batch = got[0]
    return batch or 1


@dataclass
class Stats:
    """Counters of a batcher: requests taken, inferences run, and the requests per inference."""
    requests: int = 0
    inferences: int = 0
    batched_requests: int = 0  # requests that shared an inference with others
    largest_batch: int = 0     # samples in the largest inference
    samples: int = 0           # samples the requests brought (padding not counted)
    padded_samples: int = 0    # samples added by padding (--pad-batches)
    per_inference: dict = field(default_factory=dict)  # requests per inference -> count
    per_batch: dict = field(default_factory=dict)      # samples per inference (padded) -> count
    per_device: dict = field(default_factory=dict)     # device label -> inferences

    def took_request(self) -> None:
        """One request taken."""
        self.requests += 1

    def count(self, batches: list[int], run_batch: Optional[int] = None,
              device: str = "0") -> None:
        """One inference of len(batches) requests with these batch sizes, run at `run_batch`
        samples (their sum unless padded) on `device`."""
        total = sum(batches)
        run = run_batch or total
        self.inferences += 1
        self.samples += total
        self.padded_samples += run - total
        self.largest_batch = max(self.largest_batch, total)
        self.per_inference[len(batches)] = self.per_inference.get(len(batches), 0) + 1
        self.per_batch[run] = self.per_batch.get(run, 0) + 1
        self.per_device[device] = self.per_device.get(device, 0) + 1
        if len(batches) > 1:
            self.batched_requests += len(batches)


def join(requests: list[dict], pad_to: int = 0, into=None) -> dict:
    """Requests' inputs joined along the first dimension (one request: as it is, unless `into`
    is given), in one copy; with `pad_to` above their total the rows after it repeat the first
    row (padding whose outputs are dropped: a real sample, so it computes what any sample does).
    `into(name, rows, like)`: where to write each input, an array of `rows` rows shaped and
    typed as `like` past the first dimension (Batcher: a context's own buffers, _Buffers);
    default new arrays. With `into` the padding rows are
    not written: they hold what the buffer held (zeros, or earlier requests' samples), which
    saves a copy per padding row."""
    if not requests:
        return {}
    if len(requests) == 1 and into is None:
        first = requests[0]
        total = next(iter(first.values())).shape[0] if first else 0
        if pad_to <= total:
            return first
    else:
        total = sum(next(iter(r.values())).shape[0] for r in requests)
    rows = max(pad_to, total)
    out = {}
    for n, first in requests[0].items():
        if into is None:
            a = np.empty((rows,) + first.shape[1:], dtype=first.dtype)
        else:
            a = into(n, rows, first)
        if len(requests) == 1:
            a[:total] = first
        else:
            np.concatenate([r[n] for r in requests], axis=0, out=a[:total])
        if rows > total and into is None:
            a[total:] = first[:1]
        out[n] = a
    return out


class _Buffers:
    """A context's input buffers: per input name, element type and shape past the first
    dimension, one array of max_batch rows whose first rows each inference uses, so a joined
    batch costs one copy per request and no allocation (a fresh 602 KB-a-sample array was an
    mmap, page faults and a munmap per batch). At most `keep` kinds (sequence lengths, say) are
    kept, the least recently used dropped. New buffers are zeros, so padding rows never hold
    uninitialised memory."""

    def __init__(self, max_batch: int, keep: int = 8):
        self.max_batch, self.keep = max_batch, keep
        self._arrays: dict = {}

    def __call__(self, name: str, rows: int, like: np.ndarray) -> np.ndarray:
        key = (name, like.shape[1:], like.dtype.str)
        a = self._arrays.pop(key, None)
        if a is None or a.shape[0] < rows:
            a = np.zeros((max(rows, self.max_batch),) + like.shape[1:], dtype=like.dtype)
            while len(self._arrays) >= self.keep:
                self._arrays.pop(next(iter(self._arrays)))
        self._arrays[key] = a  # the most recently used last
        return a[:rows]


def parse_pad_sizes(text: Optional[str], max_batch: int) -> list[int]:
    """`--pad-batches`' batch sizes: 'pow2' (or '' / None) for 1, 2, 4, ... up to max_batch, or
    a comma-separated list; sizes over max_batch are dropped and max_batch is always one, so
    every batch pads to some size. ValueError for anything else."""
    if text is None or text.strip().lower() in ("", "pow2"):
        sizes = []
        b = 1
        while b < max_batch:
            sizes.append(b)
            b *= 2
    else:
        try:
            sizes = [int(t) for t in text.split(",") if t.strip()]
        except ValueError:
            raise ValueError(f"--pad-batches takes batch sizes such as 1,2,4,8 or 'pow2', "
                             f"not '{text}'") from None
        if not sizes or any(b < 1 for b in sizes):
            raise ValueError(f"--pad-batches: batch sizes are whole numbers >= 1, not '{text}'")
    return sorted({b for b in sizes if b < max_batch} | {max_batch})


def pad_target(total: int, sizes: Sequence[int]) -> int:
    """The smallest of `sizes` (sorted) that holds `total` samples; `total` itself when none
    does or no sizes are given."""
    for b in sizes:
        if b >= total:
            return b
    return total


def parse_devices(text: Optional[str], visible: int) -> list[int]:
    """`--devices`: 'all' or None for every visible GPU (none: [] and the engines run where
    they were built for, the CPU backend included), else a comma-separated list of distinct
    device indices below `visible`. ValueError says what is wrong."""
    if text is None or text.strip().lower() == "all":
        return list(range(visible))
    try:
        devices = [int(t) for t in text.split(",") if t.strip()]
    except ValueError:
        raise ValueError(f"--devices takes GPU indices such as 0,1 or 'all', not '{text}'") from None
    if not devices:
        raise ValueError("--devices: no device given")
    if len(set(devices)) != len(devices):
        raise ValueError(f"--devices: a device is named twice in '{text}'")
    for d in devices:
        if d < 0 or d >= visible:
            raise ValueError(f"--devices: GPU {d} does not exist (this machine shows {visible}"
                             f"{': 0..' + str(visible - 1) if visible else ''})")
    return devices


def split(out: dict, batches: list[int]) -> list[dict]:
    """The outputs of a joined inference, split back per request (views of them, as np.split's,
    by slicing: np.split and np.cumsum cost about 20 us a batch on the event loop)."""
    if len(batches) == 1:
        return [out]
    parts, start = [], 0
    for b in batches:
        end = start + b
        parts.append({n: v[start:end] for n, v in out.items()})
        start = end
    return parts


class _Group:
    """Requests waiting to be joined (same shapes past the first dimension): (feeds, batch,
    future) in arrival order, and their samples."""
    __slots__ = ("items", "samples")

    def __init__(self):
        self.items: list = []
        self.samples = 0


class Batcher:
    """Runs requests on `contexts` execution contexts of each engine, off the event loop (in
    threads; kiln releases the GIL while it works). Requests that arrive within `max_delay_s`
    of each other, with equal shapes past the first dimension, are joined along it into one
    inference of up to `max_batch` samples, and the outputs are split back.

    `engine` may be a list: the same engine file loaded once per GPU (kiln.load(path,
    device=d)). Their contexts form one pool, interleaved by device, and each inference takes
    whichever context is free first, so a GPU that finishes sooner gets the next batch.

    `pad_sizes` (sorted batch sizes, the largest max_batch): a joined batch runs at the smallest
    of them that holds it, the rows past it repeating its first; the engine then sees a few
    shapes, each replayed as a CUDA graph (the executor keeps the graphs of several shapes,
    KILN_GRAPH_SHAPES), where unpadded batches take every size from 1 to max_batch.

    Each context has its own input buffers of max_batch rows (_Buffers): a batch is joined into
    them in the inference thread (not on the event loop), one copy per request; a request that
    runs alone and unpadded runs from its own arrays. (The cuda executor copies host inputs into
    its own device buffers, whose addresses its CUDA graphs hold, so the host addresses need
    not repeat.)

    `stats`: where the counters go (default a new Stats; `kiln serve --workers` passes one that
    also counts into files that /metrics sums over the worker processes)."""

    def __init__(self, engine: Union[Engine, Sequence[Engine]], contexts: int = 2,
                 max_batch: Optional[int] = None, max_delay_s: float = 0.002,
                 pad_sizes: Optional[Sequence[int]] = None, stats: Optional[Stats] = None):
        engines = list(engine) if isinstance(engine, (list, tuple)) else [engine]
        self.engine = engines[0]
        self.engines = engines
        self.max_batch = batch_limit(self.engine, max_batch)
        self.max_delay_s = max_delay_s
        self.pad_sizes = sorted({min(b, self.max_batch) for b in pad_sizes}) if (
            pad_sizes and self.max_batch > 1) else []
        self.stats = stats if stats is not None else Stats()
        self.devices = [device_label(e, i) for i, e in enumerate(engines)]
        self._pool: queue.SimpleQueue = queue.SimpleQueue()
        self._contexts = []
        per = max(contexts, 1)
        for _ in range(per):
            for label, e in zip(self.devices, engines):
                ctx = e.create_context()
                self._contexts.append((label, ctx, _Buffers(self.max_batch)))
                self._pool.put(self._contexts[-1])
        total = per * len(engines)
        # The inference threads, one a context, take (loop, take, batches, run) jobs from
        # _jobs (None: stop); a ThreadPoolExecutor's submit (a Future, a work item, a lock and
        # its thread count checked per batch) took 4% of the event loop's time under load.
        # Only the jobs hold the batcher (until run), so one that is dropped unclosed is
        # collected and its threads stopped (_stop_threads), as an executor's were; at exit
        # they finish the inferences handed over before the interpreter goes (weakref.finalize
        # runs at exit), as an executor's did.
        self._jobs: queue.SimpleQueue = queue.SimpleQueue()
        self._closed = False
        self._threads = [threading.Thread(target=_serve_jobs, args=(self._jobs,),
                                          name=f"kiln-infer_{i}", daemon=True)
                         for i in range(total)]
        for t in self._threads:
            t.start()
        self._stop = weakref.finalize(self, _stop_threads, self._jobs, self._threads)
        self._pending: dict[tuple, list] = {}
        self._out_names = [t.name for t in self.engine.outputs]

    def _run(self, requests: list[dict], rows: int) -> tuple[dict, str]:
        """In an inference thread: takes a free context, joins `requests` (padded to `rows`)
        into its buffers and runs them."""
        item = self._pool.get()
        label, ctx, buffers = item
        try:
            first = requests[0]
            if len(requests) == 1 and (not first or rows == next(iter(first.values())).shape[0]):
                feeds = requests[0]  # as it came (no copy)
            else:
                feeds = join(requests, pad_to=rows, into=buffers)
            return ctx.run(feeds), label
        finally:
            self._pool.put(item)

    def warm(self, sample: Optional[dict] = None) -> int:
        """Runs every context at the batch sizes the server will form before it takes requests:
        max_batch first (the largest staging buffers and activation arena are then allocated
        once, so later batches keep their addresses and graphs), then with padding each padded
        size, largest first, three times (the first run is layer by layer, the second captures
        a CUDA graph, the third replays it). `sample`: one request's inputs (batch 1), default
        zeros at the profile's opt shape past the first dimension. Returns the runs made."""
        if sample is None:
            sample = zero_sample(self.engine)
        if sample is None:
            return 0
        sizes = [self.max_batch] if self.max_batch > 1 else [1]
        repeat = 1
        if self.pad_sizes:
            sizes = sorted(set(self.pad_sizes) | set(sizes), reverse=True)
            repeat = 3
        runs = 0
        for _, ctx, buffers in self._contexts:
            for b in sizes:
                feeds = join([sample], pad_to=b, into=buffers)
                for _ in range(repeat):
                    ctx.run(feeds)
                    runs += 1
        return runs

    async def infer(self, feeds: dict[str, np.ndarray]) -> dict[str, np.ndarray]:
        """Runs one request (checked by check_request), batched with others where it can be."""
        return await self.submit(feeds)

    def submit(self, feeds: dict[str, np.ndarray]) -> asyncio.Future:
        """infer() without a coroutine of its own (on the event loop): the future of the
        request's outputs (a batcher process of `kiln serve --batcher device` answers each
        request from its future's callback)."""
        self.stats.took_request()
        loop = asyncio.get_running_loop()
        fut = loop.create_future()
        batch = next(iter(feeds.values())).shape[0] if feeds and self.max_batch > 1 else 0
        if not batch or batch >= self.max_batch:
            self._dispatch(loop, [(feeds, batch or 1, fut)])
            return fut
        if len(feeds) == 1:
            ((n, a),) = feeds.items()
            key = (n, a.shape[1:], a.dtype.str)
        else:
            key = tuple((n, a.shape[1:], a.dtype.str) for n, a in sorted(feeds.items()))
        group = self._pending.get(key)
        if group is None:
            group = self._pending[key] = _Group()
            loop.call_later(self.max_delay_s, self._flush, key)
        group.items.append((feeds, batch, fut))
        group.samples += batch
        if group.samples >= self.max_batch:
            self._flush(key)
        return fut

    def _flush(self, key) -> None:
        group = self._pending.pop(key, None)
        if not group:
            return
        # Takes requests in arrival order up to max_batch samples; the rest wait for the next.
        items = group.items
        if group.samples <= self.max_batch:
            take, items = items, []
        else:
            total, i = 0, 0
            while i < len(items) and total + items[i][1] <= self.max_batch:
                total += items[i][1]
                i += 1
            take, items = items[:i], items[i:]
        loop = asyncio.get_running_loop()
        if items:
            rest = self._pending[key] = _Group()
            rest.items = items
            rest.samples = sum(b for _, b, _ in items)
            loop.call_soon(self._flush, key)
        self._dispatch(loop, take)

    def _dispatch(self, loop, take: list) -> None:
        """One inference for the requests `take` ((feeds, batch, future) each), joined along
        the first dimension (and padded to a pad size), handed to an inference thread, which
        answers them through one call on the event loop (_deliver). No task, semaphore or
        future per inference: the threads are as many as the contexts, so an inference waits
        for a free context in the queue of jobs."""
        batches = [b for _, b, _ in take]
        total = sum(batches)
        run = pad_target(total, self.pad_sizes) if self.pad_sizes else total
        if self._closed:
            self._deliver(take, batches, run, None, None, RuntimeError(_CLOSED))
        else:
            self._jobs.put((self, loop, take, batches, run))

    def _work(self, loop, take: list, batches: list, run: int) -> None:
        """In an inference thread: runs the requests `take` and hands the outputs (or the
        error) back to the event loop."""
        out = device = error = None
        try:
            out, device = self._run([f for f, _, _ in take], run)
        except BaseException as e:  # noqa: BLE001 - every waiting request gets the error
            error = e
        try:
            loop.call_soon_threadsafe(self._deliver, take, batches, run, out, device, error)
        except RuntimeError:  # the event loop is closed: nobody waits for these
            pass

    def _deliver(self, take: list, batches: list, run: int, out, device, error) -> None:
        """On the event loop: counts one inference and answers each of its requests."""
        if error is None:
            try:
                self.stats.count(batches, run, device)
                total = sum(batches)
                if run > total:
                    out = {n: v[:total] for n, v in out.items()}
                outs = split(out, batches)
            except Exception as e:  # noqa: BLE001 - as an error of the inference
                error = e
        if error is not None:
            for _, _, fut in take:
                if not fut.done():
                    fut.set_exception(error)
            return
        for (_, _, fut), o in zip(take, outs):
            if not fut.done():
                fut.set_result(o)

    def close(self) -> None:
        """Stops the inference threads once the inferences handed over have run (their
        requests answered); later requests get a RuntimeError."""
        if self._closed:
            return
        self._closed = True
        self._stop()
        while True:  # handed over by another thread as this one closed: answered, not lost
            try:
                job = self._jobs.get_nowait()
            except queue.Empty:
                return
            if job is not None:
                _, loop, take, batches, run = job
                try:
                    loop.call_soon_threadsafe(self._deliver, take, batches, run, None, None,
                                              RuntimeError(_CLOSED))
                except RuntimeError:  # the event loop is closed: nobody waits for these
                    pass


_CLOSED = "the batcher is closed: no new inferences"


def _serve_jobs(jobs: queue.SimpleQueue) -> None:
    """A Batcher's inference thread: runs the jobs _dispatch hands over ((batcher, loop, take,
    batches, run) each) until told to stop."""
    while True:
        job = jobs.get()
        if job is None:
            return
        job[0]._work(*job[1:])
        del job  # the batcher, which a job alone keeps


def _stop_threads(jobs: queue.SimpleQueue, threads: list) -> None:
    """Stops a Batcher's inference threads once the jobs handed over before have run."""
    for _ in threads:
        jobs.put(None)
    for t in threads:
        if t is not threading.current_thread():
            t.join()


def device_label(engine: Engine, index: int) -> str:
    """How /metrics names the device of the index-th engine: 'cuda:N' for an engine loaded
    onto GPU N, 'cpu' for a cpu engine, else 'cuda' (the current device)."""
    if getattr(engine, "backend", "cpu") != "cuda":
        return "cpu" if index == 0 else f"cpu{index}"
    d = getattr(engine, "device", None)
    return f"cuda:{d}" if d is not None else "cuda"


def zero_sample(engine: Engine) -> Optional[dict]:
    """A batch-1 request of zeros at the profile's opt shape (fixed dims as declared), or None
    when a dynamic dimension has no profile to take it from."""
    feeds = {}
    for t in engine.inputs:
        prof = engine.profile.get(t.name)
        shape = []
        for i, d in enumerate(t.shape):
            if isinstance(d, int):
                shape.append(d)
            elif prof:
                shape.append(int(prof["opt"][i]))
            else:
                return None
        if shape and not isinstance(t.shape[0], int):
            shape[0] = 1
        try:
            feeds[t.name] = np.zeros(shape, dtype=np.dtype(t.dtype))
        except TypeError:  # an element type NumPy has no name for (bfloat16)
            return None
    return feeds


GPU_WAIT_MODES = ("block", "spin", "yield", "auto")


def set_gpu_wait(mode: str) -> int:
    """How this process's threads wait for the GPUs (a CUDA context's scheduling flag): 'block'
    (cudaDeviceScheduleBlockingSync: the waiting thread sleeps until the GPU is done, as
    trtexec waits by default), 'spin' (it spins on its core: trtexec's --useSpinWait), 'yield'
    (spins, yielding) or 'auto' (CUDA's default: spin while the process has fewer CUDA contexts
    than the machine has cores; a server's threads waiting for inferences then hold a core
    each). It must come before this process loads an engine or makes a context on a GPU (a
    KilnError says which device's context exists already, with another mode); an unknown mode
    is a KilnValueError. Returns the number of GPUs set: 0 without a GPU or CUDA, where it does
    nothing (the cpu backend never waits for a device)."""
    from kiln import _kiln

    return _kiln.set_gpu_wait(mode)


def default_contexts() -> int:
    """Execution contexts per model: $KILN_SERVE_CONTEXTS, else 2."""
    return int(os.environ.get("KILN_SERVE_CONTEXTS", "2"))
