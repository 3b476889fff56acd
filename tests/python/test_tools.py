"""kiln.bench and kiln.compare (the CLI's reports as Python objects) and the Polygraphy runner."""
import numpy as np
import pytest
from conftest import feeds_for

import kiln


def test_bench_report(cnn_engine):
    r = kiln.bench(cnn_engine, shapes={"input": [2, 3, 32, 32]}, warmup=1, iterations=5,
                   duration=0)
    assert r["schema"] == "kiln.bench/1" and r["framework"] == "kiln"
    assert r["backend"] == "cpu" and r["batch"] == 2 and r["iterations"] >= 5
    assert 0 < r["latency_ms"]["min"] <= r["latency_ms"]["median"] <= r["latency_ms"]["max"]
    assert r["throughput_per_s"] > 0
    sweep = kiln.bench(cnn_engine, batch=[1, 4], warmup=0, iterations=3, duration=0)
    assert [x["batch"] for x in sweep["records"]] == [1, 4]


def test_bench_errors(cnn_engine):
    with pytest.raises(kiln.KilnError, match="outside the engine's profile"):
        kiln.bench(cnn_engine, shapes={"input": [64, 3, 32, 32]}, iterations=1, duration=0)


def test_compare_report(models_dir, cnn_engine):
    x = np.random.default_rng(0).standard_normal((1, 3, 32, 32)).astype(np.float32)
    r = kiln.compare(models_dir / "small_cnn.onnx", engines=[cnn_engine], precisions=["fp32"],
                     inputs={"input": x}, backend="cpu", per_layer=True, tolerance=1e-4)
    assert r["schema"] == "kiln.compare/1" and r["passed"] is True
    assert len(r["engines"]) == 2
    for e in r["engines"]:
        assert e["outputs"][0]["rel_l2"] < 1e-5 and e["per_layer"]["first_jump"] is None
    with pytest.raises(kiln.KilnError, match="unknown precision 'fp8'"):
        kiln.compare(models_dir / "small_cnn.onnx", precisions=["fp8"], backend="cpu")


def test_polygraphy_runner_beside_onnxruntime(models_dir):
    pytest.importorskip("polygraphy", reason="polygraphy is not installed (scripts/setup.sh installs it)")
    from polygraphy.backend.onnxrt import OnnxrtRunner, SessionFromOnnx
    from polygraphy.comparator import Comparator

    from kiln.polygraphy import KilnRunner

    model = str(models_dir / "tiny_transformer.onnx")
    feeds = feeds_for("tiny_transformer", 2, np.random.default_rng(1))
    loader = [feeds, feeds_for("tiny_transformer", 2, np.random.default_rng(2))]
    runners = [OnnxrtRunner(SessionFromOnnx(model)), KilnRunner(model, backend="cpu")]
    results = Comparator.run(runners, data_loader=loader)
    assert bool(Comparator.compare_accuracy(results))
