"""`kiln serve` (the C++ server) on the cpu backend, driven by Triton's clients (tritonclient) over the Open
Inference Protocol's REST and gRPC: outputs equal ONNX Runtime's, concurrent requests share
inferences, bad requests get a 4xx with a clear message and the server keeps serving."""
import json
import signal
import subprocess
import sys
import threading
import time
import urllib.error
import urllib.request

import numpy as np
import pytest
from conftest import (free_port, ort_outputs, rel_l2, serve_env, serve_repo, stop_serve,
                      wait_ready)

import kiln

httpclient = pytest.importorskip("tritonclient.http", reason="tritonclient is not installed "
                                 "(scripts/setup.sh installs it)")
grpcclient = pytest.importorskip("tritonclient.grpc")
# `kiln serve` is the C++ server (src/serve), run through the package's `kiln` command
# (python -m kiln.cli), each in a process of its own.

LIMIT = 1 << 20  # --max-request-bytes of the server under test


@pytest.fixture(scope="module")
def server(models_dir, tmp_path_factory):
    repo = serve_repo(models_dir, tmp_path_factory.mktemp("repo"), max_batch=16)
    http_port, grpc_port = free_port(), free_port()
    env = serve_env()
    log = open(tmp_path_factory.mktemp("log") / "serve.log", "w+")
    proc = subprocess.Popen(
        [sys.executable, "-m", "kiln.cli", "serve", str(repo), "--host", "127.0.0.1",
         "--http-port", str(http_port), "--grpc-port", str(grpc_port), "--contexts", "2",
         "--batch-delay-ms", "50", "--max-request-bytes", str(LIMIT)],
        stdout=log, stderr=subprocess.STDOUT, env=env)
    url = f"127.0.0.1:{http_port}"
    wait_ready(proc, url, log)
    yield {"http": url, "grpc": f"127.0.0.1:{grpc_port}", "proc": proc, "log": log}
    stop_serve(proc)


def cnn_input(batch, seed):
    return np.random.default_rng(seed).standard_normal((batch, 3, 32, 32)).astype(np.float32)


def infer(client_mod, client, model, x, name="input", dtype="FP32"):
    inp = client_mod.InferInput(name, list(x.shape), dtype)
    inp.set_data_from_numpy(x)
    return client.infer(model, [inp])


@pytest.mark.parametrize("proto", ["http", "grpc"])
def test_triton_clients_get_onnxruntime_outputs(server, models_dir, proto):
    mod = httpclient if proto == "http" else grpcclient
    client = mod.InferenceServerClient(server[proto])
    assert client.is_server_live() and client.is_server_ready()
    assert client.is_model_ready("small_cnn") and client.is_model_ready("mlp")
    meta = client.get_model_metadata("small_cnn")
    if proto == "grpc":
        meta = {"inputs": [{"name": i.name, "datatype": i.datatype, "shape": list(i.shape)}
                           for i in meta.inputs]}
    assert meta["inputs"] == [{"name": "input", "datatype": "FP32", "shape": [-1, 3, 32, 32]}]
    for batch in (1, 4):
        x = cnn_input(batch, batch)
        got = infer(mod, client, "small_cnn", x).as_numpy("probabilities")
        want = ort_outputs(models_dir / "small_cnn.onnx", {"input": x})["probabilities"]
        assert got.shape == want.shape and rel_l2(got, want) < 1e-5
    x = np.random.default_rng(9).standard_normal((3, 64)).astype(np.float32)
    got = infer(mod, client, "mlp", x, name="x").as_numpy("y")
    assert rel_l2(got, ort_outputs(models_dir / "mlp.onnx", {"x": x})["y"]) < 1e-5


def metrics(server):
    with urllib.request.urlopen(f"http://{server['http']}/metrics", timeout=10) as r:
        text = r.read().decode()
    out = {}
    for line in text.splitlines():
        if line.startswith("kiln_") and 'model="small_cnn"' in line:
            out[line.split("{")[0]] = float(line.rsplit(" ", 1)[1])
    return out


