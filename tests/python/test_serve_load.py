"""`kiln serve`'s --devices and --pad-batches, and bench/serve_load.py (the GPU load and soak
tests' driver), on the cpu backend: a device that does not exist, padded batches on /metrics,
the load generator's counting of bad requests, and a short soak against a live server in which
every kind of bad request is a 4xx with a message and every good answer matches the engine's
own. (The option parsing and the padding itself: tests/serve/test_serve_batcher.cpp.)"""
import importlib.util
import json
import os
import signal
import socket
import subprocess
import sys
import time
import urllib.error
import urllib.request

import numpy as np
import pytest
from conftest import ROOT

import kiln

_spec = importlib.util.spec_from_file_location("serve_load", os.path.join(ROOT, "bench", "serve_load.py"))
serve_load = importlib.util.module_from_spec(_spec)
_spec.loader.exec_module(serve_load)


# ---- --devices -------------------------------------------------------------------------------
def test_kiln_serve_refuses_a_device_that_does_not_exist(tmp_path, cnn_engine):
    cnn_engine.save(tmp_path / "m.kiln")
    p = subprocess.run([sys.executable, "-m", "kiln.cli", "serve", str(tmp_path), "--devices",
                        str(kiln.device_count() + 3)], capture_output=True, text=True,
                       env=_env(), timeout=120)
    assert p.returncode == 1 and "does not exist" in p.stderr, p.stderr


def test_load_refuses_bad_devices(tmp_path, cnn_engine):
    cnn_engine.save(tmp_path / "m.kiln")
    with pytest.raises(kiln.KilnValueError, match="device"):
        kiln.load(tmp_path / "m.kiln", device=-1)
    with pytest.raises(kiln.KilnValueError, match="device"):
        kiln.load(tmp_path / "m.kiln", device="0")
    assert kiln.load(tmp_path / "m.kiln").device is None
    assert kiln.load(tmp_path / "m.kiln", device=0).device is None  # a cpu engine: no device


# ---- bench/serve_load.py's pieces ---------------------------------------------------------------
def test_load_generator_refuses_other_hosts():
    assert serve_load.local_address("127.0.0.1:8080") == "127.0.0.1:8080"
    assert serve_load.local_address("[::1]:8081") == "[::1]:8081"
    for addr in ["10.0.0.1:8080", "example.com:80", "0.0.0.0:8080", "127.0.0.1"]:
        with pytest.raises(SystemExit, match="local"):
            serve_load.local_address(addr)


class _E(Exception):
    def __init__(self, status, msg):
        self._s, self._m = status, msg

    def status(self):
        return self._s

    def message(self):
        return self._m


@pytest.mark.parametrize("status, cls", [
    ("400", "4xx"), ("404", "4xx"), ("413", "4xx"), ("500", "5xx"), ("503", "5xx"),
    ("StatusCode.INVALID_ARGUMENT", "4xx"), ("StatusCode.NOT_FOUND", "4xx"),
    ("StatusCode.RESOURCE_EXHAUSTED", "4xx"), ("StatusCode.INTERNAL", "5xx"),
    ("StatusCode.UNKNOWN", "5xx"), ("StatusCode.UNAVAILABLE", "5xx"), (None, "other")])
def test_status_classes(status, cls):
    assert serve_load._status(_E(status, "what"))[0] == cls


def test_http_answers():
    assert serve_load._http_answer(400, '{"error": "input x"}') == ("4xx", "400 input x")
    assert serve_load._http_answer(413, '{"error": "too big"}')[0] == "4xx"
    assert serve_load._http_answer(500, "Internal Server Error")[0] == "5xx"
    assert serve_load._http_answer(0, "")[0] == "other"


