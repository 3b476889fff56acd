"""serving.split_grpc_request (gRPC ModelInfer's reading of the serialized message, which keeps
raw_input_contents in place and parses only the rest with protobuf) against protobuf's own
parse: equal on well-formed messages, whatever the order of their fields, and on bounded random
mutations of them either equal or a RequestError, never another exception. And
serving.encode_grpc_response_bytes (ModelInfer's response, written directly) against protobuf's
serialization of encode_grpc_response's message: the same bytes. In a subprocess:
kserve's protobuf classes and tritonclient.grpc's (test_serve.py) register the same messages
and cannot share one process."""
import importlib.util
import os
import subprocess
import sys

import numpy as np
import pytest

if importlib.util.find_spec("kserve") is None:
    pytest.skip("kserve is not installed (scripts/setup.sh installs it)", allow_module_level=True)

from kiln.batching import RequestError  # noqa: E402
from kiln.serving import split_grpc_request  # noqa: E402


def _pb():
    from kserve.protocol.grpc import grpc_predict_v2_pb2 as pb

    return pb


def _message(rng, raws: int):
    pb = _pb()
    m = pb.ModelInferRequest(model_name=f"m{rng.integers(100)}", id="r" * int(rng.integers(4)))
    m.parameters["p"].int64_param = int(rng.integers(1 << 40))
    for k in range(max(raws, 1)):
        t = m.inputs.add(name=f"in{k}", datatype="FP32")
        t.shape.extend([1, int(rng.integers(1, 5))])
        t.parameters["q"].string_param = "x"
    m.outputs.add(name="out")
    for k in range(raws):
        m.raw_input_contents.append(rng.bytes(int(rng.integers(0, 300))))
    return m


def _fields(body: bytes) -> list:
    """The top-level fields of a serialized message, each as its bytes (protobuf's output is
    well formed: no checks)."""
    out, pos = [], 0
    while pos < len(body):
        start = pos
        key = 0
        shift = 0
        while True:
            b = body[pos]
            pos += 1
            key |= (b & 0x7F) << shift
            shift += 7
            if b < 0x80:
                break
        wire = key & 7
        if wire == 0:
            while body[pos] >= 0x80:
                pos += 1
            pos += 1
        elif wire == 2:
            size = shift = 0
            while True:
                b = body[pos]
                pos += 1
                size |= (b & 0x7F) << shift
                shift += 7
                if b < 0x80:
                    break
            pos += size
        else:
            pos += 8 if wire == 1 else 4
        out.append(body[start:pos])
    return out


def _same(request, raw, want) -> None:
    assert [bytes(r) for r in raw] == list(want.raw_input_contents)
    want = type(want).FromString(want.SerializeToString())
    del want.raw_input_contents[:]
    assert request == want


