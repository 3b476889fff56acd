#!/usr/bin/env python3
"""A bounded fuzz driver for `kiln serve`'s request decoding (no network).

Each input is a request body as `kiln serve` receives it, decoded the way the server does
(python/kiln/serving.py behind KServe's ModelServer), by direct calls:

  mode 0, REST JSON: decoded as the server's REST front end does for a kiln model
          (kiln.serving.read_rest_body, decode_rest_request, and when it decodes,
          encode_rest_response), and also as KServe's app would (the body parsed as JSON and
          validated as KServe's v2 InferenceRequest, FastAPI's step: a failure is a 400 from
          serving._malformed_request; then KServe's DataPlane.decode);
  mode 1, REST with the binary-data extension: `Inference-Header-Content-Length: H` and the
          body (JSON header, then raw tensor bytes), both ways as mode 0;
  mode 2, gRPC: a ModelInferRequest message, decoded as the server's ModelInfer does
          (kiln.serving.decode_grpc_request on the message itself), and when it decodes, the
          engine's outputs encoded back (encode_grpc_response, with the outputs it names);

(modes 0 and 1 with the data plane set up as serving.make_server sets up its server's, then
kiln.serving.decode_request) against a real engine (CPU backend, two inputs with a dynamic
batch, float32 and int64), with and without batching. Every input must either decode into feeds
that fit the engine or raise one of the errors the server answers with a 4xx (RequestError,
KServe's InvalidInput, a validation error of the body); any other exception is a finding
(it would be a 500): the driver prints its traceback, writes the input to --artifact-dir and
exits with status 1.

With Atheris installed (`pip install atheris`) the run is coverage-guided over kiln's and
KServe's decoding code, and a custom mutator also edits the JSON structure; libFuzzer's flags
pass through (-runs=N, -max_total_time=S, -seed=S). Without it, a seeded random mutator runs
--runs inputs (or until --max-seconds). Both start from seeds made here (good requests of every
mode) plus any corpus folders given.

  PYTHONPATH=build/python python3 tests/fuzz/fuzz_serving.py -runs=1000000 -max_total_time=3000
  PYTHONPATH=build/python python3 tests/fuzz/fuzz_serving.py --no-atheris --runs 100000 --seed 1
  PYTHONPATH=build/python python3 tests/fuzz/fuzz_serving.py --expect-refused tests/fuzz/regressions/serving/*
"""
from __future__ import annotations

import argparse
import json
import os
import random
import struct
import sys
import tempfile
import time
import traceback

MODEL = "m"
STAND_IN = False  # True: kiln's extension is not importable, StandInEngine is used

# Set up in setup(): the engine and the decoding entry points.
ENGINE = None
_decode_request = None
_decode_grpc_request = None
_encode_grpc_response = None
_read_rest_body = _decode_rest_request = _encode_rest_response = None
_RequestError = None
_InvalidInput = None
_ValidationError = None
_InferenceRequest = None
_InferRequest = None
_DataPlane = None
_pb = None
_DecodeError = None


class Refused(Exception):
    """A bad request refused with a 4xx (what the driver expects of every bad input)."""


def make_engine(workdir: str):
    """A CPU engine with inputs x: float32 [N, 3] and ids: int64 [N, 2], N in 1..8."""
    import onnx
    from onnx import TensorProto, helper

    import kiln

    x = helper.make_tensor_value_info("x", TensorProto.FLOAT, ["N", 3])
    ids = helper.make_tensor_value_info("ids", TensorProto.INT64, ["N", 2])
    y = helper.make_tensor_value_info("y", TensorProto.FLOAT, ["N", 3])
    z = helper.make_tensor_value_info("z", TensorProto.INT64, ["N", 2])
    graph = helper.make_graph([helper.make_node("Relu", ["x"], ["y"]),
                               helper.make_node("Identity", ["ids"], ["z"])],
                              "fuzz_serving", [x, ids], [y, z])
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])
    path = os.path.join(workdir, "fuzz_serving.onnx")
    onnx.save(model, path)
    return kiln.build(path, backend="cpu", min_shapes={"x": [1, 3], "ids": [1, 2]},
                      opt_shapes={"x": [4, 3], "ids": [4, 2]},
                      max_shapes={"x": [8, 3], "ids": [8, 2]})