def test_formed_batch_from_metrics():
    before = {"kiln_inferences_total": 10, "kiln_samples_total": 10, "batch": {1: 10}, "device": {"cuda:0": 10}}
    after = {"kiln_inferences_total": 16, "kiln_samples_total": 110, "kiln_padded_samples_total": 6,
             "batch": {1: 10, 16: 2, 32: 1, 4: 3}, "device": {"cuda:0": 13, "cuda:1": 3}}
    f = serve_load.formed(before, after)
    assert f["formed_batch_mean"] == round(100 / 6, 2)
    assert f["run_batch_mode"] == 16 and f["per_batch"] == {4: 3, 16: 2, 32: 1}
    assert f["per_device"] == {"cuda:0": 3, "cuda:1": 3}
    before["kiln_requests_total"], after["kiln_requests_total"] = 5, 11
    assert serve_load.formed(before, after)["requests_served"] == 6


def test_growth_after_settling():
    rows = [{"t_s": t, "rss_mb": v} for t, v in [(0, 100), (30, 300), (60, 310), (90, 312), (120, 311)]]
    assert serve_load.growth(rows, "rss_mb", 60) == 2
    assert serve_load.growth(rows, "rss_mb", 200) is None


# ---- against a live server ------------------------------------------------------------------------
def _env():
    return dict(os.environ, PYTHONPATH=os.pathsep.join(
        [os.path.dirname(os.path.dirname(kiln.__file__)), os.environ.get("PYTHONPATH", "")]))


def _free_port():
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


@pytest.fixture(scope="module")
def padded_server(models_dir, tmp_path_factory):
    pytest.importorskip("tritonclient.grpc", reason="tritonclient is not installed")
    repo = tmp_path_factory.mktemp("repo")
    engine = repo / "small_cnn.kiln"
    kiln.build(str(models_dir / "small_cnn.onnx"), backend="cpu",
               min_shapes={"input": [1, 3, 32, 32]}, opt_shapes={"input": [8, 3, 32, 32]},
               max_shapes={"input": [16, 3, 32, 32]}).save(engine)
    http, grpc = _free_port(), _free_port()
    log = open(tmp_path_factory.mktemp("log") / "serve.log", "w+")
    proc = subprocess.Popen(
        [sys.executable, "-m", "kiln.cli", "serve", str(repo), "--host", "127.0.0.1",
         "--http-port", str(http), "--grpc-port", str(grpc), "--contexts", "2",
         "--batch-delay-ms", "5", "--pad-batches", "1,2,4,8,16"],
        stdout=log, stderr=subprocess.STDOUT,
        # the memory log and malloc_trim every second (test_memory_log_and_trims)
        env=dict(_env(), KILN_SERVE_MEMORY_LOG="1", KILN_SERVE_TRIM_S="1"))
    deadline = time.time() + 90
    while True:
        try:
            with urllib.request.urlopen(f"http://127.0.0.1:{http}/v2/health/ready", timeout=2):
                break
        except (urllib.error.URLError, ConnectionError, OSError):
            pass
        if proc.poll() is not None or time.time() > deadline:
            log.seek(0)
            proc.kill()
            pytest.fail(f"kiln serve did not start:\n{log.read()[-4000:]}")
        time.sleep(0.5)
    yield {"http": f"127.0.0.1:{http}", "grpc": f"127.0.0.1:{grpc}", "engine": engine,
           "proc": proc, "log": log}
    proc.send_signal(signal.SIGTERM)
    try:
        proc.wait(timeout=60)
    except subprocess.TimeoutExpired:
        proc.kill()


def test_padded_batches_on_metrics(padded_server):
    from concurrent.futures import ThreadPoolExecutor

    import tritonclient.http as httpclient

    rng = np.random.default_rng(3)
    xs = [rng.standard_normal((1, 3, 32, 32)).astype(np.float32) for _ in range(6)]

    def one(x):
        c = httpclient.InferenceServerClient(padded_server["http"])
        return serve_load._infer(httpclient, c, "small_cnn", {"input": x}).as_numpy("probabilities")

    with ThreadPoolExecutor(6) as pool:
        got = list(pool.map(one, xs))
    ctx = kiln.load(padded_server["engine"]).create_context()
    for x, g in zip(xs, got):
        np.testing.assert_allclose(g, ctx.run({"input": x})["probabilities"], rtol=1e-5, atol=1e-6)
    m = serve_load.scrape(padded_server["http"], "small_cnn")
    assert m["batch"] and set(m["batch"]) <= {1, 2, 4, 8, 16}, m
    assert m["kiln_samples_total"] >= 6
    assert m["device"] == {"cpu": m["kiln_inferences_total"]}


