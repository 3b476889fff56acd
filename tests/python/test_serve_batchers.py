"""`kiln serve --workers 2 --batcher device` on the cpu backend (kiln.serve_workers): two front-end
workers decode requests and hand their tensors through shared memory to one batcher process,
which joins the requests of both workers into one inference. Outputs equal the engine run
directly, bad requests still get a 4xx, /metrics counts as with --batcher worker, a front end or
the batcher killed mid-run is restarted and serving resumes, and nothing is left behind
(processes, /dev/shm, the supervisor's folders). Every loop is bounded; localhost only."""
import importlib.util
import json
import os
import re
import signal
import subprocess
import sys
import tempfile
import threading
import time
import urllib.error
import urllib.request

import numpy as np
import pytest
from conftest import SERVE_START_S, free_port, read_log, serve_env, serve_repo, start_serve

import kiln

grpc = pytest.importorskip("grpc", reason="grpcio is not installed (scripts/setup.sh installs it)")
pytest.importorskip("tritonclient.grpc", reason="tritonclient is not installed "
                    "(scripts/setup.sh installs it)")
if importlib.util.find_spec("kserve") is None:
    pytest.skip("kserve is not installed (scripts/setup.sh installs it)", allow_module_level=True)
if not sys.platform.startswith("linux"):
    pytest.skip("--batcher device is tested on Linux (memfd, /proc)", allow_module_level=True)

from test_serve_workers import (children, gone, grpc_infer, metrics, rest_infer,  # noqa: E402
                                wait_for)

from kiln.serve_workers import Arena  # noqa: E402

DELAY_MS = 300  # long enough that a burst of requests from both workers meets in one batch


def start(repo, log_path, *extra):
    """`kiln serve REPO --workers 2 --batcher device` on free ports, once every process is
    ready."""
    return start_serve(repo, log_path, "--workers", "2", "--batcher", "device", "--contexts", "1",
                       "--batch-delay-ms", str(DELAY_MS), *extra)


def roles(server):
    """{'batcher': [pid], 'worker': [pids]} from the supervisor's last 'ready' line and its
    children now."""
    line = [x for x in read_log(server).splitlines() if "workers ready" in x][-1]
    batchers = [int(p) for p in re.search(r"batcher processes \(pids ([\d, ]+)\)",
                                          line).group(1).split(", ")]
    kids = children(server["proc"].pid)
    return {"batcher": [p for p in kids if p in batchers],
            "worker": [p for p in kids if p not in batchers]}


def shm_state():
    return set(os.listdir("/dev/shm")) if os.path.isdir("/dev/shm") else set()


def run_dirs():
    return {d for d in os.listdir(tempfile.gettempdir()) if d.startswith("kiln-serve-run-")}


def memfds(pid):
    """The front ends' shared memories a process has mapped (distinct memfds)."""
    try:
        with open(f"/proc/{pid}/maps") as f:
            return {line.split()[4] for line in f if "memfd:kiln-serve-requests" in line}
    except OSError:
        return set()


@pytest.fixture(scope="module")
def repo(models_dir, tmp_path_factory):
    return serve_repo(models_dir, tmp_path_factory.mktemp("repo"), max_batch=8)


@pytest.fixture(scope="module")
def server(repo, tmp_path_factory):
    before = (shm_state(), run_dirs())
    s = start(repo, tmp_path_factory.mktemp("log") / "serve.log")
    s["before"] = before
    yield s
    if s["proc"].poll() is None:
        s["proc"].send_signal(signal.SIGTERM)
        try:
            s["proc"].wait(timeout=60)
        except subprocess.TimeoutExpired:
            for pid in children(s["proc"].pid):
                os.kill(pid, signal.SIGKILL)
            s["proc"].kill()
    s["log"].close()


def direct(repo, x):
    ctx = kiln.load(str(repo / "small_cnn.kiln")).create_context()
    return ctx.run({"input": x})["probabilities"]


def test_arena_allocates_first_fit_and_merges_what_is_freed():
    a = Arena(1 << 12)
    try:
        b1, b2, b3 = a.alloc(100), a.alloc(64), a.alloc(1000)
        assert (b1, b2, b3) == ((0, 128), (128, 64), (192, 1024))
        assert a.alloc(4096) is None
        a.free(b2)
        assert a.alloc(60) == (128, 64)  # the lowest hole that fits
        a.free((128, 64))
        a.free(b1)
        a.free(b3)
        assert a.free_bytes() == 4096 and a.alloc(4096) == (0, 4096)
    finally:
        a.close()


