"""kiln.kserve: kiln engines served by KServe's own ModelServer (`python -m kiln.kserve`, a
subprocess on free ports of 127.0.0.1, stopped at the end), on the cpu backend. Triton's clients
(REST, binary and JSON tensors, and gRPC) get what the engine gives run directly
(kiln.load + Context.run); model metadata lists the engine's inputs and outputs; a bad request
is a 4xx (gRPC: INVALID_ARGUMENT) with a message naming what is wrong, and the server goes on
serving. The server runs in a process of its own: kserve and tritonclient.grpc register the same
protobuf messages and cannot share one, so this process never imports kserve."""
import importlib.util
import json
import subprocess
import sys
import time
import urllib.error
import urllib.request

import numpy as np
import pytest
from conftest import free_port, rel_l2, serve_env, serve_repo, stop_serve

import kiln

if importlib.util.find_spec("kserve") is None:
    pytest.skip("kserve is not installed (scripts/setup.sh installs it)", allow_module_level=True)
httpclient = pytest.importorskip("tritonclient.http", reason="tritonclient is not installed "
                                 "(scripts/setup.sh installs it)")
grpcclient = pytest.importorskip("tritonclient.grpc")
from tritonclient.utils import InferenceServerException  # noqa: E402

START_S = 120  # KServe's imports and the engines' loads on a busy 2-core machine


def start_kserve(tmp_path, *args):
    """`python -m kiln.kserve ARGS` on free ports of 127.0.0.1, its output in tmp_path; returns
    {"http", "grpc", "proc", "log"} once /v2/health/ready answers 200, or fails the test with
    the log's end when it exits first or is not ready within START_S."""
    http, grpc_port = free_port(), free_port()
    log = open(tmp_path / "kserve.log", "w+")
    proc = subprocess.Popen([sys.executable, "-m", "kiln.kserve", *args, "--http_port", str(http),
                             "--grpc_port", str(grpc_port), "--configure_logging", "false"],
                            stdout=log, stderr=subprocess.STDOUT, env=serve_env())
    deadline = time.time() + START_S
    while True:
        try:
            with urllib.request.urlopen(f"http://127.0.0.1:{http}/v2/health/ready", timeout=2) as r:
                if r.status == 200:
                    break
        except (urllib.error.URLError, ConnectionError, OSError):
            pass
        if proc.poll() is not None or time.time() > deadline:
            proc.kill()
            proc.wait(30)
            log.seek(0)
            pytest.fail(f"python -m kiln.kserve did not start:\n{log.read()[-4000:]}")
        time.sleep(0.3)
    return {"http": f"127.0.0.1:{http}", "grpc": f"127.0.0.1:{grpc_port}", "proc": proc,
            "log": log}


@pytest.fixture(scope="module")
def repo(models_dir, tmp_path_factory):
    return serve_repo(models_dir, tmp_path_factory.mktemp("repo"), max_batch=8)


@pytest.fixture(scope="module")
def server(repo, tmp_path_factory):
    s = start_kserve(tmp_path_factory.mktemp("log"), "--model_dir", str(repo), "--contexts", "2")
    yield s
    stop_serve(s["proc"])
    s["log"].close()


def cnn_input(batch, seed):
    return np.random.default_rng(seed).standard_normal((batch, 3, 32, 32)).astype(np.float32)


def direct(repo, name, feeds):
    path = repo / "small_cnn.kiln" if name == "small_cnn" else repo / name / "model.kiln"
    return kiln.load(path).create_context().run(feeds)


def post(server, path, body):
    """(status, body text) of a JSON POST."""
    req = urllib.request.Request(f"http://{server['http']}{path}", data=body, method="POST",
                                 headers={"Content-Type": "application/json"})
    try:
        with urllib.request.urlopen(req, timeout=60) as r:
            return r.status, r.read().decode()
    except urllib.error.HTTPError as e:
        return e.code, e.read().decode()