class StandInEngine:
    """What decode_request reads of an engine (inputs, profile), as make_engine's engine has them:
    used when kiln's Python extension is not built (the decoding code is pure Python)."""

    class Info:
        def __init__(self, name, dtype, shape):
            self.name, self.dtype, self.shape = name, dtype, shape

    inputs = [Info("x", "float32", ["N", 3]), Info("ids", "int64", ["N", 2])]
    outputs = [Info("y", "float32", ["N", 3]), Info("z", "int64", ["N", 2])]
    profile = {"x": {"min": [1, 3], "opt": [4, 3], "max": [8, 3]},
               "ids": {"min": [1, 2], "opt": [4, 2], "max": [8, 2]}}


def import_without_extension() -> None:
    """Makes kiln.batching and kiln.serving importable from python/kiln without the extension:
    the package's __init__ (which loads it) is skipped and kiln.engine is a stand-in module."""
    import types

    pkg = types.ModuleType("kiln")
    pkg.__path__ = [os.path.join(os.path.dirname(os.path.dirname(os.path.dirname(
        os.path.abspath(__file__)))), "python", "kiln")]
    eng = types.ModuleType("kiln.engine")
    eng.Engine = StandInEngine
    eng.__getattr__ = lambda name: None  # load, device_count, ...: not used in decoding
    sys.modules["kiln"], sys.modules["kiln.engine"] = pkg, eng


def setup(workdir: str) -> None:
    global ENGINE, _decode_request, _RequestError, _InvalidInput, _ValidationError
    global _decode_grpc_request, _encode_grpc_response
    global _read_rest_body, _decode_rest_request, _encode_rest_response
    global _InferenceRequest, _InferRequest, _DataPlane, _pb, _DecodeError
    import logging

    logging.disable(logging.CRITICAL)  # KServe logs every refused request
    from google.protobuf.message import DecodeError
    from kserve.errors import InvalidInput
    from kserve.model_repository import ModelRepository
    from kserve.protocol.dataplane import DataPlane
    from kserve.protocol.grpc import grpc_predict_v2_pb2 as pb
    from kserve.protocol.infer_type import InferRequest
    from kserve.protocol.rest.v2_datamodels import InferenceRequest
    from pydantic import ValidationError

    from kiln.batching import RequestError
    from kiln.serving import decode_request

    ENGINE = make_engine(workdir) if STAND_IN is False else StandInEngine()
    import kiln.serving as serving
    _decode_grpc_request = getattr(serving, "decode_grpc_request", None)
    _encode_grpc_response = getattr(serving, "encode_grpc_response", None)
    _read_rest_body = getattr(serving, "read_rest_body", None)
    _decode_rest_request = getattr(serving, "decode_rest_request", None)
    _encode_rest_response = getattr(serving, "encode_rest_response", None)
    _decode_request, _RequestError, _InvalidInput = decode_request, RequestError, InvalidInput
    _ValidationError, _InferenceRequest, _InferRequest = ValidationError, InferenceRequest, InferRequest
    _DataPlane, _pb, _DecodeError = DataPlane(ModelRepository(workdir)), pb, DecodeError
    # As serving.make_server sets up its server's data plane.
    import kiln.serving
    if hasattr(kiln.serving, "_refuse_malformed"):
        dp = _DataPlane
        decode = dp.decode_inference_request
        if hasattr(kiln.serving, "_keep_binary_tensors"):
            decode = kiln.serving._keep_binary_tensors(decode)
        dp.decode_inference_request = kiln.serving._refuse_malformed(decode)