def test_forwarding_in_one_process(cnn_engine, tmp_path):
    """A front end's link and a batcher's service on one event loop (the link connects from a
    thread): a request that fits the shared memory and one that does not (its bytes follow
    the header) both come back equal to the engine run directly; a request the batcher refuses
    comes back as a RequestError; the shared memory is all free again afterwards."""
    import asyncio

    from kiln.batching import Batcher, RequestError
    from kiln.serve_workers import BatcherLink, BatcherService

    batcher = Batcher(cnn_engine, contexts=1, max_batch=8, max_delay_s=0.001)
    service = BatcherService({"small_cnn": batcher}, {"small_cnn": {}}, "cpu")
    service.listen(str(tmp_path / "b.sock"))
    link = BatcherLink(str(tmp_path / "b.sock"), 0, arena_bytes=64 << 10)  # 2 samples fit
    ctx = cnn_engine.create_context()

    async def main():
        stop = asyncio.Event()
        serving = asyncio.ensure_future(service.serve(stop))
        try:
            xs = [np.random.default_rng(k).standard_normal((b, 3, 32, 32)).astype(np.float32)
                  for k, b in enumerate([1, 2, 8, 1])]
            outs = await asyncio.gather(*[link.infer("small_cnn", {"input": x}, len(x))
                                          for x in xs])
            for x, out in zip(xs, outs):
                want = ctx.run({"input": x})["probabilities"]
                assert np.abs(out["probabilities"] - want).max() < 1e-6
            with pytest.raises(RequestError, match="model 'nope' is not served"):
                await link.infer("nope", {"input": xs[0]}, 1)
            assert link.arena.free_bytes() == link.arena.size and link.pending == {}
        finally:
            stop.set()
            await serving
    try:
        asyncio.run(asyncio.wait_for(main(), 60))
    finally:
        batcher.close()


def test_processes_and_outputs(server, repo):
    r = roles(server)
    assert len(r["batcher"]) == 1 and len(r["worker"]) == 2, r
    for i, infer in enumerate([rest_infer, grpc_infer] * 3):
        x = np.random.default_rng(i).standard_normal((1, 3, 32, 32)).astype(np.float32)
        got = infer(server, x)
        want = direct(repo, x)
        assert got.shape == want.shape and np.abs(got - want).max() < 1e-6


def test_both_workers_requests_share_one_inference(server, repo):
    """8 concurrent batch-1 requests on new connections (max batch 8): the kernel gives them to
    both workers, and the batcher process joins all 8 into one inference. A burst that lands on
    one worker only proves nothing and is sent again (at most 5 bursts)."""
    for attempt in range(5):
        before, before_workers = metrics(server)
        xs = [np.random.default_rng(100 + k).standard_normal((1, 3, 32, 32)).astype(np.float32)
              for k in range(8)]
        got, errors = [None] * 8, []
        barrier = threading.Barrier(8)

        def one(k):
            try:
                barrier.wait(timeout=30)
                got[k] = (grpc_infer if k % 2 else rest_infer)(server, xs[k])
            except Exception as e:  # noqa: BLE001 - reported below
                errors.append(e)
        threads = [threading.Thread(target=one, args=(k,)) for k in range(8)]
        for t in threads:
            t.start()
        for t in threads:
            t.join(timeout=60)
        assert not errors, errors
        for k in range(8):
            assert np.abs(got[k] - direct(repo, xs[k])).max() < 1e-6
        after, workers = metrics(server)
        took = {w: n - before_workers.get(w, 0) for w, n in workers.items()}
        assert after["kiln_requests_total"] - before.get("kiln_requests_total", 0) == 8
        if sum(1 for n in took.values() if n > 0) < 2:
            continue  # every request went to one worker
        assert after["kiln_inferences_total"] - before["kiln_inferences_total"] == 1, (took, after)
        assert after["kiln_largest_batch"] == 8
        return
    pytest.fail("5 bursts of 8 new connections each went to one worker only")


def test_bad_requests_get_a_4xx(server):
    body = json.dumps({"inputs": [{"name": "input", "shape": [1, 3, 16, 16], "datatype": "FP32",
                                   "data": [0.0] * 768}]}).encode()
    for _ in range(4):
        req = urllib.request.Request(f"http://{server['http']}/v2/models/small_cnn/infer",
                                     data=body, method="POST")
        with pytest.raises(urllib.error.HTTPError) as e:
            urllib.request.urlopen(req, timeout=10)
        assert e.value.code == 400 and "shape [1, 3, 16, 16]" in json.loads(e.value.read())["error"]
        with pytest.raises(grpc.RpcError) as e:
            grpc_infer(server, np.zeros((1, 3, 16, 16), np.float32))
        assert e.value.code() == grpc.StatusCode.INVALID_ARGUMENT
        req = urllib.request.Request(f"http://{server['http']}/v2/models/nope/infer", data=body,
                                     method="POST")
        with pytest.raises(urllib.error.HTTPError) as e:
            urllib.request.urlopen(req, timeout=10)
        assert e.value.code == 404
    with urllib.request.urlopen(f"http://{server['http']}/v2/models/small_cnn", timeout=10) as r:
        assert json.loads(r.read())["inputs"] == [
            {"name": "input", "datatype": "FP32", "shape": [-1, 3, 32, 32]}]
    assert server["proc"].poll() is None


def _client_loop(server, stop, results):
    """Requests one after another until `stop` (at most 2000), each on a new connection;
    results: (ok, error text) per request."""
    for k in range(2000):
        if stop.is_set():
            return
        x = np.full((1, 3, 32, 32), k % 7, np.float32)
        try:
            rest_infer(server, x)
            results.append((True, ""))
        except Exception as e:  # noqa: BLE001 - counted
            results.append((False, str(e)))