def test_load_run_reports_rows(padded_server, tmp_path):
    # --max-requests: a bound per client that the C++ server does not reach within the 0.3 s
    # warm-up (at 300 a client on this small model did, and the measured window was empty)
    out = tmp_path / "load.json"
    p = subprocess.run(
        [sys.executable, os.path.join(ROOT, "bench", "serve_load.py"), "load",
         "--http", padded_server["http"], "--grpc", padded_server["grpc"], "--model", "small_cnn",
         "--clients", "1,4", "--duration", "1.5", "--warmup", "0.3", "--max-requests", "3000",
         "--procs", "1", "--json", str(out)], capture_output=True, text=True, env=_env(), timeout=240)
    assert p.returncode == 0, p.stdout[-3000:] + p.stderr[-3000:]
    rows = json.loads(out.read_text())["rows"]
    assert [(r["protocol"], r["clients"]) for r in rows] == [("grpc", 1), ("grpc", 4), ("http", 1), ("http", 4)]
    for r in rows:
        assert r["requests"] > 0 and r["p50_ms"] > 0 and r["p99_ms"] >= r["p50_ms"] and not r["errors"]
        assert r["inferences"] > 0 and r["run_batch_mode"] in (1, 2, 4, 8, 16)
    assert "| setup | model |" in p.stdout


def test_soak_bad_requests_are_4xx_and_answers_match(padded_server, tmp_path):
    out = tmp_path / "soak.json"
    p = subprocess.run(
        [sys.executable, os.path.join(ROOT, "bench", "serve_load.py"), "soak",
         "--http", padded_server["http"], "--grpc", padded_server["grpc"], "--model", "small_cnn",
         "--engine", str(padded_server["engine"]), "--clients", "4", "--duration", "6",
         "--bad-rate", "0.4", "--procs", "1", "--server-pid", str(padded_server["proc"].pid),
         "--sample-every", "1", "--settle", "2", "--tolerance", "1e-4",
         "--json", str(out), "--csv", str(tmp_path / "soak.csv"), "--png", str(tmp_path / "soak.png")],
        capture_output=True, text=True, env=_env(), timeout=300)
    s = json.loads(out.read_text())
    assert p.returncode == 0, p.stdout[-3000:] + p.stderr[-3000:]
    assert s["passed"] and s["good_ok"] > 0 and s["good_mismatch"] == 0 and s["responses_5xx"] == 0
    for kind in serve_load.BAD_KINDS:
        assert s["bad_sent"][kind] > 0 and s["bad"][kind] == {"4xx": s["bad_sent"][kind]}, (kind, s["bad"])
    assert s["samples"] and s["samples"][0]["rss_mb"] > 0
    # 6 s: too short a window for the memory verdict, which is then not judged
    assert s["rss_flat"] is None and s["rss_slope_bound_mb_per_min"] == 5.0
    refs = s["references"]
    assert refs["batch_sizes"] == [1, 2, 4, 8, 16] and refs["allowed"] == [1e-4] * 8
    # (small_cnn's softmax outputs of different inputs are close: 5e-4 apart)
    assert max(refs["batch_spread"]) < 1e-4 and refs["min_separation"] > 0
    assert s["over_base_tolerance"] == 0 and "mismatch_records" not in s
    assert (tmp_path / "soak.csv").read_text().startswith("t_s,")
    if importlib.util.find_spec("matplotlib"):
        assert (tmp_path / "soak.png").stat().st_size > 1000
    assert padded_server["proc"].poll() is None