def to_payload(data: bytes):
    """The kserve InferRequest the server would make of this input, or Refused."""
    if not data:
        raise Refused("empty")
    mode, rest = data[0] % 3, data[1:]
    if mode == 0:  # REST, JSON body: FastAPI parses and validates Union[InferenceRequest, bytes]
        try:
            obj = json.loads(rest)
        except (ValueError, RecursionError) as e:  # JSON decode error: a 400 (_malformed_request)
            raise Refused(e) from None
        try:
            req = _InferenceRequest.model_validate(obj)
        except _ValidationError as e:
            # A JSON string validates as the bytes branch of the Union; the v2 endpoint then
            # wants the binary header, which is absent: InvalidInput, a 400.
            raise Refused(e) from None
        payload, _ = _DataPlane.decode(req, {}, protocol_version="v2", model_name=MODEL)
        return payload
    if mode == 1:  # REST, binary-data extension: header line, then the body
        header, _, body = rest.partition(b"\n")
        headers = {"inference-header-content-length": header.decode("latin-1")}
        payload, _ = _DataPlane.decode(body, headers, protocol_version="v2", model_name=MODEL)
        return payload
    try:  # gRPC: a ModelInferRequest message
        msg = _pb.ModelInferRequest.FromString(rest)
    except _DecodeError as e:  # refused by gRPC's deserialisation, before the servicer
        raise Refused(e) from None
    if _decode_grpc_request is not None:
        return msg  # the server's ModelInfer decodes the message itself
    from kserve.protocol.grpc.servicer import InferenceServicer
    InferenceServicer.validate_grpc_request(msg)
    return _InferRequest.from_grpc(msg)


def one_input(data: bytes) -> str:
    """Decodes one input every way the server may: "decoded", or "refused" (with a 4xx) when
    every way refuses it; raises otherwise."""
    lean = lean_rest(data)
    try:
        payload = to_payload(data)
        for batching in (True, False):
            if isinstance(payload, _pb.ModelInferRequest):
                feeds = _decode_grpc_request(payload, ENGINE, batching)
                check_feeds(feeds)
                check_grpc_response(payload, feeds)
            else:
                feeds = _decode_request(payload, ENGINE, batching)
                check_feeds(feeds)
    except (Refused, _RequestError, _InvalidInput):
        return "refused" if lean in (None, "refused") else "decoded"
    return "decoded"


def lean_rest(data: bytes):
    """A mode 0 or 1 input through the server's own REST decoding: "decoded", "refused", or
    None (another mode, or a kiln without it)."""
    if not data or data[0] % 3 == 2 or _decode_rest_request is None:
        return None
    rest = data[1:]
    try:
        if data[0] % 3 == 0:
            body, header, start = rest, *_read_rest_body(rest, None)
        else:
            length, _, body = rest.partition(b"\n")
            header, start = _read_rest_body(body, length)
        for batching in (True, False):
            feeds = _decode_rest_request(header, body, start, ENGINE, batching)
            check_feeds(feeds)
            check_rest_response(header, feeds)
    except _RequestError:
        return "refused"
    return "decoded"


def check_rest_response(header, feeds) -> None:
    """The REST response the server would send, with outputs shaped as the engine's: its JSON
    part parses and names the outputs asked for; binary ones' sizes add up to the body."""
    out = {"y": feeds["x"], "z": feeds["ids"]}
    body, json_length = _encode_rest_response(header, out, MODEL)
    doc = json.loads(body[:json_length] if json_length is not None else body)
    sizes = [o["parameters"]["binary_data_size"] for o in doc["outputs"] if "parameters" in o]
    assert len(body) == (json_length or len(body)) + sum(sizes)
    for o in doc["outputs"]:
        assert o["shape"] == list(out[o["name"]].shape)
        assert "data" in o or "parameters" in o


