"""Shared fixtures of the Python package's tests: the package from the build tree (or an
installed one), the small ONNX models of scripts/models/small_models.py, and engines built from
them on the cpu backend."""
import os
import sys

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