def test_load_and_soak_through_shared_memory(padded_server, tmp_path):
    """serve_load.py's -shm protocols (Triton's system shared memory extension, src/serve/shm.*):
    rows beside the plain ones, no errors; a short soak with --shm whose every answer, read
    from the client's output region, matches the engine's, with the bad requests still 4xx;
    no region left registered or in /dev/shm."""
    import glob

    before = set(glob.glob("/dev/shm/kiln_load_*"))  # (another run's, killed, are not ours)
    out = tmp_path / "load.json"
    p = subprocess.run(
        [sys.executable, os.path.join(ROOT, "bench", "serve_load.py"), "load",
         "--http", padded_server["http"], "--grpc", padded_server["grpc"], "--model", "small_cnn",
         "--protocols", "grpc,grpc-shm,http-shm", "--clients", "2", "--duration", "1",
         "--warmup", "0.3", "--max-requests", "2000", "--procs", "1", "--json", str(out)],
        capture_output=True, text=True, env=_env(), timeout=240)
    assert p.returncode == 0, p.stdout[-3000:] + p.stderr[-3000:]
    rows = json.loads(out.read_text())["rows"]
    assert [r["protocol"] for r in rows] == ["grpc", "grpc-shm", "http-shm"]
    assert all(r["requests"] > 0 and not r["errors"] for r in rows), rows
    out = tmp_path / "soak.json"
    p = subprocess.run(
        [sys.executable, os.path.join(ROOT, "bench", "serve_load.py"), "soak", "--shm",
         "--http", padded_server["http"], "--grpc", padded_server["grpc"], "--model", "small_cnn",
         "--engine", str(padded_server["engine"]), "--clients", "4", "--duration", "3",
         "--bad-rate", "0.2", "--procs", "1", "--sample-every", "1", "--settle", "1",
         "--tolerance", "1e-4", "--json", str(out)],
        capture_output=True, text=True, env=_env(), timeout=300)
    s = json.loads(out.read_text())
    assert p.returncode == 0, p.stdout[-3000:] + p.stderr[-3000:]
    assert s["passed"] and s["good_ok"] > 0 and s["good_mismatch"] == 0 and s["responses_5xx"] == 0
    import tritonclient.http as httpclient

    status = httpclient.InferenceServerClient(padded_server["http"]).get_system_shared_memory_status()
    assert status == [] and set(glob.glob("/dev/shm/kiln_load_*")) <= before


def test_memory_log_and_trims(padded_server):
    """The server of the tests above logs its memory and trims malloc's arenas every second
    (KILN_SERVE_MEMORY_LOG=1, KILN_SERVE_TRIM_S=1) and goes on serving."""
    deadline = time.time() + 10
    while True:
        padded_server["log"].seek(0)
        text = padded_server["log"].read()
        if ("malloc_trim (pid" in text and "memory (pid" in text) or time.time() > deadline:
            break
        time.sleep(0.5)
    assert "malloc_trim (pid" in text and " MB in " in text, text[-2000:]
    assert "memory (pid" in text and "malloc in use" in text, text[-2000:]
    assert padded_server["proc"].poll() is None


# ---- the soak's verdicts: memory slope, tolerance, mixed-up answers, kept mismatches ----------
def _rows(values, every=5.0):
    return [{"t_s": i * every, "rss_mb": v} for i, v in enumerate(values)]


def test_memory_verdict_is_the_slope_over_the_last_half():
    rng = np.random.default_rng(0)
    flat = _rows(5000 + rng.normal(0, 8, 121))               # 600 s, noise of +-8 MB
    ok, slope, window = serve_load.memory_verdict(flat, "rss_mb", 60, 5.0, 60)
    assert ok is True and abs(slope) < 5 and window >= 260
    growing = _rows(5000 + 0.3 * np.arange(121) * 5)           # 18 MB/min
    ok, slope, _ = serve_load.memory_verdict(growing, "rss_mb", 60, 5.0, 60)
    assert ok is False and slope == pytest.approx(18, rel=0.01)
    # the H100 soak before the fix (4 workers, RSS every minute): decelerating, 10-15 MB/min
    gpu = [{"t_s": t, "rss_mb": v} for t, v in [
        (60, 4878), (121, 4947), (181, 4983), (242, 5010), (303, 5026), (363, 5035), (424, 5035),
        (484, 5053), (544, 5067), (605, 5079)]]
    ok, slope, _ = serve_load.memory_verdict(gpu, "rss_mb", 60, 5.0, 60)
    assert ok is False and 8 < slope < 16
    # a short run is not judged (None), and neither fails the soak
    ok, _, window = serve_load.memory_verdict(_rows([100, 101, 102, 103, 104, 105], 1.0),
                                              "rss_mb", 1, 5.0, 60)
    assert ok is None and window < 60
    assert serve_load.memory_verdict(_rows([1.0, 2.0]), "rss_mb", 0, 5.0, 60)[0] is None