def check_grpc_response(request, feeds) -> None:
    """The response the server would send for `request`, with outputs shaped as the engine's
    (y like x, z like ids): the outputs it asks for (unknown names: RequestError), each raw."""
    out = {"y": feeds["x"], "z": feeds["ids"]}
    response = _encode_grpc_response(request, out, MODEL)
    names = [o.name for o in request.outputs] or list(out)
    assert [o.name for o in response.outputs] == names
    assert len(response.raw_output_contents) == len(names)
    for o, raw in zip(response.outputs, response.raw_output_contents):
        assert list(o.shape) == list(out[o.name].shape) and len(raw) == out[o.name].nbytes


def check_feeds(feeds) -> None:
    """What decode_request accepts fits the engine exactly."""
    want = {t.name: t for t in ENGINE.inputs}
    assert set(feeds) == set(want), f"decoded inputs {sorted(feeds)}"
    for name, a in feeds.items():
        assert a.dtype.name == want[name].dtype, f"{name}: {a.dtype}"
        assert a.ndim == 2 and 1 <= a.shape[0] <= 8, f"{name}: shape {a.shape}"


# --- seeds -----------------------------------------------------------------------------------

def seeds() -> list[bytes]:
    x = [[0.5, -1.0, 2.0], [1.0, 2.0, 3.0]]
    ids = [[1, 2], [3, 4]]
    good = {"id": "1", "inputs": [
        {"name": "x", "shape": [2, 3], "datatype": "FP32", "data": sum(x, [])},
        {"name": "ids", "shape": [2, 2], "datatype": "INT64", "data": sum(ids, [])}],
        "outputs": [{"name": "y"}]}
    out = [b"\x00" + json.dumps(good).encode()]
    bad = json.loads(json.dumps(good))
    bad["inputs"][0]["shape"] = [3, 3]
    out.append(b"\x00" + json.dumps(bad).encode())
    bad = json.loads(json.dumps(good))
    bad["inputs"][1]["datatype"] = "INT32"
    out.append(b"\x00" + json.dumps(bad).encode())
    # binary extension: the JSON header names binary_data_size, the tensors follow it
    xb = struct.pack("<6f", *sum(x, []))
    ib = struct.pack("<4q", *sum(ids, []))
    head = {"inputs": [
        {"name": "x", "shape": [2, 3], "datatype": "FP32", "parameters": {"binary_data_size": len(xb)}},
        {"name": "ids", "shape": [2, 2], "datatype": "INT64", "parameters": {"binary_data_size": len(ib)}}]}
    hb = json.dumps(head).encode()
    out.append(b"\x01" + str(len(hb)).encode() + b"\n" + hb + xb + ib)
    # gRPC: contents and raw_input_contents
    from kserve.protocol.grpc import grpc_predict_v2_pb2 as pb
    m = pb.ModelInferRequest(model_name=MODEL, id="1")
    t = m.inputs.add(name="x", datatype="FP32", shape=[2, 3])
    t.contents.fp32_contents.extend(sum(x, []))
    t = m.inputs.add(name="ids", datatype="INT64", shape=[2, 2])
    t.contents.int64_contents.extend(sum(ids, []))
    out.append(b"\x02" + m.SerializeToString())
    m = pb.ModelInferRequest(model_name=MODEL)
    m.inputs.add(name="x", datatype="FP32", shape=[2, 3])
    m.inputs.add(name="ids", datatype="INT64", shape=[2, 2])
    m.raw_input_contents.extend([xb, ib])
    out.append(b"\x02" + m.SerializeToString())
    m.outputs.add(name="z")
    out.append(b"\x02" + m.SerializeToString())
    return out


# --- mutation --------------------------------------------------------------------------------

INTERESTING = [None, True, False, 0, -1, 1, 2, 3, 8, 9, 2**31, 2**63, -2**63, 2**64, 10**30,
               1e308, -0.0, float("inf"), float("nan"), "", "x", "ids", "y", "FP32", "INT64",
               "FP16", "BF16", "BYTES", "BOOL", "UINT8", "INT32", "nope", "\u00e9\x00", [], {},
               [1], [2, 3], [0, 3], [-1, 3], [2, 2], [[1, 2], [3]], {"binary_data_size": 8},
               {"binary_data_size": -1}, {"binary_data_size": "8"}]


