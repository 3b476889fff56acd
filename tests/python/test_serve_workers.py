"""`kiln serve --workers 2` on the cpu backend (kiln.serve_workers): both workers answer over
gRPC and REST on the same ports, /metrics sums their counters and says which worker took what,
metadata and readiness are the same whichever worker answers, a worker that fails to start
stops the server with one line and exit status 1, a worker that dies is restarted, and SIGTERM
(or the supervisor's death) leaves no worker behind. Every loop is bounded; localhost only."""
import importlib.util
import json
import os
import re
import signal
import socket
import subprocess
import sys
import time
import urllib.error
import urllib.request

import numpy as np
import pytest
from conftest import (SERVE_START_S, free_port, ort_outputs, read_log, rel_l2, serve_env,
                      serve_repo, start_serve)

grpc = pytest.importorskip("grpc", reason="grpcio is not installed (scripts/setup.sh installs it)")
pytest.importorskip("tritonclient.grpc", reason="tritonclient is not installed "
                    "(scripts/setup.sh installs it)")
if importlib.util.find_spec("kserve") is None:
    pytest.skip("kserve is not installed (scripts/setup.sh installs it)", allow_module_level=True)
if not sys.platform.startswith("linux"):
    pytest.skip("--workers is tested on Linux (SO_REUSEPORT, /proc)", allow_module_level=True)

def children(pid):
    try:
        with open(f"/proc/{pid}/task/{pid}/children") as f:
            return [int(c) for c in f.read().split()]
    except OSError:
        return []


def gone(pid):
    """Whether process `pid` has exited (a zombie nobody reaped counts)."""
    try:
        with open(f"/proc/{pid}/stat") as f:
            return f.read().rsplit(")", 1)[1].split()[0] == "Z"
    except OSError:
        return True


def wait_for(what, check, timeout):
    deadline = time.time() + timeout
    while not check():
        if time.time() > deadline:
            pytest.fail(f"{what} within {timeout} s")
        time.sleep(0.2)


def start(repo, log_path, *extra):
    """`kiln serve REPO --workers 2` on free ports; returns its info once both workers take
    connections (the supervisor's 'workers ready' line)."""
    return start_serve(repo, log_path, "--workers", "2", "--contexts", "1", "--batch-delay-ms",
                       "5", *extra)


def stop(server):
    proc = server["proc"]
    if proc.poll() is None:
        proc.send_signal(signal.SIGTERM)
        try:
            proc.wait(timeout=60)
        except subprocess.TimeoutExpired:
            for pid in children(proc.pid):
                os.kill(pid, signal.SIGKILL)
            proc.kill()
    server["log"].close()


@pytest.fixture(scope="module")
def repo(models_dir, tmp_path_factory):
    return serve_repo(models_dir, tmp_path_factory.mktemp("repo"), max_batch=8)


@pytest.fixture(scope="module")
def server(repo, tmp_path_factory):
    s = start(repo, tmp_path_factory.mktemp("log") / "serve.log")
    yield s
    stop(s)


def metrics(server):
    """kiln's counters of small_cnn: {name: value}, and per worker {worker: requests}."""
    with urllib.request.urlopen(f"http://{server['http']}/metrics", timeout=10) as r:
        text = r.read().decode()
    out, per_worker = {}, {}
    for line in text.splitlines():
        m = re.match(r'^(kiln_\w+)\{([^}]*)\} (\S+)$', line)
        if not m or 'model="small_cnn"' not in m.group(2):
            continue
        worker = re.search(r'worker="(\d+)"', m.group(2))
        if worker:
            per_worker[worker.group(1)] = float(m.group(3))
        elif "batch=" not in m.group(2) and "device=" not in m.group(2):
            out[m.group(1)] = float(m.group(3))
    return out, per_worker


def cnn_input(seed):
    return np.random.default_rng(seed).standard_normal((1, 3, 32, 32)).astype(np.float32)


def rest_infer(server, x):
    """One REST inference on a new connection (urllib opens one per request): the kernel
    gives each connection to either worker."""
    body = json.dumps({"inputs": [{"name": "input", "shape": list(x.shape), "datatype": "FP32",
                                   "data": x.ravel().tolist()}]}).encode()
    req = urllib.request.Request(f"http://{server['http']}/v2/models/small_cnn/infer", data=body,
                                 headers={"Content-Type": "application/json"}, method="POST")
    with urllib.request.urlopen(req, timeout=30) as r:
        out = json.loads(r.read())["outputs"][0]
    return np.asarray(out["data"], np.float32).reshape(out["shape"])


