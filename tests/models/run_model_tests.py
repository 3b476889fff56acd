#!/usr/bin/env python3
"""Model-level tests: kiln (CPU backend) against ONNX Runtime on small models.

For each model of scripts/models/small_models.py, at batch 1 and 4: build an engine with
`kiln build`, run it with `kiln run --engine` on seeded random inputs, and compare with ONNX
Runtime's output (relative L2 < 1e-5). Exit status 1 on any mismatch.
"""
import argparse
import os
import subprocess
import sys
import tempfile

import numpy as np

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, os.path.join(HERE, "..", "..", "scripts", "models"))
import small_models  # noqa: E402

try:
    import onnxruntime as ort
except ImportError:  # setup.sh installs it; say so rather than skip silently
    ort = None


def rel_l2(a, b):
    a = a.astype(np.float64)
    b = b.astype(np.float64)
    return float(np.linalg.norm(a - b) / max(np.linalg.norm(b), 1e-30))


def make_inputs(name, batch, rng):
    if name == "small_cnn":
        return {"input": rng.standard_normal((batch, 3, 32, 32)).astype(np.float32)}
    if name == "mlp":
        return {"x": rng.standard_normal((batch, 64)).astype(np.float32)}
    if name == "tiny_transformer":
        mask = np.zeros((batch, 1, 1, 8), np.float32)
        mask[..., -2:] = -10000.0
        return {"x": rng.standard_normal((batch, 8, 32)).astype(np.float32), "mask": mask}
    if name == "tiny_llm":
        pos = np.tile(np.arange(8, dtype=np.int64) + rng.integers(0, 8), (batch, 1))
        return {"x": rng.standard_normal((batch, 8, 32)).astype(np.float32), "position_ids": pos}
    raise KeyError(name)


def run(cmd):
    p = subprocess.run(cmd, capture_output=True, text=True, timeout=600)
    if p.returncode != 0:
        raise RuntimeError(f"{' '.join(cmd)} failed ({p.returncode}): {p.stderr.strip()}")
    return p.stdout


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--kiln", default="build/kiln")
    args = ap.parse_args()
    if ort is None:
        print("model tests: onnxruntime is not installed (scripts/setup.sh installs it)")
        return 1
    failures = 0
    rng = np.random.default_rng(0)
    with tempfile.TemporaryDirectory() as tmp:
        for name, fn in small_models.MODELS.items():
            model = os.path.join(tmp, name + ".onnx")
            import onnx
            onnx.save(fn(), model)
            sess = ort.InferenceSession(model, providers=["CPUExecutionProvider"])
            for opt_level in (0, 2):
                engine = os.path.join(tmp, f"{name}_O{opt_level}.kiln")
                try:
                    run([args.kiln, "build", "--onnx", model, "--save-engine", engine,
                         "--opt-level", str(opt_level)])
                except RuntimeError as e:
                    print(f"FAIL {name} -O{opt_level}: build: {e}")
                    failures += 1
                    continue
                for batch in (1, 4):
                    feeds = make_inputs(name, batch, rng)
                    cmd = [args.kiln, "run", "--engine", engine, "--save-outputs", os.path.join(tmp, "out")]
                    for k, v in feeds.items():
                        path = os.path.join(tmp, f"{k}.npy")
                        np.save(path, v)
                        cmd += ["--input", f"{k}={path}"]
                    label = f"{name} -O{opt_level} batch {batch}"
                    try:
                        run(cmd)
                    except RuntimeError as e:
                        print(f"FAIL {label}: {e}")
                        failures += 1
                        continue
                    for out in sess.get_outputs():
                        expected = sess.run([out.name], feeds)[0]
                        got = np.load(os.path.join(tmp, "out", out.name + ".npy"))
                        err = rel_l2(got, expected) if got.shape == expected.shape else float("inf")
                        ok = err < 1e-5
                        failures += not ok
                        print(f"{'ok  ' if ok else 'FAIL'} {label} output {out.name}: rel L2 {err:.2e} vs ONNX Runtime")
    print(f"model tests: {'all agree with ONNX Runtime' if failures == 0 else f'{failures} FAILED'}")
    return 1 if failures else 0


if __name__ == "__main__":
    sys.exit(main())