def mutate_json(rng: random.Random, obj):
    """Replaces, deletes or duplicates one node of a parsed JSON value."""
    paths = []

    def walk(v, path):
        paths.append(path)
        if isinstance(v, dict):
            for k, c in v.items():
                walk(c, path + [k])
        elif isinstance(v, list) and len(v) < 64:
            for i, c in enumerate(v):
                walk(c, path + [i])
    walk(obj, [])
    path = rng.choice(paths)
    if not path:
        return rng.choice(INTERESTING)
    parent = obj
    for k in path[:-1]:
        parent = parent[k]
    key, op = path[-1], rng.randrange(4)
    if op == 0:
        del parent[key]
    elif op == 1 and isinstance(parent, list):
        parent.insert(key, json.loads(json.dumps(parent[key])))
    elif op == 2 and isinstance(parent[key], (int, float)) and not isinstance(parent[key], bool):
        parent[key] = parent[key] * rng.choice([-1, 2, 1000, 0]) + rng.choice([-1, 0, 1])
    else:
        parent[key] = rng.choice(INTERESTING)
    return obj


DATATYPES = ["FP32", "INT64", "FP16", "FP64", "INT32", "INT8", "UINT8", "BOOL", "BYTES", "BF16",
             "UINT64", "", "fp32", "X"]
DIMS = [0, 1, 2, 3, 8, 9, -1, -2, 2**31, 2**62, -2**63]


def mutate_grpc(rng: random.Random, data: bytes) -> bytes | None:
    """A field-aware edit of a mode-2 input (None when it is not a ModelInferRequest)."""
    try:
        m = _pb.ModelInferRequest.FromString(data[1:])
    except Exception:  # noqa: BLE001
        return None
    op = rng.randrange(7)
    if op == 0 or not m.inputs:
        t = m.inputs.add(name=rng.choice(["x", "ids", "q", ""]), datatype=rng.choice(DATATYPES))
        t.shape.extend(rng.choice(DIMS) for _ in range(rng.randrange(4)))
    t = m.inputs[rng.randrange(len(m.inputs))]
    if op == 1:
        t.datatype = rng.choice(DATATYPES)
    elif op == 2:
        if t.shape and rng.random() < 0.5:
            t.shape[rng.randrange(len(t.shape))] = rng.choice(DIMS)
        else:
            t.shape.append(rng.choice(DIMS))
    elif op == 3:
        field = rng.choice(["fp32_contents", "int64_contents", "int_contents", "bool_contents",
                            "uint_contents", "fp64_contents", "bytes_contents"])
        vals = {"fp32_contents": [1.5], "int64_contents": [2**62], "int_contents": [-7],
                "bool_contents": [True], "uint_contents": [7], "fp64_contents": [1e300],
                "bytes_contents": [b"ab"]}[field]
        getattr(t.contents, field).extend(vals * rng.randrange(1, 9))
    elif op == 4:
        if m.raw_input_contents and rng.random() < 0.7:
            i = rng.randrange(len(m.raw_input_contents))
            raw = m.raw_input_contents[i]
            m.raw_input_contents[i] = raw[:rng.randrange(len(raw) + 1)] if rng.random() < 0.5 else raw * 2
        else:
            m.raw_input_contents.append(bytes(rng.randrange(256) for _ in range(rng.randrange(40))))
    elif op == 5:
        del m.inputs[rng.randrange(len(m.inputs))]
    elif op == 6:
        t.parameters[rng.choice(["binary_data_size", "content_type", "x"])].int64_param = rng.choice(DIMS[:8])
    if rng.random() < 0.1:
        if m.outputs and rng.random() < 0.5:
            del m.outputs[rng.randrange(len(m.outputs))]
        else:
            m.outputs.add(name=rng.choice(["y", "z", "x", ""]))
    return data[:1] + m.SerializeToString()