def test_allowed_error_and_mixed_up_answers():
    assert serve_load.allowed_error(2e-2, 3.0, None) == 2e-2
    assert serve_load.allowed_error(2e-2, 3.0, 0.001) == 2e-2
    assert serve_load.allowed_error(2e-2, 3.0, 0.01) == pytest.approx(0.03)
    rng = np.random.default_rng(1)
    base = rng.standard_normal(1000)
    # outputs of different inputs only 2% apart (as a random-weight network's can be)
    refs = [({}, {"y": (base + 0.02 * rng.standard_normal(1000)).reshape(1, -1)}) for _ in range(4)]
    own = refs[0][1]["y"]
    assert serve_load.mixed_up({"y": own * (1 + 1e-3)}, refs, 0) is None
    assert serve_load.mixed_up({"y": refs[2][1]["y"]}, refs, 0) == 2     # another request's
    assert serve_load.rel_l2(refs[2][1]["y"], own) < 0.05                 # under a loose tolerance
    assert serve_load.mixed_up({"y": np.zeros((1, 3))}, refs, 0) is None  # wrong shape: no nearer


def test_references_and_saved_mismatches(models_dir, tmp_path):
    engine = tmp_path / "cnn.kiln"
    kiln.build(str(models_dir / "small_cnn.onnx"), backend="cpu",
               min_shapes={"input": [1, 3, 32, 32]}, opt_shapes={"input": [4, 3, 32, 32]},
               max_shapes={"input": [8, 3, 32, 32]}).save(engine)
    specs = [("input", "FP32", [1, 3, 32, 32])]
    refs, diag, ctx = serve_load.references(str(engine), specs, 3, 1000, -1, 2e-2,
                                            reference_engine=str(engine))
    assert len(refs) == 3 and diag["batch_sizes"] == [1, 2, 4, 8]
    assert diag["fp16_error"] == [0.0, 0.0, 0.0] and diag["allowed"] == [2e-2] * 3
    assert max(diag["batch_spread"]) < 1e-5 and diag["min_separation"] > 0
    # a server's answer that is the engine's own at batch 4, and one that is another input's
    at4 = {n: np.asarray(v)[:1] for n, v in ctx.run(serve_load._rows(refs[1][0], 4)).items()}
    records = [{"ref": 1, "protocol": "grpc", "rel_l2": 0.03, "allowed": 2e-2, "failed": True,
                "mixed_up_with": None, "t_s": 1.0, "outputs": at4},
               {"ref": 0, "protocol": "http", "rel_l2": 0.9, "allowed": 2e-2, "failed": True,
                "mixed_up_with": 2, "t_s": 2.0, "outputs": refs[2][1]}]
    path = tmp_path / "mismatches.npz"
    meta = serve_load.save_mismatches(str(path), records, refs, ctx)
    assert meta[0]["best_batch_rel_l2"] < 1e-6 and meta[1]["best_batch_rel_l2"] > 1e-3
    z = np.load(path)
    saved = json.loads(str(z["records"]))
    assert [m["ref"] for m in saved] == [1, 0] and saved[1]["mixed_up_with"] == 2
    np.testing.assert_array_equal(z["input_0_input"], refs[1][0]["input"])
    np.testing.assert_array_equal(z["server_1_probabilities"], refs[2][1]["probabilities"])
    np.testing.assert_array_equal(z["reference_1_probabilities"], refs[0][1]["probabilities"])
