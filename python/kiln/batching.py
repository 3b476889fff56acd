"""Dynamic batching over a pool of execution contexts, for the servers (kiln.serving,
kiln.ray_serve), and the Open Inference Protocol's element types."""
from __future__ import annotations

import asyncio
import concurrent.futures
import os
import queue
from dataclasses import dataclass, field
from typing import Optional

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


def check_request(engine: Engine, feeds: dict[str, np.ndarray], batching: bool) -> int:
    """Checks a request's names, element types and shapes; returns its batch (first dim)."""
    want = {t.name: t for t in engine.inputs}
    for name in feeds:
        if name not in want:
            raise RequestError(f"unknown input '{name}' (the model's inputs: {', '.join(want)})")
    batch = None
    for name, t in want.items():
        if name not in feeds:
            raise RequestError(f"input '{name}' is missing")
        a = feeds[name]
        if a.dtype.name != t.dtype:
            raise RequestError(f"input '{name}': datatype {V2_DATATYPES.get(a.dtype.name, a.dtype.name)}, "
                               f"the model takes {V2_DATATYPES.get(t.dtype, t.dtype)}")
        shape = [d if isinstance(d, int) else -1 for d in t.shape]
        if len(a.shape) != len(shape) or any(w >= 0 and g != w for g, w in zip(a.shape, shape)):
            raise RequestError(f"input '{name}': shape {list(a.shape)}, the model takes {shape}")
        prof = engine.profile.get(name)
        if prof and any(g < lo or g > hi for g, lo, hi in zip(a.shape, prof["min"], prof["max"])):
            raise RequestError(f"input '{name}': shape {list(a.shape)} is outside the model's range "
                               f"(min {prof['min']}, max {prof['max']})")
        if batching:
            if batch is not None and a.shape[0] != batch:
                raise RequestError(f"input '{name}': batch {a.shape[0]}, other inputs have {batch}")
            batch = a.shape[0]
    return batch or 1


@dataclass
class Stats:
    """Counters of a batcher: requests taken, inferences run, and the requests per inference."""
    requests: int = 0
    inferences: int = 0
    batched_requests: int = 0  # requests that shared an inference with others
    largest_batch: int = 0     # samples in the largest inference
    per_inference: dict = field(default_factory=dict)  # requests per inference -> count

    def count(self, batches: list[int]) -> None:
        """One inference of len(batches) requests with these batch sizes."""
        self.inferences += 1
        self.largest_batch = max(self.largest_batch, sum(batches))
        self.per_inference[len(batches)] = self.per_inference.get(len(batches), 0) + 1
        if len(batches) > 1:
            self.batched_requests += len(batches)


def join(requests: list[dict]) -> dict:
    """Requests' inputs joined along the first dimension (one request: as it is)."""
    if len(requests) == 1:
        return requests[0]
    return {n: np.concatenate([r[n] for r in requests]) for n in requests[0]}


def split(out: dict, batches: list[int]) -> list[dict]:
    """The outputs of a joined inference, split back per request."""
    if len(batches) == 1:
        return [out]
    parts = {n: np.split(v, np.cumsum(batches)[:-1]) for n, v in out.items()}
    return [{n: parts[n][i] for n in out} for i in range(len(batches))]


class Batcher:
    """Runs requests on `contexts` execution contexts of one engine, off the event loop (in
    threads; kiln releases the GIL while it works). Requests that arrive within `max_delay_s`
    of each other, with equal shapes past the first dimension, are joined along it into one
    inference of up to `max_batch` samples, and the outputs are split back."""

    def __init__(self, engine: Engine, contexts: int = 2, max_batch: Optional[int] = None,
                 max_delay_s: float = 0.002):
        self.engine = engine
        self.max_batch = batch_limit(engine, max_batch)
        self.max_delay_s = max_delay_s
        self.stats = Stats()
        self._pool: queue.SimpleQueue = queue.SimpleQueue()
        for _ in range(max(contexts, 1)):
            self._pool.put(engine.create_context())
        self._threads = concurrent.futures.ThreadPoolExecutor(
            max_workers=max(contexts, 1), thread_name_prefix="kiln-infer")
        self._slots = asyncio.Semaphore(max(contexts, 1))
        self._pending: dict[tuple, list] = {}
        self._out_names = [t.name for t in engine.outputs]

    def _run(self, feeds: dict) -> dict:
        ctx = self._pool.get()
        try:
            return ctx.run(feeds)
        finally:
            self._pool.put(ctx)

    async def infer(self, feeds: dict[str, np.ndarray]) -> dict[str, np.ndarray]:
        """Runs one request (checked by check_request), batched with others where it can be."""
        self.stats.requests += 1
        batch = next(iter(feeds.values())).shape[0] if feeds and self.max_batch > 1 else 0
        if not batch or batch >= self.max_batch:
            return (await self._execute([feeds], [batch or 1]))[0]
        key = tuple((n, a.shape[1:], a.dtype.str) for n, a in sorted(feeds.items()))
        fut = asyncio.get_running_loop().create_future()
        group = self._pending.setdefault(key, [])
        group.append((feeds, batch, fut))
        if sum(b for _, b, _ in group) >= self.max_batch:
            self._flush(key)
        elif len(group) == 1:
            asyncio.get_running_loop().call_later(self.max_delay_s, self._flush, key)
        return await fut

    def _flush(self, key) -> None:
        group = self._pending.pop(key, None)
        if not group:
            return
        # Takes requests in arrival order up to max_batch samples; the rest wait for the next.
        take, total = [], 0
        while group and total + group[0][1] <= self.max_batch:
            item = group.pop(0)
            take.append(item)
            total += item[1]
        if group:
            self._pending[key] = group
            asyncio.get_running_loop().call_soon(self._flush, key)
        asyncio.ensure_future(self._complete(take))

    async def _complete(self, take) -> None:
        try:
            outs = await self._execute([f for f, _, _ in take], [b for _, b, _ in take])
        except Exception as e:  # noqa: BLE001 - every waiting request gets the error
            for _, _, fut in take:
                if not fut.done():
                    fut.set_exception(e)
            return
        for (_, _, fut), out in zip(take, outs):
            if not fut.done():
                fut.set_result(out)

    async def _execute(self, requests: list[dict], batches: list[int]) -> list[dict]:
        """One inference for `requests`, joined along the first dimension; their outputs."""
        async with self._slots:
            out = await asyncio.get_running_loop().run_in_executor(
                self._threads, self._run, join(requests))
        self.stats.count(batches)
        return split(out, batches)

    def close(self) -> None:
        self._threads.shutdown(wait=True)


def default_contexts() -> int:
    """Execution contexts per model: $KILN_SERVE_CONTEXTS, else 2."""
    return int(os.environ.get("KILN_SERVE_CONTEXTS", "2"))