def mutate_structured(rng: random.Random, data: bytes) -> bytes | None:
    """A JSON- or protobuf-aware edit of an input (None when it does not parse)."""
    if not data:
        return None
    if data[0] % 3 == 2:
        return mutate_grpc(rng, data)
    if data[0] % 3 == 0:
        try:
            obj = json.loads(data[1:])
        except (ValueError, RecursionError):
            return None
        return data[:1] + json.dumps(mutate_json(rng, obj), allow_nan=True).encode()
    header, _, body = data[1:].partition(b"\n")
    try:
        n = int(header)
        obj = json.loads(body[:n])
    except (ValueError, RecursionError):
        return None
    hb = json.dumps(mutate_json(rng, obj)).encode()
    tail = body[n:]
    if rng.random() < 0.3:
        tail = tail[:rng.randrange(len(tail) + 1)]
    return data[:1] + str(len(hb)).encode() + b"\n" + hb + tail


def mutate_bytes(rng: random.Random, data: bytes, max_size: int) -> bytes:
    b = bytearray(data)
    for _ in range(rng.randrange(1, 5)):
        op = rng.randrange(5)
        if op == 0 and b:
            b[rng.randrange(len(b))] = rng.randrange(256)
        elif op == 1:
            b.insert(rng.randrange(len(b) + 1), rng.randrange(256))
        elif op == 2 and b:
            i = rng.randrange(len(b))
            del b[i:i + rng.randrange(1, 9)]
        elif op == 3 and b:
            i, j = sorted(rng.randrange(len(b) + 1) for _ in range(2))
            b[i:i] = b[i:j]
        elif op == 4 and b:
            i = rng.randrange(len(b))
            b[i:i + 1] = rng.choice([b"0", b"-1", b"1e309", b"99999999999", b'"', b"[", b"{}", b"null"])
    return bytes(b[:max_size])


# --- drivers ---------------------------------------------------------------------------------

def report(data: bytes, artifact_dir: str) -> None:
    os.makedirs(artifact_dir, exist_ok=True)
    import hashlib
    path = os.path.join(artifact_dir, "crash-" + hashlib.sha1(data).hexdigest())
    with open(path, "wb") as f:
        f.write(data)
    print(f"fuzz_serving: an input raised an exception other than a 4xx refusal; input saved to "
          f"{path}", file=sys.stderr)


def load_corpus(dirs) -> list[bytes]:
    out = []
    for d in dirs:
        for name in sorted(os.listdir(d)):
            with open(os.path.join(d, name), "rb") as f:
                out.append(f.read())
    return out


def run_random(args, corpus: list[bytes]) -> int:
    rng = random.Random(args.seed)
    pool = list(corpus)
    start, n = time.monotonic(), 0
    for data in pool:  # the seeds themselves first
        n += 1
        try:
            one_input(data)
        except Exception:  # noqa: BLE001 - every other exception is a finding
            traceback.print_exc()
            report(data, args.artifact_dir)
            return 1
    found = {}
    while n < args.runs and time.monotonic() - start < args.max_seconds:
        base = rng.choice(pool)
        data = (rng.random() < 0.5 and mutate_structured(rng, base)) or mutate_bytes(rng, base, 4096)
        n += 1
        try:
            one_input(data)
        except Exception as e:  # noqa: BLE001
            if not args.keep_going:
                traceback.print_exc()
                report(data, args.artifact_dir)
                return 1
            tb = traceback.extract_tb(e.__traceback__)[-1]
            key = (type(e).__name__, tb.filename, tb.lineno)
            if key not in found:
                found[key] = data
                print(f"finding {len(found)}: {type(e).__name__}: {e} at {tb.filename}:{tb.lineno} "
                      f"input {data[:200]!r}", flush=True)
        if len(pool) < 2000 and rng.random() < 0.01:
            pool.append(data)
        if n % 100000 == 0:
            print(f"#{n} execs in {time.monotonic() - start:.0f} s", flush=True)
    print(f"fuzz_serving: {n} executions in {time.monotonic() - start:.1f} s (random mutator, seed "
          f"{args.seed}), {len(found) or 'no'} finding{'s' if len(found) != 1 else ''}")
    return 1 if found else 0