def test_model_metadata_is_the_engines(server, repo):
    for name, path in (("small_cnn", repo / "small_cnn.kiln"), ("mlp", repo / "mlp" / "model.kiln")):
        with urllib.request.urlopen(f"http://{server['http']}/v2/models/{name}", timeout=30) as r:
            meta = json.loads(r.read())
        e = kiln.load(path)
        assert meta["name"] == name
        for got, infos in ((meta["inputs"], e.inputs), (meta["outputs"], e.outputs)):
            assert [(t["name"], t["datatype"]) for t in got] == [
                (t.name, {"float32": "FP32", "int64": "INT64"}[t.dtype]) for t in infos]
            assert [t["shape"] for t in got] == [
                [d if isinstance(d, int) else -1 for d in t.shape] for t in infos]
        with urllib.request.urlopen(f"http://{server['http']}/v2/models/{name}/ready", timeout=30) as r:
            assert r.status == 200


@pytest.mark.parametrize("binary_in, binary_out", [(True, True), (True, False), (False, True),
                                                    (False, False)])
def test_rest_outputs_equal_the_engine_run_directly(server, repo, binary_in, binary_out):
    """Binary or JSON tensors each way. A body of JSON alone needs its Content-Type, which
    Triton's client does not send: KServe's ModelServer takes a body without it for binary
    tensors and asks for their header length (a 400 otherwise)."""
    client = httpclient.InferenceServerClient(server["http"])
    headers = None if binary_in else {"Content-Type": "application/json"}
    for batch in (1, 3):
        x = cnn_input(batch, 10 * batch + binary_in)
        want = direct(repo, "small_cnn", {"input": x})["probabilities"]
        inp = httpclient.InferInput("input", list(x.shape), "FP32")
        inp.set_data_from_numpy(x, binary_data=binary_in)
        out = httpclient.InferRequestedOutput("probabilities", binary_data=binary_out)
        got = client.infer("small_cnn", [inp], outputs=[out], headers=headers)
        assert (got.get_output("probabilities").get("data") is None) == binary_out
        got = got.as_numpy("probabilities")
        assert got.shape == want.shape and rel_l2(got, want) < 1e-6


def test_grpc_outputs_equal_the_engine_run_directly(server, repo):
    client = grpcclient.InferenceServerClient(server["grpc"])
    x = cnn_input(2, 5)
    inp = grpcclient.InferInput("input", list(x.shape), "FP32")
    inp.set_data_from_numpy(x)
    got = client.infer("small_cnn", [inp]).as_numpy("probabilities")
    want = direct(repo, "small_cnn", {"input": x})["probabilities"]
    assert got.shape == want.shape and rel_l2(got, want) < 1e-6
    x = np.random.default_rng(6).standard_normal((4, 64)).astype(np.float32)
    inp = grpcclient.InferInput("x", list(x.shape), "FP32")
    inp.set_data_from_numpy(x)
    got = client.infer("mlp", [inp]).as_numpy("y")
    assert rel_l2(got, direct(repo, "mlp", {"x": x})["y"]) < 1e-6


def test_concurrent_requests_each_get_their_own_answer(server, repo):
    """12 clients at once over the model's 2 contexts: every answer is its own input's."""
    import threading

    xs = [cnn_input(1 + i % 3, 100 + i) for i in range(12)]
    ctx = kiln.load(repo / "small_cnn.kiln").create_context()
    want = [ctx.run({"input": x})["probabilities"] for x in xs]
    got, errors = [None] * len(xs), []

    def one(i):
        try:
            c = httpclient.InferenceServerClient(server["http"])
            inp = httpclient.InferInput("input", list(xs[i].shape), "FP32")
            inp.set_data_from_numpy(xs[i])
            got[i] = c.infer("small_cnn", [inp]).as_numpy("probabilities")
        except Exception as e:  # noqa: BLE001 - reported below
            errors.append(e)

    threads = [threading.Thread(target=one, args=(i,)) for i in range(len(xs))]
    for t in threads:
        t.start()
    for t in threads:
        t.join(timeout=120)
    assert not errors, errors
    for g, w in zip(got, want):
        assert g is not None and g.shape == w.shape and rel_l2(g, w) < 1e-6


