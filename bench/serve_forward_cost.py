#!/usr/bin/env python3
"""What it would cost to let `kiln serve --workers N`'s front-end processes feed one batcher
process per GPU (so that batches join every worker's requests, not each worker's own), measured
without any server: a front end copies each request's tensor (ResNet-50's, 602 KB) into a slot
of a shared-memory region and sends (request id, slot) on a Unix socket; the batcher process's
asyncio loop reads it, takes a view of the slot (what its batcher would join from), answers
with a small output on the socket. Prints the CPU per request on each side and the rate.
(The gRPC front end itself costs ~1.2-1.4 ms a request on this 2-core machine: serve_cost.py.)

  python3 bench/serve_forward_cost.py [--requests 20000] [--in-flight 8]
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


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--requests", type=int, default=20000)
    ap.add_argument("--in-flight", type=int, default=8)
    a = ap.parse_args()
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