def run_atheris(argv: list[str], corpus_dir: str) -> int:
    import atheris

    rng = random.Random(0)

    def custom_mutator(data, max_size, seed):
        rng.seed(seed)
        if rng.random() < 0.5:
            m = mutate_structured(rng, data)
            if m is not None and len(m) <= max_size:
                return m
        return atheris.Mutate(data, max_size)

    def test_one(data):
        try:
            one_input(data)
        except Exception:  # noqa: BLE001
            traceback.print_exc()
            raise

    atheris.Setup([argv[0], *argv[1:], corpus_dir], test_one, custom_mutator=custom_mutator)
    atheris.Fuzz()
    return 0


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0], allow_abbrev=False)
    ap.add_argument("--no-atheris", action="store_true", help="use the seeded random mutator")
    ap.add_argument("--runs", type=int, default=1_000_000, help="random mutator: inputs to run")
    ap.add_argument("--max-seconds", type=float, default=3600, help="random mutator: time limit")
    ap.add_argument("--seed", type=int, default=1, help="random mutator: its seed")
    ap.add_argument("--artifact-dir", default=".", help="where a finding's input is written")
    ap.add_argument("--keep-going", action="store_true",
                    help="random mutator: list every distinct finding instead of stopping")
    ap.add_argument("--expect-refused", nargs="+", metavar="FILE", default=None,
                    help="no fuzzing: each input file must be refused with a 4xx (regressions)")
    ap.add_argument("--corpus", action="append", default=[], help="extra seed folders")
    args, rest = ap.parse_known_args()
    global STAND_IN
    try:
        import kiln._kiln  # noqa: F401
    except ImportError:
        STAND_IN = True
        import_without_extension()
        print("fuzz_serving: kiln's Python extension is not importable (PYTHONPATH=build/python?): "
              "decoding is checked against a stand-in engine with the same inputs and profile")
    workdir = tempfile.mkdtemp(prefix="kiln-fuzz-serving-")
    if args.expect_refused:
        setup(workdir)
        bad = 0
        for path in args.expect_refused:
            with open(path, "rb") as f:
                data = f.read()
            try:
                got = one_input(data)
            except Exception as e:  # noqa: BLE001
                got = f"{type(e).__name__}: {e}"
            if got != "refused":
                bad += 1
                print(f"fuzz_serving: {path}: {got}, not refused with a 4xx")
        print(f"fuzz_serving: {len(args.expect_refused) - bad} of {len(args.expect_refused)} "
              f"inputs refused with a 4xx")
        return 1 if bad else 0
    use_atheris = not args.no_atheris
    if use_atheris:
        try:
            import atheris
        except ImportError:
            print("fuzz_serving: atheris is not installed: the seeded random mutator runs instead")
            use_atheris = False
    if not use_atheris:
        setup(workdir)
        return run_random(args, seeds() + load_corpus(args.corpus))
    # Coverage of kiln's decoding and KServe's (instrumented when first imported: before seeds()).
    with atheris.instrument_imports(include=["kiln", "kserve.protocol"]):
        import kiln.batching  # noqa: F401
        import kiln.serving  # noqa: F401
        import kserve.protocol.dataplane  # noqa: F401
        import kserve.protocol.infer_type  # noqa: F401
    corpus = seeds() + load_corpus(args.corpus)
    seed_dir = os.path.join(workdir, "corpus")
    os.makedirs(seed_dir)
    for i, data in enumerate(corpus):
        with open(os.path.join(seed_dir, f"seed{i}"), "wb") as f:
            f.write(data)
    setup(workdir)
    if not any(a.startswith("-artifact_prefix") for a in rest):
        rest.append(f"-artifact_prefix={os.path.join(args.artifact_dir, '')}")
    return run_atheris([sys.argv[0], *rest], seed_dir)


if __name__ == "__main__":
    sys.exit(main())