def test_concurrent_clients_are_batched(server, models_dir):
    before = metrics(server)
    n = 12
    xs = [cnn_input(1, 100 + i) for i in range(n)]
    want = ort_outputs(models_dir / "small_cnn.onnx", {"input": np.concatenate(xs)})["probabilities"]
    results, errors = [None] * n, []
    barrier = threading.Barrier(n)

    def one(i):
        try:
            mod = grpcclient if i % 2 else httpclient
            client = mod.InferenceServerClient(server["grpc" if i % 2 else "http"])
            barrier.wait()
            results[i] = infer(mod, client, "small_cnn", xs[i]).as_numpy("probabilities")
        except Exception as e:  # noqa: BLE001 - reported below
            errors.append(e)

    threads = [threading.Thread(target=one, args=(i,)) for i in range(n)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(timeout=60)
    assert not errors, errors
    for i in range(n):
        assert rel_l2(results[i], want[i:i + 1]) < 1e-5
    after = metrics(server)
    requests = after["kiln_requests_total"] - before.get("kiln_requests_total", 0)
    inferences = after["kiln_inferences_total"] - before.get("kiln_inferences_total", 0)
    batched = after["kiln_batched_requests_total"] - before.get("kiln_batched_requests_total", 0)
    assert requests == n
    assert inferences < n and batched >= 2, after
    assert after["kiln_largest_batch"] >= 2


def post(server, path, body, headers=None):
    req = urllib.request.Request(f"http://{server['http']}{path}", data=body, method="POST",
                                 headers={"Content-Type": "application/json", **(headers or {})})
    try:
        with urllib.request.urlopen(req, timeout=30) as r:
            return r.status, r.read().decode()
    except urllib.error.HTTPError as e:
        return e.code, e.read().decode()


def v2_body(shape, datatype="FP32", data=None, name="input"):
    n = int(np.prod(shape))
    return json.dumps({"inputs": [{"name": name, "shape": shape, "datatype": datatype,
                                   "data": data if data is not None else [0.5] * n}]}).encode()


@pytest.mark.parametrize("path, body, status, message", [
    ("/v2/models/nosuch/infer", v2_body([1, 3, 32, 32]), 404, "nosuch"),
    ("/v2/models/small_cnn/infer", v2_body([1, 3, 16, 16]), 400,
     "input 'input': shape [1, 3, 16, 16], the model takes [-1, 3, 32, 32]"),
    ("/v2/models/small_cnn/infer", v2_body([32, 3, 32, 32]), 400, "outside the model's range"),
    ("/v2/models/small_cnn/infer", v2_body([1, 3, 32, 32], "FP64"), 400,
     "input 'input': datatype FP64, the model takes FP32"),
    ("/v2/models/small_cnn/infer", v2_body([1, 3, 32, 32], name="image"), 400, "unknown input 'image'"),
    ("/v2/models/small_cnn/infer", v2_body([1, 3, 32, 32], data=[1.0, 2.0]), 400, ""),
    ("/v2/models/small_cnn/infer", b'{"inputs": [{"name": "input", "shape": [1,', 400, ""),
    ("/v2/models/small_cnn/infer", b"[]", 400, ""),
])
def test_bad_rest_requests_get_4xx(server, path, body, status, message):
    got, text = post(server, path, body)
    assert got == status, text
    assert message in text
    assert json.loads(text)["error"]


def binary_body(x, size=None):
    """A v2 REST body with x as a binary tensor after the JSON header (as tritonclient.http
    sends it), its binary_data_size `size` (default: x's bytes); and the header's length."""
    header = json.dumps({"inputs": [{"name": "input", "shape": list(x.shape), "datatype": "FP32",
                                     "parameters": {"binary_data_size": x.nbytes if size is None
                                                    else size}}]}).encode()
    return header + x.tobytes(), len(header)


def test_binary_rest_bodies(server, models_dir):
    """Binary tensors (the binary-tensor extension) give what ONNX Runtime gives, and a
    binary_data_size past the end of the body or a header length past it is a 400 saying so."""
    x = cnn_input(3, 11)
    body, n = binary_body(x)
    binary = {"Content-Type": "application/octet-stream"}
    got, text = post(server, "/v2/models/small_cnn/infer", body,
                     {**binary, "Inference-Header-Content-Length": str(n)})
    assert got == 200, text
    out = next(o for o in json.loads(text)["outputs"] if o["name"] == "probabilities")
    want = ort_outputs(models_dir / "small_cnn.onnx", {"input": x})["probabilities"]
    assert rel_l2(np.asarray(out["data"], np.float32).reshape(out["shape"]), want) < 1e-5
    body, n = binary_body(x)
    got, text = post(server, "/v2/models/small_cnn/infer", body[: n + x.nbytes // 2],
                     {**binary, "Inference-Header-Content-Length": str(n)})
    assert got == 400 and "binary_data_size" in text, text
    got, text = post(server, "/v2/models/small_cnn/infer", body,
                     {**binary, "Inference-Header-Content-Length": str(len(body) + 1)})
    assert got == 400 and json.loads(text)["error"], text
    x1 = cnn_input(1, 12)
    body, n = binary_body(x1, size=x1.nbytes - 4)  # a size unlike the shape's
    got, text = post(server, "/v2/models/small_cnn/infer", body,
                     {**binary, "Inference-Header-Content-Length": str(n)})
    assert got == 400 and json.loads(text)["error"], text


def test_body_over_the_limit(server):
    body = v2_body([8, 3, 32, 32])
    body = body + b" " * (LIMIT + 1 - len(body))
    got, text = post(server, "/v2/models/small_cnn/infer", body)
    assert got == 413 and f"limit of {LIMIT} bytes" in text


def test_bad_grpc_requests(server):
    from tritonclient.utils import InferenceServerException

    client = grpcclient.InferenceServerClient(server["grpc"])
    with pytest.raises(InferenceServerException, match="nosuch"):
        infer(grpcclient, client, "nosuch", cnn_input(1, 0))
    with pytest.raises(InferenceServerException, match=r"shape \[1, 3, 16, 16\]"):
        infer(grpcclient, client, "small_cnn", np.zeros((1, 3, 16, 16), np.float32))
    with pytest.raises(InferenceServerException, match="datatype FP64"):
        infer(grpcclient, client, "small_cnn", np.zeros((1, 3, 32, 32)), dtype="FP64")
    with pytest.raises(InferenceServerException):
        infer(grpcclient, client, "small_cnn", np.zeros((8, 3, 128, 128), np.float32))  # > limit


def test_still_serving_after_bad_requests(server, models_dir):
    test_bad_grpc_requests(server)
    post(server, "/v2/models/small_cnn/infer", b"{")
    client = httpclient.InferenceServerClient(server["http"])
    x = cnn_input(2, 42)
    got = infer(httpclient, client, "small_cnn", x).as_numpy("probabilities")
    want = ort_outputs(models_dir / "small_cnn.onnx", {"input": x})["probabilities"]
    assert rel_l2(got, want) < 1e-5
    assert server["proc"].poll() is None


# ---- gRPC ModelInfer's decoding and encoding (src/serve/grpc_codec.*) ---------------------------
def grpc_stub(server):
    import grpc
    from tritonclient.grpc import service_pb2_grpc

    channel = grpc.insecure_channel(server["grpc"])
    return channel, service_pb2_grpc.GRPCInferenceServiceStub(channel)


def grpc_request(model="small_cnn", inputs=(), raw=(), outputs=(), id=""):
    """A ModelInferRequest: inputs as (name, datatype, shape[, {contents field: values}])."""
    from tritonclient.grpc import service_pb2

    m = service_pb2.ModelInferRequest(model_name=model, id=id)
    for spec in inputs:
        t = m.inputs.add(name=spec[0], datatype=spec[1], shape=list(spec[2]))
        for field, values in (spec[3] if len(spec) > 3 else {}).items():
            getattr(t.contents, field).extend(values)
    m.raw_input_contents.extend(raw)
    for name in outputs:
        m.outputs.add(name=name)
    return m


def grpc_call(stub, request):
    """(status code name, message, response)."""
    import grpc

    try:
        return "OK", "", stub.ModelInfer(request, timeout=30)
    except grpc.RpcError as e:
        return e.code().name, e.details(), None


def raw_outputs(response):
    dtypes = {"FP32": np.float32, "INT64": np.int64}
    return {o.name: np.frombuffer(response.raw_output_contents[i], dtypes[o.datatype]).reshape(
        list(o.shape)) for i, o in enumerate(response.outputs)}


def test_grpc_outputs_equal_the_engine_run_directly(server, models_dir):
    """Raw contents (as Triton's clients send them) and typed contents both give what the engine
    gives run directly (kiln.load + Context.run), in raw_output_contents; the request's id comes
    back; a request naming its outputs gets those."""
    engine = kiln.build(str(models_dir / "small_cnn.onnx"), backend="cpu",
                        min_shapes={"input": [1, 3, 32, 32]}, opt_shapes={"input": [8, 3, 32, 32]},
                        max_shapes={"input": [16, 3, 32, 32]})
    ctx = engine.create_context()
    channel, stub = grpc_stub(server)
    with channel:
        for batch in (1, 3):
            x = cnn_input(batch, 70 + batch)
            want = np.asarray(ctx.run({"input": x})["probabilities"])
            code, msg, r = grpc_call(stub, grpc_request(inputs=[("input", "FP32", x.shape)],
                                                        raw=[x.tobytes()], id=f"req{batch}"))
            assert code == "OK", msg
            assert r.id == f"req{batch}" and r.model_name == "small_cnn"
            got = raw_outputs(r)
            assert list(got) == ["probabilities"] and got["probabilities"].shape == want.shape
            assert rel_l2(got["probabilities"], want) < 1e-6
            code, msg, r = grpc_call(stub, grpc_request(
                inputs=[("input", "FP32", x.shape, {"fp32_contents": x.ravel().tolist()})],
                outputs=["probabilities"]))
            assert code == "OK", msg
            assert rel_l2(raw_outputs(r)["probabilities"], want) < 1e-6
        x = np.random.default_rng(5).standard_normal((2, 64)).astype(np.float32)
        code, msg, r = grpc_call(stub, grpc_request("mlp", [("x", "FP32", x.shape)], [x.tobytes()]))
        assert code == "OK", msg
        assert rel_l2(raw_outputs(r)["y"], ort_outputs(models_dir / "mlp.onnx", {"x": x})["y"]) < 1e-5


def _raw_field(data: bytes) -> bytes:
    """raw_input_contents (field 7) as protobuf writes it: tag, length varint, bytes."""
    out, n = bytearray([7 << 3 | 2]), len(data)
    while n >= 0x80:
        out.append(n & 0x7F | 0x80)
        n >>= 7
    out.append(n)
    return bytes(out) + data


def test_grpc_request_split_by_hand(server):
    """ModelInfer's reading of the serialized message: raw tensors placed before the other
    fields (protobuf allows any order) decode as usual; a body that is not a ModelInferRequest (truncated, a wire type
    it has not, a length past its end) is INVALID_ARGUMENT saying so, and the server goes on."""
    import grpc

    x = cnn_input(2, 90)
    ctx_want = grpc_request(inputs=[("input", "FP32", x.shape)], raw=[x.tobytes()], id="a")
    channel = grpc.insecure_channel(server["grpc"])
    call = channel.unary_unary("/inference.GRPCInferenceService/ModelInfer",
                               request_serializer=None, response_deserializer=None)
    from tritonclient.grpc import service_pb2

    def ask(body):
        try:
            return "OK", "", service_pb2.ModelInferResponse.FromString(call(body, timeout=30))
        except grpc.RpcError as e:
            return e.code().name, e.details(), None

    with channel:
        code, msg, want = ask(ctx_want.SerializeToString())
        assert code == "OK", msg
        no_raw = grpc_request(inputs=[("input", "FP32", x.shape)], id="a").SerializeToString()
        code, msg, r = ask(_raw_field(x.tobytes()) + no_raw)
        assert code == "OK", msg
        assert r.id == "a" and r.raw_output_contents == want.raw_output_contents
        whole = ctx_want.SerializeToString()
        for body, says in ((whole[:-10], "truncated"), (b"\x0b" + whole, "wire type 3"),
                           (b"\x3a\xff\xff\x03" + whole[:100], "truncated"),
                           (b"\x08" + b"\xff" * 12, "varint")):
            code, msg, _ = ask(body)
            assert code == "INVALID_ARGUMENT" and "malformed request" in msg and says in msg, (
                code, msg)
        code, msg, r = ask(whole)
        assert code == "OK", msg
    assert server["proc"].poll() is None


X1 = np.zeros((1, 3, 32, 32), np.float32)


@pytest.mark.parametrize("request_args, code, message", [
    (dict(inputs=[("input", "FP32", [1, 3, 16, 16])], raw=[X1.tobytes()[:3072 * 4 // 4]]),
     "INVALID_ARGUMENT", "input 'input': shape [1, 3, 16, 16], the model takes [-1, 3, 32, 32]"),
    (dict(inputs=[("input", "FP64", [1, 3, 32, 32])], raw=[X1.astype(np.float64).tobytes()]),
     "INVALID_ARGUMENT", "input 'input': datatype FP64, the model takes FP32"),
    (dict(inputs=[("image", "FP32", [1, 3, 32, 32])], raw=[X1.tobytes()]),
     "INVALID_ARGUMENT", "unknown input 'image'"),
    (dict(inputs=[("input", "FP32", [1, 3, 32, 32])], raw=[X1.tobytes()[:-6]]),
     "INVALID_ARGUMENT", "input 'input': 12282 bytes of raw_input_contents, shape [1, 3, 32, 32] "
                         "of FP32 takes 12288"),
    (dict(inputs=[("input", "FP32", [1, 3, 32, 32])], raw=[X1.tobytes(), b"x"]),
     "INVALID_ARGUMENT", "1 inputs and 2 raw_input_contents"),
    (dict(inputs=[("input", "FP32", [1, 3, 32, 32], {"fp32_contents": [0.0]})], raw=[X1.tobytes()]),
     "INVALID_ARGUMENT", "input 'input': both contents and raw_input_contents"),
    (dict(inputs=[("input", "FP32", [1, 3, 32, 32], {"fp32_contents": [1.0, 2.0]})]),
     "INVALID_ARGUMENT", "input 'input': 2 values in contents.fp32_contents, shape [1, 3, 32, 32] "
                         "takes 3072"),
    (dict(inputs=[("input", "FP32", [1, 3, 32, 32], {"int_contents": [1] * 3072})]),
     "INVALID_ARGUMENT", "0 values in contents.fp32_contents"),
    (dict(inputs=[("input", "FP32", [-1, 3, 32, 32])], raw=[X1.tobytes()]),
     "INVALID_ARGUMENT", "shape [-1, 3, 32, 32] is not a list of sizes"),
    (dict(inputs=[("input", "FP32", [2**20, 2**20, 3, 32])], raw=[X1.tobytes()]),
     "INVALID_ARGUMENT", "bytes of raw_input_contents"),
    (dict(inputs=[("input", "FP32", [2**62, 9, 0])], raw=[b""]),  # no elements, yet no array
     "INVALID_ARGUMENT", "input 'input': shape [4611686018427387904, 9, 0] is too large"),
    (dict(inputs=[("input", "FP32", [2**61, 3, 0])], raw=[b""]),  # its bytes past int64
     "INVALID_ARGUMENT", "input 'input': shape [2305843009213693952, 3, 0] is too large"),
    (dict(inputs=[("input", "BYTES", [1])], raw=[b"\x01\x00\x00\x00a"]),
     "INVALID_ARGUMENT", "datatype BYTES is not one kiln takes"),
    (dict(inputs=[("input", "FP16", [1, 3, 32, 32])]),
     "INVALID_ARGUMENT", "FP16 data must come in raw_input_contents"),
    (dict(inputs=[("input", "INT8", [1, 3, 32, 32], {"int_contents": [300] * 3072})]),
     "INVALID_ARGUMENT", "input 'input': value 300 is out of range for INT8"),
    (dict(inputs=[("input", "FP32", [1, 3, 32, 32])] * 2, raw=[X1.tobytes()] * 2),
     "INVALID_ARGUMENT", "input 'input' given twice"),
    (dict(inputs=[]), "INVALID_ARGUMENT", "input 'input' is missing"),
    (dict(inputs=[("input", "FP32", [32, 3, 32, 32])], raw=[np.zeros((32, 3, 32, 32), np.float32).tobytes()]),
     "INVALID_ARGUMENT", "outside the model's range"),
    (dict(inputs=[("input", "FP32", [1, 3, 32, 32])], raw=[X1.tobytes()], outputs=["logits"]),
     "INVALID_ARGUMENT", "unknown output 'logits' (the model's outputs: probabilities)"),
    (dict(model="nosuch", inputs=[("input", "FP32", [1, 3, 32, 32])], raw=[X1.tobytes()]),
     "NOT_FOUND", "nosuch"),
])
def test_bad_grpc_requests_get_a_client_error_naming_what_is_wrong(server, request_args, code,
                                                                   message):
    channel, stub = grpc_stub(server)
    with channel:
        got, text, _ = grpc_call(stub, grpc_request(**request_args))
        assert (got, message in text) == (code, True), text
        # and the server keeps serving
        got, text, r = grpc_call(stub, grpc_request(inputs=[("input", "FP32", X1.shape)],
                                                    raw=[X1.tobytes()]))
        assert got == "OK", text
    assert server["proc"].poll() is None


# ---- REST infer's decoding and encoding (src/serve/rest.*, http_api.*) ---------------------------
def test_rest_outputs_binary_or_json_as_asked(server, models_dir):
    """Triton's HTTP client asking for binary or JSON outputs, and raw bodies with
    binary_data_output, nested JSON data and an id, all get what the engine gives."""
    engine = kiln.load(str(server_repo(server) / "small_cnn.kiln"))
    ctx = engine.create_context()
    client = httpclient.InferenceServerClient(server["http"])
    x = cnn_input(2, 31)
    want = np.asarray(ctx.run({"input": x})["probabilities"])
    for binary_in in (True, False):
        for binary_out in (True, False):
            inp = httpclient.InferInput("input", list(x.shape), "FP32")
            inp.set_data_from_numpy(x, binary_data=binary_in)
            out = httpclient.InferRequestedOutput("probabilities", binary_data=binary_out)
            got = client.infer("small_cnn", [inp], outputs=[out]).as_numpy("probabilities")
            assert got.shape == want.shape and rel_l2(got, want) < 1e-6, (binary_in, binary_out)
    body = json.dumps({"id": "r7", "parameters": {"binary_data_output": True}, "inputs": [
        {"name": "input", "shape": list(x.shape), "datatype": "FP32", "data": x.tolist()}]}).encode()
    status, headers, raw = post_raw(server, "/v2/models/small_cnn/infer", body)
    assert status == 200, raw
    n = int(headers["inference-header-content-length"])
    doc = json.loads(raw[:n])
    assert doc["id"] == "r7" and doc["model_name"] == "small_cnn"
    assert doc["outputs"] == [{"name": "probabilities", "datatype": "FP32", "shape": [2, 10],
                               "parameters": {"binary_data_size": 80}}]
    assert rel_l2(np.frombuffer(raw[n:], np.float32).reshape(2, 10), want) < 1e-6


def server_repo(server):
    """The model repository of the server fixture (its command line's first argument)."""
    import pathlib

    return pathlib.Path(server["proc"].args[4])


def post_raw(server, path, body, headers=None):
    """(status, lower-cased headers, body bytes) of a POST."""
    req = urllib.request.Request(f"http://{server['http']}{path}", data=body, method="POST",
                                 headers={"Content-Type": "application/json", **(headers or {})})
    try:
        with urllib.request.urlopen(req, timeout=30) as r:
            return r.status, {k.lower(): v for k, v in r.headers.items()}, r.read()
    except urllib.error.HTTPError as e:
        return e.code, {k.lower(): v for k, v in e.headers.items()}, e.read()


def rest_body(inputs=None, **extra):
    x = [0.5] * 3072
    inputs = inputs if inputs is not None else [
        {"name": "input", "shape": [1, 3, 32, 32], "datatype": "FP32", "data": x}]
    return json.dumps({"inputs": inputs, **extra}).encode()


@pytest.mark.parametrize("body, header_length, message", [
    (rest_body(outputs=[{"name": "logits"}]), None,
     "unknown output 'logits' (the model's outputs: probabilities)"),
    (rest_body(outputs=[{"name": 3}]), None, "unknown output '3'"),
    (rest_body([{"name": "input", "shape": [1, 3, 32, 32], "datatype": "FP32", "data": [1.0]}]),
     None, "input 'input': 1 values in data, shape [1, 3, 32, 32] takes 3072"),
    (rest_body([{"name": "input", "shape": [1, 3, 32, 32], "datatype": "FP32",
                 "data": [[1.0, 2.0], [3.0]]}]), None, "input 'input': "),
    (rest_body([{"name": "input", "shape": [1, 3, 32, 32], "datatype": "FP32",
                 "data": ["a"] * 3072}]), None, "input 'input': could not convert"),
    (rest_body([{"name": "input", "shape": [1, -3, 32, 32], "datatype": "FP32", "data": [0]}]),
     None, "shape [1, -3, 32, 32] is not a list of sizes"),
    (rest_body([{"name": "input", "shape": [2**62, 9, 0], "datatype": "FP32", "data": []}]),
     None, "input 'input': shape [4611686018427387904, 9, 0] is too large"),
    (rest_body([{"name": "input", "shape": [1, 3, 32, 32], "datatype": "BYTES", "data": ["a"]}]),
     None, "datatype BYTES is not one kiln takes"),
    (rest_body([{"name": "input", "shape": [1, 3, 32, 32], "datatype": "FP32"}]), None,
     "input 'input' has neither 'data' nor binary_data_size"),
    (rest_body([{"name": "input", "shape": [1, 3, 32, 32], "datatype": "INT8",
                 "data": [300] * 3072}]), None, "input 'input': value 300 is out of range for INT8"),
    (rest_body([[1, 2]]), None, "malformed request: each input must be a JSON object"),
    (b'{"inputs": 5}', None, "malformed request"),
    (rest_body(), "100000", "inference-header-content-length 100000 is not within the body"),
    (rest_body(), "x", "inference-header-content-length x is not within the body"),
])
def test_bad_rest_requests_name_what_is_wrong(server, body, header_length, message):
    headers = {"Inference-Header-Content-Length": header_length} if header_length else {}
    status, _, text = post_raw(server, "/v2/models/small_cnn/infer", body, headers)
    assert status == 400, text
    assert message in json.loads(text)["error"], text
    status, _, text = post_raw(server, "/v2/models/small_cnn/infer", rest_body())
    assert status == 200, text


def test_log_requests(models_dir, tmp_path):
    """With --log-requests every gRPC call is logged on stderr with its method and status,
    ModelInfer included, errors with theirs; and every REST request with its method and path."""
    import grpc
    from tritonclient.grpc import service_pb2

    (tmp_path / "repo").mkdir()
    repo = serve_repo(models_dir, tmp_path / "repo", max_batch=4)
    http_port, grpc_port = free_port(), free_port()
    log = open(tmp_path / "serve.log", "w+")
    proc = subprocess.Popen(
        [sys.executable, "-m", "kiln.cli", "serve", str(repo), "--host", "127.0.0.1",
         "--http-port", str(http_port), "--grpc-port", str(grpc_port), "--log-requests",
         "--no-warmup", "--contexts", "2"], stdout=log, stderr=subprocess.STDOUT, env=serve_env())
    server = {"grpc": f"127.0.0.1:{grpc_port}"}
    try:
        wait_ready(proc, f"127.0.0.1:{http_port}", log)
        channel, stub = grpc_stub(server)
        assert stub.ServerLive(service_pb2.ServerLiveRequest(), timeout=30).live
        x = cnn_input(1, 0)
        code, message, response = grpc_call(stub, grpc_request(
            inputs=[("input", "FP32", x.shape)], raw=[x.tobytes()]))
        assert code == "OK", message
        assert raw_outputs(response)["probabilities"].shape == (1, 10)
        code, message, _ = grpc_call(stub, grpc_request(
            inputs=[("input", "FP32", [1, 3, 32, 31])], raw=[b"\0" * (3 * 32 * 31 * 4)]))
        assert code == "INVALID_ARGUMENT" and "shape [1, 3, 32, 31]" in message, message
        with pytest.raises(grpc.RpcError) as e:
            stub.ModelMetadata(service_pb2.ModelMetadataRequest(name="nope"), timeout=30)
        assert e.value.code() == grpc.StatusCode.NOT_FOUND, e.value
        channel.close()
    finally:
        stop_serve(proc)
    log.seek(0)
    text = log.read()
    for method in ("ServerLive", "ModelInfer", "ModelMetadata"):
        assert f"grpc method: /inference.GRPCInferenceService/{method}" in text, text[-4000:]
    assert "GET /v2/health/ready" in text, text[-4000:]


@pytest.mark.parametrize("option", [["--workers", "2"], ["--workers=auto"], ["--batcher", "device"],
                                    ["--worker-devices", "all"], ["--sched-batch"]])
def test_the_python_servers_options_are_unknown_options(tmp_path, cnn_engine, option):
    """The options of the Python server that `kiln serve` was (deleted: the C++ server has
    --contexts, --devices and its dynamic batcher instead) get the CLI's one-line error for an
    unknown option, before any model loads."""
    cnn_engine.save(tmp_path / "m.kiln")
    p = subprocess.run([sys.executable, "-m", "kiln.cli", "serve", str(tmp_path), *option],
                       capture_output=True, text=True, env=serve_env(), timeout=120)
    assert p.returncode == 1, p.stderr
    lines = p.stderr.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("kiln: error: ") and "not expected" in lines[0]
    assert option[0].split("=")[0] in lines[0], lines


def test_full_queue_is_429_and_sigterm_drains(models_dir, tmp_path):
    """The C++ server with one context, a queue of 2 and a 5 s delay (waited out even when idle):
    of four concurrent requests two wait in the queue and two get a 429 saying so; SIGTERM then
    answers the two queued at once (their batch runs without waiting out the delay), and the
    process exits 0."""
    (tmp_path / "repo").mkdir()
    repo = serve_repo(models_dir, tmp_path / "repo", max_batch=4)
    http_port = free_port()
    log = open(tmp_path / "serve.log", "w+")
    proc = subprocess.Popen(
        [sys.executable, "-m", "kiln.cli", "serve", str(repo), "--host", "127.0.0.1",
         "--http-port", str(http_port), "--no-grpc", "--contexts", "1", "--max-queue", "2",
         "--batch-delay-ms", "5000", "--delay-when-idle", "--no-warmup"],
        stdout=log, stderr=subprocess.STDOUT, env=serve_env())
    server = {"http": f"127.0.0.1:{http_port}", "proc": proc}
    try:
        wait_ready(proc, server["http"], log)
        results = [None] * 4

        def one(i):
            results[i] = post(server, "/v2/models/mlp/infer",
                              v2_body([1, 64], name="x", data=[0.1 * i] * 64))

        threads = [threading.Thread(target=one, args=(i,)) for i in range(4)]
        for t in threads:
            t.start()
        deadline = time.time() + 30
        while sum(r is not None for r in results) < 2 and time.time() < deadline:
            time.sleep(0.05)
        refused = [r for r in results if r is not None]
        assert len(refused) == 2 and all(r[0] == 429 for r in refused), results
        assert all("--max-queue" in json.loads(r[1])["error"] for r in refused), refused
        t0 = time.time()
        proc.send_signal(signal.SIGTERM)
        for t in threads:
            t.join(timeout=30)
        assert time.time() - t0 < 4, "the drain waited out the batch delay"
        answered = [r for r in results if r[0] == 200]
        assert len(answered) == 2, results
        assert all(json.loads(r[1])["outputs"][0]["shape"] == [1, 10] for r in answered)
        assert proc.wait(timeout=30) == 0
        log.seek(0)
        assert "draining" in log.read()
    finally:
        if proc.poll() is None:
            proc.kill()