def test_json_request_and_the_cli(server, repo, tmp_path):
    """A plain JSON request gets what `kiln run` gives for the same input."""
    x = cnn_input(1, 3)
    body = json.dumps({"id": "r1", "inputs": [{"name": "input", "shape": [1, 3, 32, 32],
                                               "datatype": "FP32", "data": x.ravel().tolist()}]})
    status, text = post(server, "/v2/models/small_cnn/infer", body.encode())
    assert status == 200, text
    doc = json.loads(text)
    assert doc["id"] == "r1" and doc["model_name"] == "small_cnn"
    out = doc["outputs"][0]
    assert out["name"] == "probabilities" and out["shape"] == [1, 10] and out["datatype"] == "FP32"
    np.save(tmp_path / "x.npy", x)
    from kiln.tools import cli_path

    r = subprocess.run([cli_path(), "run", "--engine", str(repo / "small_cnn.kiln"), "--input",
                        f"input={tmp_path / 'x.npy'}", "--save-outputs", str(tmp_path / "out")],
                       capture_output=True, text=True, timeout=120)
    assert r.returncode == 0, r.stderr
    want = np.load(tmp_path / "out" / "probabilities.npy")
    assert rel_l2(np.asarray(out["data"], np.float32).reshape(1, 10), want) < 1e-6


def v2(inputs, **extra):
    return json.dumps({"inputs": inputs, **extra}).encode()


X = [0.5] * 3072


@pytest.mark.parametrize("body, status, message", [
    (v2([{"name": "input", "shape": [1, 3, 16, 64], "datatype": "FP32", "data": X}]), 400,
     "input 'input': shape [1, 3, 16, 64], the model takes [-1, 3, 32, 32]"),
    (v2([{"name": "input", "shape": [1, 3, 32, 32], "datatype": "FP64", "data": X}]), 400,
     "input 'input': datatype FP64, the model takes FP32"),
    (v2([{"name": "image", "shape": [1, 3, 32, 32], "datatype": "FP32", "data": X}]), 400,
     "unknown input 'image' (the model's inputs: input)"),
    (v2([]), 400, "input 'input' is missing"),
    (v2([{"name": "input", "shape": [9, 3, 32, 32], "datatype": "FP32", "data": X * 9}]), 400,
     "input 'input': shape [9, 3, 32, 32] is outside the model's range (min [1, 3, 32, 32], "
     "max [8, 3, 32, 32])"),
    (v2([{"name": "input", "shape": [1, 3, 32, 32], "datatype": "FP32", "data": [1.0]}]), 400,
     "input 'input': "),
    (v2([{"name": "input", "shape": [1, 3, 32, 32], "datatype": "BYTES", "data": ["a"]}]), 400,
     "datatype BYTES is not one kiln takes"),
    (v2([{"name": "input", "shape": [1, 3, 32, 32], "datatype": "FP32", "data": X}] * 2), 400,
     "input 'input' given twice"),
    (v2([{"name": "input", "shape": [1, 3, 32, 32], "datatype": "FP32", "data": X}],
        outputs=[{"name": "logits"}]), 400,
     "unknown output 'logits' (the model's outputs: probabilities)"),
])
def test_bad_rest_requests_are_4xx_naming_what_is_wrong(server, body, status, message):
    got, text = post(server, "/v2/models/small_cnn/infer", body)
    assert got == status and message in json.loads(text)["error"], text
    got, text = post(server, "/v2/models/small_cnn/infer", v2([
        {"name": "input", "shape": [1, 3, 32, 32], "datatype": "FP32", "data": X}]))
    assert got == 200, text  # and the server goes on serving


def _binary(header, tail=b""):
    """A REST body of the binary-tensor extension: a JSON header, then raw bytes."""
    head = header if isinstance(header, bytes) else json.dumps(header).encode()
    return head + tail, str(len(head))


def _input(**fields):
    return {"inputs": [{"name": "input", "shape": [1, 3, 32, 32], "datatype": "FP32",
                        "parameters": {"binary_data_size": 12288}, **fields}]}


