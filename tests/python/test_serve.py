"""`kiln serve` on the cpu backend, driven by Triton's clients (tritonclient) over the Open
Inference Protocol's REST and gRPC: outputs equal ONNX Runtime's, concurrent requests share
inferences, bad requests get a 4xx with a clear message and the server keeps serving."""
import importlib.util
import json
import os
import signal
import socket
import subprocess
import sys
import threading
import time
import urllib.error
import urllib.request

import numpy as np
import pytest
from conftest import ort_outputs, rel_l2

import kiln

httpclient = pytest.importorskip("tritonclient.http", reason="tritonclient is not installed "
                                 "(scripts/setup.sh installs it)")
grpcclient = pytest.importorskip("tritonclient.grpc")
# The server runs in its own process: kserve and tritonclient.grpc register the same protobuf
# messages and cannot share one.
if importlib.util.find_spec("kserve") is None:
    pytest.skip("kserve is not installed (scripts/setup.sh installs it)", allow_module_level=True)

LIMIT = 1 << 20  # --max-request-bytes of the server under test


def free_port():
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


@pytest.fixture(scope="module")
def server(models_dir, tmp_path_factory):
    repo = tmp_path_factory.mktemp("repo")
    kiln.build(str(models_dir / "small_cnn.onnx"), backend="cpu",
               min_shapes={"input": [1, 3, 32, 32]}, opt_shapes={"input": [8, 3, 32, 32]},
               max_shapes={"input": [16, 3, 32, 32]}).save(repo / "small_cnn.kiln")
    (repo / "mlp").mkdir()
    kiln.build(str(models_dir / "mlp.onnx"), backend="cpu").save(repo / "mlp" / "model.kiln")
    http_port, grpc_port = free_port(), free_port()
    env = dict(os.environ, PYTHONPATH=os.pathsep.join(
        [os.path.dirname(os.path.dirname(kiln.__file__)), os.environ.get("PYTHONPATH", "")]))
    log = open(tmp_path_factory.mktemp("log") / "serve.log", "w+")
    proc = subprocess.Popen(
        [sys.executable, "-m", "kiln.cli", "serve", str(repo), "--host", "127.0.0.1",
         "--http-port", str(http_port), "--grpc-port", str(grpc_port), "--contexts", "2",
         "--batch-delay-ms", "50", "--max-request-bytes", str(LIMIT)],
        stdout=log, stderr=subprocess.STDOUT, env=env)
    url = f"127.0.0.1:{http_port}"
    deadline = time.time() + 90
    while True:
        try:
            with urllib.request.urlopen(f"http://{url}/v2/health/ready", timeout=2) as r:
                if r.status == 200:
                    break
        except (urllib.error.URLError, ConnectionError, OSError):
            pass
        if proc.poll() is not None or time.time() > deadline:
            log.seek(0)
            proc.kill()
            pytest.fail(f"kiln serve did not start:\n{log.read()[-4000:]}")
        time.sleep(0.5)
    yield {"http": url, "grpc": f"127.0.0.1:{grpc_port}", "proc": proc, "log": log}
    proc.send_signal(signal.SIGTERM)
    try:
        proc.wait(timeout=60)
    except subprocess.TimeoutExpired:
        proc.kill()
        pytest.fail("kiln serve did not stop within 60 s of SIGTERM")


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
    """Binary tensors are read as bytes (serving._request_from_bytes; KServe's own decoding made
    a Python list of them, ~0.1 s for ResNet-50's input), and a binary_data_size past the end of
    the body or a header length past it is a 400 saying so."""
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
