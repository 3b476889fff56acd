#!/usr/bin/env python3
"""Seed corpora for the libFuzzer harnesses (tests/fuzz/README.md), generated, not committed.

  tests/fuzz/make_corpus.py --kiln build-fuzz/kiln --out build-fuzz/fuzz-corpus

writes OUT/onnx/ (every model.onnx of the ONNX backend test data, libonnx-testdata, as
scripts/conformance.py finds it, plus scripts/models/small_models.py's models and the control-flow
models of tests/models/run_control_flow_tests.py) and OUT/engine/
(engines that `kiln build --backend cpu` makes of the small models, at -O0 and -O2, and of a
spread of the conformance models).
Seeds larger than --max-bytes are left out (they slow the fuzzers down and add little).
"""
from __future__ import annotations

import argparse
import hashlib
import os
import shutil
import subprocess
import sys
import tempfile

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
sys.path.insert(0, os.path.join(ROOT, "scripts"))
sys.path.insert(0, os.path.join(ROOT, "scripts", "models"))
sys.path.insert(0, os.path.join(ROOT, "tests", "models"))


def add(out_dir: str, data: bytes, max_bytes: int) -> bool:
    if len(data) > max_bytes:
        return False
    name = hashlib.sha1(data).hexdigest()
    with open(os.path.join(out_dir, name), "wb") as f:
        f.write(data)
    return True


def _varint(n: int) -> bytes:
    out = bytearray()
    while n >= 0x80:
        out.append(n & 0x7F | 0x80)
        n >>= 7
    return bytes(out + bytes([n]))


def _field(number: int, payload: bytes) -> bytes:
    return _varint(number << 3 | 2) + _varint(len(payload)) + payload


def serve_seeds(out_dir: str) -> int:
    """Seeds of fuzz_serve_requests: REST bodies (mode byte 0, or 2 with a two-byte JSON length
    and binary tensors after it) and gRPC ModelInferRequests (mode byte 1), protobuf written by
    hand (its field numbers: src/serve/grpc_predict_v2.proto)."""
    import json

    os.makedirs(out_dir, exist_ok=True)
    x = [0.5] * 4
    rest = [{"inputs": [{"name": "x", "datatype": "FP32", "shape": [1, 4], "data": x}]},
            {"id": "r", "parameters": {"binary_data_output": True},
             "inputs": [{"name": "x", "datatype": "INT8", "shape": [2, 2], "data": [[1, 2], [3, 4]]}],
             "outputs": [{"name": "y", "parameters": {"binary_data": False}}]},
            {"inputs": [{"name": "x", "datatype": "FP32", "shape": [1, 4], "parameters": {
                "shared_memory_region": "r", "shared_memory_byte_size": 16}}]}]
    seeds = [b"\0" + json.dumps(r).encode() for r in rest]
    header = json.dumps({"inputs": [{"name": "x", "datatype": "FP32", "shape": [1, 4],
                                     "parameters": {"binary_data_size": 16}}]}).encode()
    seeds.append(b"\2" + len(header).to_bytes(2, "little") + header + bytes(16))
    shape = _field(3, b"".join(_varint(d) for d in (1, 4)))
    tensor = _field(1, b"x") + _field(2, b"FP32") + shape
    seeds.append(b"\1" + _field(1, b"twice") + _field(5, tensor) + _field(7, bytes(16)))
    contents = _field(6, b"".join(bytes(4) for _ in range(4)))  # fp32_contents, packed
    seeds.append(b"\1" + _field(1, b"twice") + _field(5, tensor + _field(5, contents)))
    return sum(add(out_dir, s, 1 << 16) for s in seeds)


def build_engine(kiln: str, onnx_path: str, engine: str, extra: list[str]) -> bool:
    cmd = [kiln, "build", "--onnx", onnx_path, "--save-engine", engine, "--backend", "cpu", *extra]
    r = subprocess.run(cmd, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True)
    return r.returncode == 0 and os.path.exists(engine)


def main() -> int:
    import conformance  # scripts/conformance.py: where the ONNX backend test data lives

    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--kiln", required=True, help="the kiln CLI (builds the engine seeds)")
    ap.add_argument("--out", required=True)
    ap.add_argument("--data", default=None, help="ONNX backend test data (default: as conformance.py)")
    ap.add_argument("--engines-every", type=int, default=12,
                    help="build an engine of every Nth conformance model (0: none)")
    ap.add_argument("--max-bytes", type=int, default=256 * 1024)
    args = ap.parse_args()

    data = args.data or next((d for d in conformance.DATA_DIRS if os.path.isdir(d)), None)
    if not data:
        sys.exit("make_corpus: no ONNX backend test data (install libonnx-testdata)")
    onnx_dir, engine_dir = os.path.join(args.out, "onnx"), os.path.join(args.out, "engine")
    for d in (onnx_dir, engine_dir):
        shutil.rmtree(d, ignore_errors=True)
        os.makedirs(d)

    models = []
    for dirpath, _, files in os.walk(data):
        if "model.onnx" in files:
            models.append(os.path.join(dirpath, "model.onnx"))
    models.sort()
    n_onnx = 0
    for path in models:
        with open(path, "rb") as f:
            n_onnx += add(onnx_dir, f.read(), args.max_bytes)

    import onnx
    import run_control_flow_tests  # If, Loop and Scan in the forms exporters write
    import small_models

    n_engine = 0
    with tempfile.TemporaryDirectory(prefix="kiln-corpus-") as tmp:
        small = []
        for name, fn in {**small_models.MODELS, **run_control_flow_tests.MODELS}.items():
            path = os.path.join(tmp, name + ".onnx")
            onnx.save(fn(), path)
            small.append(path)
            with open(path, "rb") as f:
                n_onnx += add(onnx_dir, f.read(), args.max_bytes)
        jobs = [(p, ["--opt-level", lvl]) for p in small for lvl in ("0", "2")]
        if args.engines_every > 0:
            jobs += [(p, ["--opt-level", "0"]) for p in models[::args.engines_every]]
            jobs += [(p, ["--opt-level", "2"]) for p in models[args.engines_every // 2::args.engines_every]]
        for i, (path, extra) in enumerate(jobs):
            engine = os.path.join(tmp, f"e{i}.kiln")
            if build_engine(args.kiln, path, engine, extra):
                with open(engine, "rb") as f:
                    n_engine += add(engine_dir, f.read(), args.max_bytes)
    n_serve = serve_seeds(os.path.join(args.out, "serve"))
    print(f"make_corpus: {n_onnx} ONNX models in {onnx_dir}, {n_engine} engines in {engine_dir}, "
          f"{n_serve} kiln serve requests in {os.path.join(args.out, 'serve')}")
    return 0 if n_onnx and n_engine else 1


if __name__ == "__main__":
    sys.exit(main())
