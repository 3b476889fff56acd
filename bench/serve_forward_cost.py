#!/usr/bin/env python3
"""What it would cost to let `kiln serve --workers N`'s front-end processes feed one batcher
process per GPU (so that batches join every worker's requests, not each worker's own), measured
without any server: a front end copies each request's tensor (ResNet-50's, 602 KB) into a slot
of a shared-memory region and sends (request id, slot) on a Unix socket; the batcher process's
asyncio loop reads it, takes a view of the slot (what its batcher would join from), answers
with a small output on the socket. Prints the CPU per request on each side and the rate.
(The gRPC front end itself costs ~1.2-1.4 ms a request on this 2-core machine: serve_cost.py.)

  python3 bench/serve_forward_cost.py [--requests 20000] [--in-flight 8] [--kiln]

--kiln measures the hand-off `kiln serve --batcher device` makes (kiln.serve_workers: a front
end's BatcherLink, its Arena of shared memory, the batcher process's BatcherService), with a
batcher that answers at once (no Batcher, no engine): PYTHONPATH=build/python.
"""
from __future__ import annotations

import argparse
import asyncio
import os
import resource
import socket
import struct
import sys
import time

import numpy as np

SAMPLE = (3, 224, 224)


def cpu() -> float:
    r = resource.getrusage(resource.RUSAGE_SELF)
    return r.ru_utime + r.ru_stime


def batcher_side(sock, name: str, slots: int, n: int) -> None:
    from multiprocessing import shared_memory

    shm = shared_memory.SharedMemory(name=name)
    buf = np.ndarray((slots,) + SAMPLE, np.float32, shm.buf)

    async def main():
        r, w = await asyncio.open_connection(sock=sock)
        c0 = cpu()
        for _ in range(n):
            rid, slot = struct.unpack("II", await r.readexactly(8))
            x = buf[slot:slot + 1]        # a view: what the batcher would join from
            y = x[:, :, 0, 0].copy()      # a stand-in for the model's (small) output
            w.write(struct.pack("II", rid, slot) + y.tobytes())
        await w.drain()
        print(f"batcher process: {(cpu() - c0) / n * 1e6:.1f} us CPU per forwarded request "
              "(its event loop)", flush=True)
        del x
    asyncio.run(main())
    del buf
    shm.close()


class _Echo:
    """A batcher that answers at once with a small output (a pixel of each sample)."""
    max_batch = 64

    def submit(self, feeds):
        a = next(iter(feeds.values()))
        fut = asyncio.get_running_loop().create_future()
        fut.set_result({"output": np.ascontiguousarray(a[:, :, 0, 0])})
        return fut


def kiln_batcher_side(path: str, n: int) -> None:
    from kiln.serve_workers import BatcherService

    service = BatcherService({"m": _Echo()}, {"m": {}}, "cpu")
    service.listen(path)

    async def main():
        import signal
        stop = asyncio.Event()
        asyncio.get_running_loop().add_signal_handler(signal.SIGTERM, stop.set)
        c0 = cpu()
        await service.serve(stop)
        print(f"batcher process: {(cpu() - c0) / n * 1e6:.1f} us CPU per forwarded request "
              "(BatcherService's event loop)", flush=True)
    asyncio.run(main())


def kiln_main(n: int, in_flight: int) -> int:
    import signal
    import tempfile

    from kiln.serve_workers import BatcherLink

    path = os.path.join(tempfile.mkdtemp(prefix="kiln-forward-"), "b.sock")
    pid = os.fork()
    if pid == 0:
        try:
            kiln_batcher_side(path, n)
        finally:
            os._exit(0)
    deadline = time.time() + 30
    while not os.path.exists(path) and time.time() < deadline:
        time.sleep(0.02)
    link = BatcherLink(path, 0)
    link.connect()
    x = np.random.default_rng(0).standard_normal((1,) + SAMPLE).astype(np.float32)

    async def run():
        left = [n]

        async def client():
            while left[0] > 0:
                left[0] -= 1
                await link.infer("m", {"input": x}, 1)
        c0, t0 = cpu(), time.perf_counter()
        await asyncio.gather(*[client() for _ in range(in_flight)])
        dt = time.perf_counter() - t0
        print(f"front end: {(cpu() - c0) / n * 1e6:.1f} us CPU per request (the copy into its "
              f"Arena, the send, the answer), {n / dt:.0f} requests/s with {in_flight} in flight",
              flush=True)
    asyncio.run(run())
    os.kill(pid, signal.SIGTERM)
    os.waitpid(pid, 0)
    os.unlink(path)
    os.rmdir(os.path.dirname(path))
    return 0


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--requests", type=int, default=20000)
    ap.add_argument("--in-flight", type=int, default=8)
    ap.add_argument("--kiln", action="store_true",
                    help="kiln serve --batcher device's own hand-off (kiln.serve_workers)")
    a = ap.parse_args()
    if a.kiln:
        return kiln_main(a.requests, max(1, a.in_flight))
    from multiprocessing import shared_memory

    n, slots = a.requests, max(1, a.in_flight)
    nbytes = int(np.prod(SAMPLE)) * 4
    ours, theirs = socket.socketpair()
    shm = shared_memory.SharedMemory(create=True, size=nbytes * slots)
    try:
        pid = os.fork()
        if pid == 0:
            ours.close()
            try:
                batcher_side(theirs, shm.name, slots, n)
            finally:
                os._exit(0)
        theirs.close()
        buf = np.ndarray((slots,) + SAMPLE, np.float32, shm.buf)
        x = np.random.default_rng(0).standard_normal(SAMPLE).astype(np.float32)
        reader = ours.makefile("rb")
        c0, t0 = cpu(), time.perf_counter()
        for i in range(min(slots, n)):
            buf[i] = x
            ours.sendall(struct.pack("II", i, i))
        for i in range(slots, n + slots):
            _, slot = struct.unpack("II", reader.read(8))
            reader.read(12)  # the output: 3 floats
            if i < n:
                buf[slot] = x
                ours.sendall(struct.pack("II", i, slot))
        dt = time.perf_counter() - t0
        print(f"front end: {(cpu() - c0) / n * 1e6:.1f} us CPU per request (the copy into the "
              f"slot, the send, the answer), {n / dt:.0f} requests/s with {slots} in flight")
        os.waitpid(pid, 0)
        reader.close()
        del buf
    finally:
        ours.close()
        shm.close()
        shm.unlink()
    return 0


if __name__ == "__main__":
    sys.exit(main())
