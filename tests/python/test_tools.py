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



def test_dwconv_bench_model_and_cache_keys(tmp_path):
    """bench/dwconv_bench.py's one-layer model is a depthwise Conv with a channel multiplier (K = 2)
    that kiln's CPU reference runs as the direct sum says, and its timing-cache reader keeps the
    fastest FP16 Conv time per tactic/variant, dropping failed candidates and other layers."""
    import importlib.util
    import os
    root = os.path.abspath(os.path.join(os.path.dirname(__file__), "..", ".."))
    spec = importlib.util.spec_from_file_location(
        "dwconv_bench", os.path.join(root, "bench", "dwconv_bench.py"))
    dw = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(dw)
    path = str(tmp_path / "dw.onnx")
    wt, bias, (ho, wo) = dw.make_model(path, 2, 8, 9, 9, 7, 2, 2)
    assert (ho, wo) == (5, 5) and wt.shape == (16, 1, 7, 7)
    x = np.random.default_rng(1).standard_normal((2, 8, 9, 9)).astype(np.float32)
    got = kiln.build(path, backend="cpu").create_context().run({"x": x})["y"]
    xp = np.pad(x, ((0, 0), (0, 0), (3, 3), (3, 3)))
    want = np.empty((2, 16, 5, 5), np.float32)
    for m in range(16):  # output channel m reads input channel m // 2
        for p in range(5):
            for q in range(5):
                win = xp[:, m // 2, 2 * p:2 * p + 7, 2 * q:2 * q + 7]
                want[:, m, p, q] = (win * wt[m, 0]).sum(axis=(1, 2)) + bias[m]
    np.testing.assert_allclose(got, want, rtol=1e-5, atol=1e-5)
    sig = ".Conv{group=8;}(2x8x9x9:float16/nhwc,)->float16/nhwc,|fp16|"
    entries = {sig + "kiln.dwconv/": 0.05, sig + "kiln.dwconv/strip4": 0.03,
               sig.replace("nhwc", "linear") + "cudnn.conv/0": 0.2,
               sig + "cudnn.conv/0": 0.4, sig + "cudnn.conv/5": -1.0,
               ".Conv{}(x)->y,|fp32|cudnn.conv/0": 0.01,
               "kiln.Reformat{}(x)->y,|fp16|reformat/": 0.001}
    assert dw.conv_times(entries) == {"kiln.dwconv": 0.05, "kiln.dwconv/strip4": 0.03,
                                      "cudnn.conv/0": 0.2}


def test_transformer_bench_new_models_on_cpu(tmp_path):
    """bench/transformer_bench.py's llama, tv_vit and timm_vit, as its --tiny --cpu accuracy part
    runs them: exported by their scripts, the exported inputs fed (Llama: input_ids and
    attention_mask with one sequence padded; the ViTs: pixel_values), kiln's CPU engine and
    PyTorch's float32 model against ONNX Runtime, every output's shape checked; torchvision's ViT
    skips the TorchScript exporter with a note instead of failing."""
    import json
    import os
    import subprocess
    import sys
    for mod in ("torch", "torchvision", "transformers", "timm", "onnxruntime"):
        pytest.importorskip(mod, reason=f"{mod} is not installed (KILN_WITH_TORCH=1 scripts/setup.sh)")
    root = os.path.abspath(os.path.join(os.path.dirname(__file__), "..", ".."))
    pkg = os.environ.get("KILN_PYTHON_DIR", os.path.join(root, "build", "python"))
    cli = os.path.join(os.path.dirname(os.path.abspath(pkg)), "kiln")
    if not os.access(cli, os.X_OK):
        pytest.skip(f"no kiln command line at {cli}")
    seq = 12

    def bench(out, models, exporters):
        p = subprocess.run(
            [sys.executable, os.path.join(root, "bench", "transformer_bench.py"), "--kiln", cli,
             "--out", str(tmp_path / out), "--work", str(tmp_path / "work"),
             "--onnx-dir", str(tmp_path / "models"), "--models", models, "--exporters", exporters,
             "--parts", "export,accuracy", "--tiny", "--cpu", "--seq", str(seq)],
            capture_output=True, text=True, timeout=600)
        assert p.returncode == 0, p.stdout + p.stderr
        with open(tmp_path / out / "transformers.json") as f:
            return p.stdout, json.load(f)

    # torchvision's ViT: TorchScript is said to be skipped, dynamo runs; the other two (TorchScript,
    # the quicker export) in a second run.
    out, res = bench("tv", "tv_vit", "torchscript,dynamo")
    assert "torchscript exporter skipped" in out and "dynamo only" in out
    assert res["skipped"] == [{"model": "tv_vit", "exporter": "torchscript",
                               "why": "torchvision's ViT: its TorchScript export fails in PyTorch, dynamo only"}]
    rows = res["accuracy"]
    _, res = bench("lt", "llama,timm_vit", "torchscript")
    rows += res["accuracy"]
    assert not res.get("failures") and not res["skipped"]
    got = {(r["model"], r["exporter"]): r for r in rows}
    assert sorted(got) == [("llama", "torchscript"), ("timm_vit", "torchscript"), ("tv_vit", "dynamo")]
    assert got["llama", "torchscript"]["shape"] == [2, seq, 1000]  # logits for every position
    assert got["tv_vit", "dynamo"]["shape"] == got["timm_vit", "torchscript"]["shape"] == [2, 1000]
    for r in rows:
        assert r["precision"] == "fp32" and r["output"] == "logits"
        assert r["kiln_fp32"] < 1e-4 and r["torch_fp32"] < 1e-4, r


def test_transformer_bench_precisions_on_cpu(tmp_path):
    """bench/transformer_bench.py's precisions part with --tiny --cpu: GPT-2's FP32 and INT8 CPU
    engines (INT8 calibrated on random token sequences, the cache written), each against a strict
    FP32 engine on held-out sequences; FP16 is skipped with a note (no FP16 on the cpu backend)."""
    import json
    import os
    import subprocess
    import sys
    for mod in ("torch", "transformers", "onnxruntime"):
        pytest.importorskip(mod, reason=f"{mod} is not installed (KILN_WITH_TORCH=1 scripts/setup.sh)")
    root = os.path.abspath(os.path.join(os.path.dirname(__file__), "..", ".."))
    pkg = os.environ.get("KILN_PYTHON_DIR", os.path.join(root, "build", "python"))
    cli = os.path.join(os.path.dirname(os.path.abspath(pkg)), "kiln")
    if not os.access(cli, os.X_OK):
        pytest.skip(f"no kiln command line at {cli}")
    p = subprocess.run(
        [sys.executable, os.path.join(root, "bench", "transformer_bench.py"), "--kiln", cli,
         "--out", str(tmp_path / "out"), "--work", str(tmp_path / "work"),
         "--onnx-dir", str(tmp_path / "models"), "--models", "gpt2", "--exporters", "torchscript",
         "--parts", "export,precisions", "--precisions", "fp32,fp16,int8", "--tiny", "--cpu",
         "--seq", "12", "--batches", "2", "--iters", "2", "--calib-batches", "3"],
        capture_output=True, text=True, timeout=600)
    assert p.returncode == 0, p.stdout + p.stderr
    assert "fp16 skipped: the cpu backend has no FP16 kernels" in p.stdout
    with open(tmp_path / "out" / "transformers.json") as f:
        rows = {r["precision"]: r for r in json.load(f)["precisions"]}
    assert sorted(rows) == ["fp32", "int8"]
    assert rows["fp32"]["rel_l2"] == {"logits": 0.0} and rows["fp32"]["top1_agreement"] == 1.0
    assert 0 < rows["int8"]["rel_l2"]["logits"] < 0.2 and rows["int8"]["top1_agreement"] > 0.5
    assert rows["fp32"]["vs_kiln_fp32"] == 1.0 and rows["int8"]["kiln_ms"] > 0
    assert os.path.exists(tmp_path / "work" / "calib_gpt2_b2.cache")
