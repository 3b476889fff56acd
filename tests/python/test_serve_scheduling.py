"""`kiln serve`'s request scheduling, driven by Triton's clients over REST and gRPC: the request
parameters `priority` (with --priority-levels) and `timeout`, the gRPC client's own deadline, and
a client that goes away while its request waits. The server waits out a long batch delay even
when idle, so every request sits in the queue long enough for these to act."""
import socket
import subprocess
import sys
import time
import urllib.request

import numpy as np
import pytest
from conftest import free_port, serve_env, serve_repo, stop_serve, wait_ready

httpclient = pytest.importorskip("tritonclient.http", reason="tritonclient is not installed "
                                 "(scripts/setup.sh installs it)")
grpcclient = pytest.importorskip("tritonclient.grpc")
from tritonclient.utils import InferenceServerException  # noqa: E402

DELAY_MS = 1500  # --batch-delay-ms: how long a lone request waits in the queue


@pytest.fixture(scope="module")
def server(models_dir, tmp_path_factory):
    repo = serve_repo(models_dir, tmp_path_factory.mktemp("repo"), max_batch=8)
    http_port, grpc_port = free_port(), free_port()
    log = open(tmp_path_factory.mktemp("log") / "serve.log", "w+")
    proc = subprocess.Popen(
        [sys.executable, "-m", "kiln.cli", "serve", str(repo), "--host", "127.0.0.1",
         "--http-port", str(http_port), "--grpc-port", str(grpc_port), "--contexts", "1",
         "--batch-delay-ms", str(DELAY_MS), "--delay-when-idle", "--no-warmup",
         "--priority-levels", "2"],
        stdout=log, stderr=subprocess.STDOUT, env=serve_env())
    url = f"127.0.0.1:{http_port}"
    wait_ready(proc, url, log)
    yield {"http": url, "grpc": f"127.0.0.1:{grpc_port}", "proc": proc, "log": log}
    stop_serve(proc)


def counter(server, name):
    """A counter of /metrics for model small_cnn."""
    text = urllib.request.urlopen(f"http://{server['http']}/metrics", timeout=10).read().decode()
    for line in text.splitlines():
        if line.startswith(name + "{") and 'model="small_cnn"' in line:
            return float(line.rsplit(" ", 1)[1])
    raise AssertionError(f"{name} for small_cnn not in /metrics")


def cnn_inputs(mod, seed=0):
    x = np.random.default_rng(seed).standard_normal((1, 3, 32, 32)).astype(np.float32)
    inp = mod.InferInput("input", [1, 3, 32, 32], "FP32")
    inp.set_data_from_numpy(x)
    return [inp]


@pytest.mark.parametrize("proto", ["http", "grpc"])
def test_timeout_passed_in_the_queue(server, proto):
    """A request whose timeout (100 ms) passes while it waits out the batch delay is answered
    408 / DEADLINE_EXCEEDED with one line, and not run; one with a long timeout runs."""
    mod = httpclient if proto == "http" else grpcclient
    client = mod.InferenceServerClient(server[proto])
    before = counter(server, "kiln_timed_out_requests_total")
    t0 = time.time()
    with pytest.raises(InferenceServerException) as e:
        client.infer("small_cnn", cnn_inputs(mod), timeout=100_000)
    assert time.time() - t0 < DELAY_MS / 1000, "the request waited out the batch delay"
    status = str(e.value.status())
    assert status in ("408", "StatusCode.DEADLINE_EXCEEDED"), (status, str(e.value))
    assert "timeout passed while it waited in the queue" in str(e.value)
    assert "\n" not in e.value.message()
    assert counter(server, "kiln_timed_out_requests_total") == before + 1
    res = client.infer("small_cnn", cnn_inputs(mod), timeout=60_000_000)
    assert res.as_numpy("probabilities").shape == (1, 10)


def test_grpc_client_deadline_bounds_the_queue(server):
    """tritonclient.grpc's client_timeout is the call's deadline: the server drops the request
    from the queue when it passes instead of running it for nobody."""
    client = grpcclient.InferenceServerClient(server["grpc"])
    before = counter(server, "kiln_timed_out_requests_total")
    with pytest.raises(InferenceServerException) as e:
        client.infer("small_cnn", cnn_inputs(grpcclient), client_timeout=0.2)
    assert "Deadline" in str(e.value) or "DEADLINE" in str(e.value), str(e.value)
    deadline = time.time() + 10
    while counter(server, "kiln_timed_out_requests_total") < before + 1 and time.time() < deadline:
        time.sleep(0.05)
    assert counter(server, "kiln_timed_out_requests_total") == before + 1


@pytest.mark.parametrize("proto", ["http", "grpc"])
def test_priority_past_the_levels_is_a_client_error(server, proto):
    mod = httpclient if proto == "http" else grpcclient
    client = mod.InferenceServerClient(server[proto])
    with pytest.raises(InferenceServerException) as e:
        client.infer("small_cnn", cnn_inputs(mod), priority=3)
    assert str(e.value.status()) in ("400", "StatusCode.INVALID_ARGUMENT"), str(e.value)
    assert "priority 3 is not a level of this server's 1 to 2" in str(e.value)
    res = client.infer("small_cnn", cnn_inputs(mod), priority=1)
    assert res.as_numpy("probabilities").shape == (1, 10)


def test_client_that_goes_away_is_dropped(server):
    """A REST client that closes its connection while its request waits: the request is dropped
    (counted as cancelled), not run."""
    before = counter(server, "kiln_cancelled_requests_total")
    ran = counter(server, "kiln_inferences_total")
    body = (b'{"inputs":[{"name":"input","datatype":"FP32","shape":[1,3,32,32],"data":['
            + b",".join([b"0.5"] * 3072) + b"]}]}")
    host, port = server["http"].rsplit(":", 1)
    with socket.create_connection((host, int(port)), timeout=10) as s:
        s.sendall(b"POST /v2/models/small_cnn/infer HTTP/1.1\r\nHost: x\r\n"
                  b"Content-Type: application/json\r\nContent-Length: "
                  + str(len(body)).encode() + b"\r\n\r\n" + body)
        time.sleep(0.2)  # read and queued
    deadline = time.time() + DELAY_MS / 1000 + 10
    while counter(server, "kiln_cancelled_requests_total") < before + 1 and time.time() < deadline:
        time.sleep(0.05)
    assert counter(server, "kiln_cancelled_requests_total") == before + 1
    assert counter(server, "kiln_inferences_total") == ran