def check_split_equals_protobuf_in_any_field_order():
    pb = _pb()
    rng = np.random.default_rng(7)
    for i in range(200):
        m = _message(rng, raws=i % 4)
        fields = _fields(m.SerializeToString())
        rng.shuffle(fields)  # protobuf takes any order; repeated fields keep theirs
        raws = [f for f in fields if f[0] == (7 << 3 | 2)]
        others = [f for f in fields if f[0] != (7 << 3 | 2)]
        body = b"".join(others[: len(others) // 2] + raws + others[len(others) // 2:])
        request, raw = split_grpc_request(body)
        _same(request, raw, pb.ModelInferRequest.FromString(body))
        # raw tensors are views of the body, not copies
        assert all(isinstance(r, memoryview) and r.obj is body for r in raw)


def check_mutated_bodies_are_request_errors_or_parse_as_protobuf_does():
    from google.protobuf.message import DecodeError

    pb = _pb()
    rng = np.random.default_rng(11)
    refused = 0
    for i in range(2000):
        body = bytearray(_message(rng, raws=1 + i % 3).SerializeToString())
        for _ in range(int(rng.integers(1, 4))):
            if not body:
                break
            kind = rng.integers(3)
            at = int(rng.integers(len(body)))
            if kind == 0:
                body[at] = int(rng.integers(256))
            elif kind == 1:
                del body[at:]
            else:
                body[at:at] = rng.bytes(int(rng.integers(1, 6)))
        body = bytes(body)
        try:
            request, raw = split_grpc_request(body)
        except RequestError as e:
            assert str(e).startswith("malformed request")
            refused += 1
            continue
        try:
            want = pb.ModelInferRequest.FromString(body)
        except DecodeError:
            # protobuf refuses what the split took (a raw tensor protobuf would reject only as
            # part of its whole-message checks): the split's message must still be consistent
            continue
        _same(request, raw, want)
    assert refused > 100


def check_encoded_response_is_protobufs_serialization():
    from kiln.serving import encode_grpc_response, encode_grpc_response_bytes

    pb = _pb()
    rng = np.random.default_rng(3)
    n = 0
    for dtype in ("float32", "float16", "float64", "int64", "int32", "int8", "uint8", "bool"):
        for shape in ((1, 10), (3, 1000), (0, 4), (2, 0), (), (1, 200, 200)):
            y = (rng.standard_normal(shape) * 100).astype(dtype)
            # z: not C-contiguous (the encoders write its C-order copy)
            out = {"y": y, "z": np.asfortranarray(rng.standard_normal((3, 4)).astype(np.float32))}
            for asked in ((), ("y",), ("z", "y")):
                for rid in ("", "r-\u00e91", "i" * 200):
                    request = pb.ModelInferRequest(model_name="m", id=rid)
                    for name in asked:
                        request.outputs.add(name=name)
                    for model in ("my_model", "n" * 300):
                        want = encode_grpc_response(request, out, model).SerializeToString()
                        assert encode_grpc_response_bytes(request, out, model) == want, (
                            dtype, shape, asked, rid, model)
                        n += 1
    assert n == 8 * 6 * 3 * 3 * 2
    request = pb.ModelInferRequest(model_name="m")
    request.outputs.add(name="nope")
    with pytest.raises(RequestError, match="unknown output 'nope'"):
        encode_grpc_response_bytes(request, {"y": np.zeros(3, np.float32)}, "m")


def check_inputs_in_shared_memory_beside_raw_ones():
    """A request with one input in a registered shared memory region (kiln.shm) and one in
    raw_input_contents: the raw contents are the other input's (as Triton reads them), the
    region's input is an array over the mapping; a raw content too many for the inputs not in
    shared memory is a RequestError naming the input in shared memory."""
    import mmap

    from kiln import shm
    from kiln.serve_workers import EngineInfo
    from kiln.serving import decode_grpc_request

    pb = _pb()
    engine = EngineInfo({"inputs": [("x", "float32", [-1, 4]), ("mask", "int64", [-1, 4])],
                         "outputs": [], "profile": {}, "backend": "cpu"})
    x = np.arange(8, dtype=np.float32).reshape(2, 4)
    mask = np.ones((2, 4), np.int64)
    reg = shm.Registry()
    mm = mmap.mmap(-1, 4096)
    mm[64:64 + x.nbytes] = x.tobytes()
    reg.regions["r"] = shm.Region("r", "/r", 0, 4096, mm)
    shm.registry.cache_clear()
    shm.registry = lambda: reg  # this process's registry, without /dev/shm
    request = pb.ModelInferRequest(model_name="m")
    t = request.inputs.add(name="x", datatype="FP32", shape=[2, 4])
    t.parameters[shm.REGION].string_param = "r"
    t.parameters[shm.SIZE].int64_param = x.nbytes
    t.parameters[shm.OFFSET].int64_param = 64
    request.inputs.add(name="mask", datatype="INT64", shape=[2, 4])
    request.raw_input_contents.append(mask.tobytes())
    feeds = decode_grpc_request(request, engine, True)
    np.testing.assert_array_equal(feeds["x"], x)
    np.testing.assert_array_equal(feeds["mask"], mask)
    assert feeds["x"].base is not None  # a view of the mapping, not a copy
    request.raw_input_contents.append(x.tobytes())
    with pytest.raises(RequestError, match="input 'x': both raw_input_contents and "
                                           "shared_memory_region given"):
        decode_grpc_request(request, engine, True)


def _in_subprocess(check: str) -> None:
    here = os.path.dirname(os.path.abspath(__file__))
    root = os.path.abspath(os.path.join(here, "..", ".."))
    pkg = os.environ.get("KILN_PYTHON_DIR", os.path.join(root, "build", "python"))
    env = dict(os.environ)
    env["PYTHONPATH"] = os.pathsep.join(p for p in [pkg, here, env.get("PYTHONPATH", "")] if p)
    r = subprocess.run([sys.executable, "-c", f"import test_serve_split as t; t.{check}()"],
                       env=env, capture_output=True, text=True, timeout=300)
    assert r.returncode == 0, r.stdout + r.stderr


def test_split_equals_protobuf_in_any_field_order():
    _in_subprocess("check_split_equals_protobuf_in_any_field_order")


def test_mutated_bodies_are_request_errors_or_parse_as_protobuf_does():
    _in_subprocess("check_mutated_bodies_are_request_errors_or_parse_as_protobuf_does")


def test_encoded_response_is_protobufs_serialization():
    _in_subprocess("check_encoded_response_is_protobufs_serialization")


def test_inputs_in_shared_memory_beside_raw_ones():
    _in_subprocess("check_inputs_in_shared_memory_beside_raw_ones")
