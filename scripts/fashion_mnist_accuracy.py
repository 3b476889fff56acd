#!/usr/bin/env python3
"""Top-1 of the Fashion-MNIST model (scripts/train_fashion_mnist.py) on the 10k test images, per
precision, with engines built by kiln: FP32, TF32, FP16 and INT8 (calibrated on the training
images in DIR/calib) on the cuda backend; FP32 and the INT8 reference on the cpu backend.
Prints a markdown table (and --json FILE). Usage:
  scripts/fashion_mnist_accuracy.py --data out/fashion_mnist [--backend cuda|cpu] [--kiln build/kiln]"""
import argparse
import json
import os
import subprocess
import sys
import tempfile
import time

import numpy as np


def kiln(k, *a):
    if not (os.path.isfile(k) and os.access(k, os.X_OK)):
        sys.exit(f"fashion_mnist_accuracy: no kiln program at {k} (give --kiln)")
    p = subprocess.run([k, *a], capture_output=True, text=True)
    if p.returncode != 0:
        sys.exit(f"kiln {' '.join(a)}: {p.stderr.strip()}")
    return p.stdout


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--data", default="out/fashion_mnist")
    ap.add_argument("--kiln", default="build/kiln")
    ap.add_argument("--backend", default="cuda")
    ap.add_argument("--chunk", type=int, default=1000, help="images per kiln run")
    ap.add_argument("--calib-algo", default="entropy")
    ap.add_argument("--json")
    ap.add_argument("--limit", type=int, default=0, help="only the first N test images (the cpu reference is slow)")
    a = ap.parse_args()
    onnx_path = os.path.join(a.data, "fmnist_resnet.onnx")
    for f in (onnx_path, os.path.join(a.data, "test_images.npy"), os.path.join(a.data, "test_labels.npy")):
        if not os.path.isfile(f):
            sys.exit(f"fashion_mnist_accuracy: {f} is missing (scripts/train_fashion_mnist.py writes it)")
    x = np.load(os.path.join(a.data, "test_images.npy"))
    y = np.load(os.path.join(a.data, "test_labels.npy"))
    if a.limit:
        x, y = x[: a.limit], y[: a.limit]
    # A dynamic batch, so calibration batches (64 images) and test chunks may differ in size.
    shapes = ["--min-shapes", "input:1x1x28x28", "--opt-shapes", f"input:{a.chunk}x1x28x28",
              "--max-shapes", f"input:{a.chunk}x1x28x28"]
    configs = {"fp32": ["--no-tf32"], "tf32": [], "fp16": ["--fp16"]}
    if a.backend == "cpu":
        configs = {"fp32": []}
    configs["int8"] = ["--int8", "--calib", os.path.join(a.data, "calib"), "--calib-algo", a.calib_algo,
                       "--calib-cache", os.path.join(a.data, f"calib_{a.calib_algo}.cache")]
    if a.backend == "cuda":
        configs["int8"].append("--fp16")  # FP16 where a layer does not run in INT8
        # The tuner keeps a layer float where that is faster, which on a network this small may be
        # every layer: this build pins every INT8-capable layer to INT8 kernels, so the row
        # measures the GPU's INT8 kernels (the calibration cache of the build above is reused).
        configs["int8_kernels"] = configs["int8"] + ["--layer-precisions", "*:int8"]
    rows = {}
    with tempfile.TemporaryDirectory() as d:
        for name, flags in configs.items():
            engine = os.path.join(d, f"{name}.kiln")
            t0 = time.time()
            built = kiln(a.kiln, "build", "--onnx", onnx_path, "--save-engine", engine, "--backend",
                         a.backend, *shapes, *flags)
            # How many layers really run INT8 (on the GPU the tuner keeps float where it is faster,
            # so an INT8 engine's top-1 may be mostly FP16's): printed with the result.
            summary = [ln.strip() for ln in built.splitlines() if ln.strip().startswith(("int8 ", "gpu "))]
            correct = 0
            for i in range(0, len(x) - a.chunk + 1, a.chunk):
                np.save(os.path.join(d, "x.npy"), x[i:i + a.chunk])
                out = os.path.join(d, "out")
                kiln(a.kiln, "run", "--engine", engine, "--input", f"input={os.path.join(d, 'x.npy')}",
                     "--save-outputs", out)
                logits = np.load(os.path.join(out, "logits.npy"))
                correct += int((logits.argmax(1) == y[i:i + a.chunk]).sum())
            n = len(x) // a.chunk * a.chunk
            rows[name] = {"top1": 100.0 * correct / n, "images": n, "seconds": time.time() - t0}
            if summary:
                rows[name]["build"] = summary
            print(f"{name}: {rows[name]['top1']:.2f}% ({n} images, {rows[name]['seconds']:.0f} s)", flush=True)
            for ln in summary:
                print(f"  {ln}", flush=True)
    print(f"\n| precision ({a.backend}) | top-1 % | vs fp32 |\n|---|---|---|")
    for name, r in rows.items():
        print(f"| {name} | {r['top1']:.2f} | {r['top1'] - rows['fp32']['top1']:+.2f} |")
    if a.json:
        json.dump(rows, open(a.json, "w"), indent=1)
    worst = 0.0
    for name in [k for k in rows if k.startswith("int8")]:
        gap = rows["fp32"]["top1"] - rows[name]["top1"]
        worst = max(worst, gap)
        print(f"{name}: {gap:.2f} points below FP32 (issue 10 asks for at most 0.5)")
    return 0 if worst <= 0.5 else 1


if __name__ == "__main__":
    sys.exit(main())