def test_a_front_end_killed_mid_run(server, repo):
    """SIGKILL to a front end while requests run: the supervisor restarts it, the batcher lets
    go of its shared memory, and both front ends answer again."""
    r = roles(server)
    batcher, (w0, w1) = r["batcher"][0], r["worker"]
    wait_for("the batcher maps both front ends' memory", lambda: len(memfds(batcher)) == 2, 30)
    stop, results = threading.Event(), []
    t = threading.Thread(target=_client_loop, args=(server, stop, results))
    t.start()
    try:
        wait_for("requests run", lambda: len(results) >= 3, 60)
        os.kill(w1, signal.SIGKILL)
        wait_for("the supervisor restarts the worker",
                 lambda: re.search(r"worker \d \(pid \d+\) restarted", read_log(server))
                 and len(children(server["proc"].pid)) == 3, SERVE_START_S)
        n = len(results)
        wait_for("requests run after the restart", lambda: len(results) >= n + 3, 60)
    finally:
        stop.set()
        t.join(timeout=60)
    assert re.search(rf"worker \d \(pid {w1}\) exited with signal SIGKILL; restarting it",
                     read_log(server))
    assert sum(ok for ok, _ in results) >= len(results) - 3, results[-5:]
    # the dead front end's memory is unmapped; the new one's is mapped
    wait_for("the batcher holds the live front ends' memory only",
             lambda: len(memfds(batcher)) == 2, 30)
    assert gone(w1) and not gone(w0)
    test_processes_and_outputs(server, repo)


def test_the_batcher_killed_mid_run(server):
    """SIGKILL to the batcher process: requests waiting on it fail (500), the supervisor starts
    another, and the front ends connect to it at their next requests."""
    batcher = roles(server)["batcher"][0]
    os.kill(batcher, signal.SIGKILL)
    wait_for("the supervisor restarts the batcher",
             lambda: f"batcher 0 (pid {batcher}) exited with signal SIGKILL; restarting it"
             in read_log(server) and re.search(r"batcher 0 \(pid \d+\) restarted",
                                               read_log(server)), SERVE_START_S)
    x = np.ones((1, 3, 32, 32), np.float32)
    answered, failures = 0, []
    deadline = time.time() + 60
    while answered < 6 and time.time() < deadline:  # both workers reconnect, in at most 60 s
        try:
            rest_infer(server, x)
            answered += 1
        except urllib.error.HTTPError as e:
            failures.append((e.code, e.read()[:200]))
            assert e.code == 500, failures
            time.sleep(0.2)
    assert answered == 6, failures
    for code, text in failures:
        assert b"batcher process" in text, failures


def test_sigterm_stops_everything_and_leaves_nothing(server):
    """Runs last: SIGTERM stops the front ends, then the batcher (exit 0); no process, no
    /dev/shm entry and no folder of the supervisor's is left."""
    pids = children(server["proc"].pid)
    assert len(pids) == 3
    server["proc"].send_signal(signal.SIGTERM)
    assert server["proc"].wait(timeout=60) == 0
    wait_for("every process is gone", lambda: all(gone(p) for p in pids), 30)
    assert "SIGTERM: stopping 2 workers and 1 batchers" in read_log(server)
    shm, dirs = server["before"]
    assert shm_state() - shm == set()
    assert run_dirs() - dirs == set()


def test_a_batcher_that_cannot_start_stops_the_server(tmp_path):
    (tmp_path / "repo").mkdir()
    (tmp_path / "repo" / "broken.kiln").write_bytes(b"not an engine")
    p = subprocess.run([sys.executable, "-m", "kiln.cli", "serve", str(tmp_path / "repo"),
                        "--host", "127.0.0.1", "--http-port", str(free_port()), "--grpc-port",
                        str(free_port()), "--workers", "2", "--batcher", "device"],
                       capture_output=True, text=True, env=serve_env(), timeout=SERVE_START_S)
    assert p.returncode == 1, p.stderr[-3000:]
    errors = [line for line in p.stderr.splitlines() if line.startswith("kiln: error:")]
    assert len(errors) == 1, p.stderr[-3000:]
    assert "no model could be loaded (model broken:" in errors[0]
    assert "(batcher 0 of 1 did not start; stopped the others)" in errors[0]


def test_everything_stops_when_the_supervisor_is_killed(repo, tmp_path):
    s = start(repo, tmp_path / "serve.log")
    pids = children(s["proc"].pid)
    assert len(pids) == 3
    s["proc"].kill()
    s["proc"].wait(timeout=10)
    wait_for("the front ends and the batcher stop after their supervisor was killed",
             lambda: all(gone(p) for p in pids), 60)
    log = read_log(s)
    assert "batcher 0: the supervising process is gone" in log, log[-3000:]
    assert "worker 1: the supervising process is gone" in log, log[-3000:]
    s["log"].close()