@pytest.mark.parametrize("body_length, message", [
    (_binary(_input(), b"\0" * 100), "malformed request: ValueError: cannot reshape array"),
    ((_binary(_input(), b"\0" * 12288)[0], "x"), "malformed request: ValueError: invalid literal"),
    (_binary({"inputs": [{"shape": [1], "datatype": "FP32",
                          "parameters": {"binary_data_size": 4}}]}, b"\0" * 4),
     "malformed request: KeyError: 'name'"),
    (_binary(_input(datatype=5), b"\0" * 12288), "malformed request: AttributeError: "),
    (_binary(_input(shape=[1e308]), b"\0" * 12288), "malformed request: TypeError: "),
    (_binary(_input(parameters={"binary_data_size": "many"}), b"\0" * 12288),
     "malformed request: TypeError: "),
    (_binary(b'"just a string"'), "malformed request: TypeError: "),
    (_binary({"outputs": []}), "malformed request: KeyError: 'inputs'"),
])
def test_malformed_binary_bodies_are_400_not_500(server, body_length, message):
    """Bodies KServe's own decoding raises on (answered 500 by KServe alone) are a 400 with
    one line naming the problem (kiln.kserve.refuse_malformed)."""
    body, length = body_length
    req = urllib.request.Request(f"http://{server['http']}/v2/models/small_cnn/infer", data=body,
                                 method="POST", headers={"Inference-Header-Content-Length": length})
    with pytest.raises(urllib.error.HTTPError) as e:
        urllib.request.urlopen(req, timeout=60)
    text = e.value.read().decode()
    assert e.value.code == 400 and json.loads(text)["error"].startswith(message), text
    assert "\n" not in json.loads(text)["error"]


def test_unknown_model_and_bad_grpc_requests(server):
    got, text = post(server, "/v2/models/nosuch/infer", v2([]))
    assert got == 404 and "nosuch" in text, text
    client = grpcclient.InferenceServerClient(server["grpc"])
    x = np.zeros((1, 3, 16, 16), np.float32)
    inp = grpcclient.InferInput("input", list(x.shape), "FP32")
    inp.set_data_from_numpy(x)
    with pytest.raises(InferenceServerException) as e:
        client.infer("small_cnn", [inp])
    assert e.value.status() == "StatusCode.INVALID_ARGUMENT", e.value
    assert "shape [1, 3, 16, 16], the model takes [-1, 3, 32, 32]" in e.value.message()
    assert server["proc"].poll() is None


def test_one_engine_under_its_name(repo, tmp_path):
    """--model_dir an engine file: one model called --model_name."""
    s = start_kserve(tmp_path, "--model_dir", str(repo / "mlp" / "model.kiln"),
                     "--model_name", "tiny", "--contexts", "1", "--enable_grpc", "false")
    try:
        x = np.random.default_rng(2).standard_normal((2, 64)).astype(np.float32)
        body = v2([{"name": "x", "shape": [2, 64], "datatype": "FP32", "data": x.ravel().tolist()}])
        got, text = post(s, "/v2/models/tiny/infer", body)
        assert got == 200, text
        out = json.loads(text)["outputs"][0]
        want = direct(repo, "mlp", {"x": x})["y"]
        assert rel_l2(np.asarray(out["data"], np.float32).reshape(out["shape"]), want) < 1e-6
        assert post(s, "/v2/models/mlp/infer", body)[0] == 404
    finally:
        stop_serve(s["proc"])
        s["log"].close()


@pytest.mark.parametrize("what, message", [
    ("missing", "--model_dir '{path}' does not exist"),
    ("empty", "--model_dir '{path}' holds no engine"),
    ("broken", "engine"),
])
def test_a_model_dir_that_cannot_serve_is_one_line(tmp_path, what, message):
    path = tmp_path / what
    if what != "missing":
        path.mkdir()
    if what == "broken":
        (path / "model.kiln").write_bytes(b"not an engine")
    r = subprocess.run([sys.executable, "-m", "kiln.kserve", "--model_dir", str(path),
                        "--http_port", str(free_port()), "--grpc_port", str(free_port())],
                       capture_output=True, text=True, env=serve_env(), timeout=120)
    assert r.returncode == 1, r.stdout + r.stderr
    lines = r.stderr.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("kiln.kserve: error: "), r.stderr
    assert message.format(path=path) in lines[0], lines
