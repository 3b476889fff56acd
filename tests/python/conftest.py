"""Shared fixtures of the Python package's tests: the package from the build tree (or an
installed one), the small ONNX models of scripts/models/small_models.py, and engines built from
them on the cpu backend; and what the `kiln serve` tests share: a model repository
(serve_repo), free ports, the environment a server subprocess runs in, waiting for it to be
ready and stopping it."""
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

ROOT = os.path.abspath(os.path.join(os.path.dirname(__file__), "..", ".."))
# KILN_PYTHON_DIR: the folder holding the built package (scripts/test.sh: <build>/python).
_pkg = os.environ.get("KILN_PYTHON_DIR", os.path.join(ROOT, "build", "python"))
if os.path.isdir(os.path.join(_pkg, "kiln")):
    sys.path.insert(0, _pkg)
sys.path.insert(0, os.path.join(ROOT, "scripts", "models"))

import kiln  # noqa: E402
import small_models  # noqa: E402


def gpu_reason():
    """Why the GPU tests cannot run here ('' when they can)."""
    return kiln.backend_unavailable_reason("cuda")


@pytest.fixture(scope="session")
def models_dir(tmp_path_factory):
    import onnx

    d = tmp_path_factory.mktemp("models")
    for name, fn in small_models.MODELS.items():
        onnx.save(fn(), str(d / f"{name}.onnx"))
    return d


@pytest.fixture(scope="session")
def cnn_engine(models_dir):
    """small_cnn on the cpu backend with a dynamic batch of 1..8."""
    return kiln.build(str(models_dir / "small_cnn.onnx"), backend="cpu",
                      min_shapes={"input": [1, 3, 32, 32]}, opt_shapes={"input": [4, 3, 32, 32]},
                      max_shapes={"input": [8, 3, 32, 32]})


def serve_repo(models_dir, repo, max_batch):
    """A model repository for `kiln serve` tests in `repo`: small_cnn.kiln (dynamic batch 1 to
    max_batch) and mlp/model.kiln, both for the cpu backend. Returns repo."""
    kiln.build(str(models_dir / "small_cnn.onnx"), backend="cpu",
               min_shapes={"input": [1, 3, 32, 32]}, opt_shapes={"input": [max_batch // 2, 3, 32, 32]},
               max_shapes={"input": [max_batch, 3, 32, 32]}).save(repo / "small_cnn.kiln")
    (repo / "mlp").mkdir()
    kiln.build(str(models_dir / "mlp.onnx"), backend="cpu").save(repo / "mlp" / "model.kiln")
    return repo


def free_port():
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def serve_env():
    """The environment of a `kiln serve` subprocess: this kiln package first on PYTHONPATH."""
    return dict(os.environ, PYTHONPATH=os.pathsep.join(
        [os.path.dirname(os.path.dirname(kiln.__file__)), os.environ.get("PYTHONPATH", "")]))


def wait_ready(proc, http, log, timeout=90):
    """Waits for `kiln serve` (`proc`, HTTP on `http`, output in the file `log`) to answer
    /v2/health/ready; fails the test with the log's end when it exits first or is not ready
    within `timeout` s."""
    deadline = time.time() + timeout
    while True:
        try:
            with urllib.request.urlopen(f"http://{http}/v2/health/ready", timeout=2) as r:
                if r.status == 200:
                    return
        except (urllib.error.URLError, ConnectionError, OSError):
            pass
        if proc.poll() is not None or time.time() > deadline:
            proc.kill()
            log.seek(0)
            pytest.fail(f"kiln serve did not start:\n{log.read()[-4000:]}")
        time.sleep(0.3)


def stop_serve(proc):
    """SIGTERM, then a failed test unless the server has exited within 60 s."""
    proc.send_signal(signal.SIGTERM)
    try:
        proc.wait(timeout=60)
    except subprocess.TimeoutExpired:
        proc.kill()
        pytest.fail("kiln serve did not stop within 60 s of SIGTERM")


def feeds_for(name, batch, rng):
    """Seeded inputs for a small model (as tests/models/run_model_tests.py makes them)."""
    sys.path.insert(0, os.path.join(ROOT, "tests", "models"))
    import run_model_tests

    return run_model_tests.make_inputs(name, batch, rng)


def ort_outputs(model_path, feeds):
    import onnxruntime as ort

    sess = ort.InferenceSession(str(model_path), providers=["CPUExecutionProvider"])
    return dict(zip([o.name for o in sess.get_outputs()], sess.run(None, feeds)))


def rel_l2(a, b):
    a = np.asarray(a, np.float64)
    b = np.asarray(b, np.float64)
    return float(np.linalg.norm(a - b) / max(np.linalg.norm(b), 1e-30))