def grpc_infer(server, x):
    """One gRPC inference on a new channel with a connection of its own (channels of one
    process otherwise share one: grpc's global subchannel pool)."""
    from tritonclient.grpc import service_pb2, service_pb2_grpc

    with grpc.insecure_channel(server["grpc"],
                               options=[("grpc.use_local_subchannel_pool", 1)]) as channel:
        stub = service_pb2_grpc.GRPCInferenceServiceStub(channel)
        request = service_pb2.ModelInferRequest(model_name="small_cnn")
        request.inputs.add(name="input", datatype="FP32", shape=list(x.shape))
        request.raw_input_contents.append(x.tobytes())
        r = stub.ModelInfer(request, timeout=30)
    return np.frombuffer(r.raw_output_contents[0], np.float32).reshape(list(r.outputs[0].shape))


@pytest.mark.parametrize("proto", ["http", "grpc"])
def test_both_workers_answer_correctly(server, models_dir, proto):
    """Requests on new connections until each worker has answered some (at most 64: two workers
    that each take a connection half the time miss one of them 64 times in 2**63)."""
    infer = rest_infer if proto == "http" else grpc_infer
    before, before_workers = metrics(server)
    sent, seen = 0, {}
    while sent < 64:
        x = cnn_input(sent)
        got = infer(server, x)
        want = ort_outputs(models_dir / "small_cnn.onnx", {"input": x})["probabilities"]
        assert got.shape == want.shape and rel_l2(got, want) < 1e-5
        sent += 1
        if sent >= 8 and sent % 4 == 0:
            _, workers = metrics(server)
            seen = {w: n - before_workers.get(w, 0) for w, n in workers.items()}
            if len(seen) == 2 and all(n > 0 for n in seen.values()):
                break
    assert sorted(seen) == ["0", "1"] and all(n > 0 for n in seen.values()), seen
    after, workers = metrics(server)
    # /metrics, whichever worker answers it, sums the workers' counters
    assert after["kiln_requests_total"] - before.get("kiln_requests_total", 0) == sent
    assert after["kiln_requests_total"] == sum(workers.values())
    assert after["kiln_samples_total"] == after["kiln_requests_total"]


def test_metadata_and_readiness_are_the_same_from_every_worker(server):
    answers = set()
    for _ in range(12):  # new connections: both workers answer some (metrics show it above)
        for path in ("/v2/health/ready", "/v2/models", "/v2/models/small_cnn",
                     "/v2/models/mlp/ready"):
            with urllib.request.urlopen(f"http://{server['http']}{path}", timeout=10) as r:
                answers.add((path, r.status, r.read()))
    assert len(answers) == 4, answers
    answers = {path: json.loads(body) for path, _, body in answers}
    assert answers["/v2/models"] == {"models": ["mlp", "small_cnn"]}
    assert answers["/v2/models/small_cnn"]["inputs"] == [
        {"name": "input", "datatype": "FP32", "shape": [-1, 3, 32, 32]}]


def test_models_are_not_unloaded_by_one_worker(server):
    """The repository extension's unload would change one worker's models: refused (4xx)."""
    from tritonclient.grpc import service_pb2, service_pb2_grpc

    req = urllib.request.Request(
        f"http://{server['http']}/v2/repository/models/small_cnn/unload", data=b"", method="POST")
    with pytest.raises(urllib.error.HTTPError) as e:
        urllib.request.urlopen(req, timeout=10)
    assert e.value.code == 400 and "restart the server" in json.loads(e.value.read())["error"]
    with grpc.insecure_channel(server["grpc"]) as channel:
        stub = service_pb2_grpc.GRPCInferenceServiceStub(channel)
        with pytest.raises(grpc.RpcError) as e:
            stub.RepositoryModelUnload(
                service_pb2.RepositoryModelUnloadRequest(model_name="small_cnn"), timeout=10)
        assert e.value.code() == grpc.StatusCode.FAILED_PRECONDITION
        assert "restart the server" in e.value.details()
    with urllib.request.urlopen(f"http://{server['http']}/v2/models/small_cnn/ready",
                                timeout=10) as r:
        assert json.loads(r.read())["ready"] is True


def test_bad_requests_get_a_4xx_from_every_worker(server):
    body = json.dumps({"inputs": [{"name": "input", "shape": [1, 3, 16, 16], "datatype": "FP32",
                                   "data": [0.0] * 768}]}).encode()
    for _ in range(6):
        req = urllib.request.Request(f"http://{server['http']}/v2/models/small_cnn/infer",
                                     data=body, method="POST")
        with pytest.raises(urllib.error.HTTPError) as e:
            urllib.request.urlopen(req, timeout=10)
        assert e.value.code == 400 and "shape [1, 3, 16, 16]" in json.loads(e.value.read())["error"]
        with pytest.raises(grpc.RpcError) as e:
            grpc_infer(server, np.zeros((1, 3, 16, 16), np.float32))
        assert e.value.code() == grpc.StatusCode.INVALID_ARGUMENT
    assert server["proc"].poll() is None


def test_a_worker_that_dies_is_restarted(server, models_dir):
    """Runs last on the module's server: SIGKILL to one worker; the supervisor says so, starts
    another, and both answer again; the dead worker's counts stay in /metrics."""
    pids = children(server["proc"].pid)
    assert len(pids) == 2, pids
    before, _ = metrics(server)
    os.kill(pids[1], signal.SIGKILL)
    wait_for("the supervisor restarts the worker",
             lambda: "restarted" in read_log(server) and len(children(server["proc"].pid)) == 2,
             SERVE_START_S)
    assert re.search(rf"worker \d \(pid {pids[1]}\) exited with signal SIGKILL; restarting it",
                     read_log(server))
    assert set(children(server["proc"].pid)) & set(pids) == {pids[0]}
    test_both_workers_answer_correctly(server, models_dir, "http")
    after, _ = metrics(server)
    assert after["kiln_requests_total"] > before["kiln_requests_total"]


def test_sigterm_stops_every_worker(repo, tmp_path):
    s = start(repo, tmp_path / "serve.log")
    pids = children(s["proc"].pid)
    assert len(pids) == 2
    s["proc"].send_signal(signal.SIGTERM)
    assert s["proc"].wait(timeout=60) == 0
    assert all(gone(p) for p in pids), pids
    assert "SIGTERM: stopping 2 workers" in read_log(s)
    s["log"].close()


def test_workers_stop_when_the_supervisor_is_killed(repo, tmp_path):
    s = start(repo, tmp_path / "serve.log")
    pids = children(s["proc"].pid)
    s["proc"].kill()
    s["proc"].wait(timeout=10)
    wait_for("the workers stop after their supervisor was killed",
             lambda: all(gone(p) for p in pids), 60)
    assert "the supervising process is gone" in read_log(s)
    s["log"].close()


def test_a_worker_that_cannot_start_stops_the_server(tmp_path):
    (tmp_path / "repo").mkdir()
    (tmp_path / "repo" / "broken.kiln").write_bytes(b"not an engine")
    p = subprocess.run([sys.executable, "-m", "kiln.cli", "serve", str(tmp_path / "repo"),
                        "--host", "127.0.0.1", "--http-port", str(free_port()), "--grpc-port",
                        str(free_port()), "--workers", "2"],
                       capture_output=True, text=True, env=serve_env(), timeout=SERVE_START_S)
    assert p.returncode == 1, p.stderr[-3000:]
    errors = [line for line in p.stderr.splitlines() if line.startswith("kiln: error:")]
    assert len(errors) == 1, p.stderr[-3000:]
    assert "no model could be loaded (model broken:" in errors[0]
    assert "did not start; stopped the others" in errors[0]


def test_a_port_in_use_stops_the_server(repo):
    with socket.socket() as taken:
        taken.bind(("127.0.0.1", 0))
        taken.listen()
        port = taken.getsockname()[1]
        p = subprocess.run([sys.executable, "-m", "kiln.cli", "serve", str(repo), "--host",
                            "127.0.0.1", "--http-port", str(free_port()), "--grpc-port",
                            str(port), "--workers", "2"],
                           capture_output=True, text=True, env=serve_env(), timeout=SERVE_START_S)
    assert p.returncode == 1
    errors = [line for line in p.stderr.splitlines() if line.startswith("kiln: error:")]
    assert errors == [f"kiln: error: cannot listen on 127.0.0.1:{port} (gRPC): "
                      "Address already in use"], p.stderr[-3000:]


@pytest.mark.parametrize("flag,what", [("--http-port", "REST"), ("--grpc-port", "gRPC")])
def test_a_port_in_use_stops_one_process_too(repo, flag, what):
    # Without --workers the same one line, before the models load (it was a traceback, exit 3).
    with socket.socket() as taken:
        taken.bind(("127.0.0.1", 0))
        taken.listen()
        port = taken.getsockname()[1]
        ports = {"--http-port": str(free_port()), "--grpc-port": str(free_port()), flag: str(port)}
        p = subprocess.run([sys.executable, "-m", "kiln.cli", "serve", str(repo), "--host",
                            "127.0.0.1", *[x for kv in ports.items() for x in kv]],
                           capture_output=True, text=True, env=serve_env(), timeout=SERVE_START_S)
    assert p.returncode == 1, p.stderr[-3000:]
    errors = [line for line in p.stderr.splitlines() if line.startswith("kiln: error:")]
    assert errors == [f"kiln: error: cannot listen on 127.0.0.1:{port} ({what}): "
                      "Address already in use"], p.stderr[-3000:]
