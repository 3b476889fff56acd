#!/usr/bin/env python3
"""Keras-path model tests: the tf2onnx conversions of small channels-last Keras models in
tests/models/keras/*.onnx (scripts/models/keras_models.py; no TensorFlow needed here), taken
unchanged:
  - kiln's CPU backend at -O0 and -O2, one engine with a dynamic batch, against ONNX Runtime at
    batch 1 and 4: relative L2 < 1e-5;
  - `kiln compare M.onnx --tolerance 1e-5` (FP32) and `--precisions int8` calibrated on random
    .npy batches (relative L2 < 0.1);
  - the recurrent ones (keras_rnn_*: token ids with padding, or a float signal): the CPU engines
    at -O0 and -O2 against ONNX Runtime at batch 1 and 4, relative L2 < 1e-5;
  - keras_fmnist_tiny: `kiln compare --dataset` on 16 IDX images with --image-layout NHWC gives
    the top-1 ONNX Runtime gives on the same pixels; INT8 calibration on image-like data takes
    the first convolution's input (the image the model normalized itself) at its full range.
Exit status 1 on any failure.
"""
import argparse
import glob
import gzip
import json
import os
import subprocess
import sys
import tempfile

import numpy as np

HERE = os.path.dirname(os.path.abspath(__file__))

try:
    import onnxruntime as ort
except ImportError:
    ort = None

FAILURES = []


def check(label, ok, detail=""):
    print(f"{'ok  ' if ok else 'FAIL'} {label}{': ' + detail if detail else ''}")
    if not ok:
        FAILURES.append(label)


def rel_l2(a, b):
    a, b = a.astype(np.float64), b.astype(np.float64)
    return float(np.linalg.norm(a - b) / max(np.linalg.norm(b), 1e-30))


def kiln(args, *a):
    p = subprocess.run([args.kiln, *a], capture_output=True, text=True, timeout=600)
    return p.returncode, p.stdout, p.stderr.strip()


def write_idx(path, arr):
    """An IDX file (gzip), as Fashion-MNIST's: magic 0x0000 0x08 ndim, big-endian dims, uint8."""
    head = bytes([0, 0, 8, arr.ndim]) + b"".join(int(d).to_bytes(4, "big") for d in arr.shape)
    with gzip.open(path, "wb") as f:
        f.write(head + arr.astype(np.uint8).tobytes())


def engines_against_ort(args, name, path, sess, tmp, make_input, extra=()):
    """Engines at -O0 and -O2 with a dynamic batch (1-8, opt 4) against ONNX Runtime at batch 1
    and 4 on make_input(batch): relative L2 < 1e-5 for every output."""
    inp = sess.get_inputs()[0]
    rest = "x".join(str(d) for d in inp.shape[1:])
    profile = ["--min-shapes", f"{inp.name}:1x{rest}", "--opt-shapes", f"{inp.name}:4x{rest}",
               "--max-shapes", f"{inp.name}:8x{rest}"]
    for level in (0, 2):
        engine = os.path.join(tmp, f"{name}_O{level}.kiln")
        rc, _, err = kiln(args, "build", "--onnx", path, "--save-engine", engine, "--opt-level", str(level),
                          *extra, *profile)
        check(f"{name} -O{level}: kiln build of the tf2onnx model as it is", rc == 0, err)
        if rc != 0:
            continue
        for batch in (1, 4):
            x = make_input(batch)
            np.save(os.path.join(tmp, "x.npy"), x)
            out = os.path.join(tmp, "out")
            rc, _, err = kiln(args, "run", "--engine", engine, "--input", f"{inp.name}={tmp}/x.npy",
                              "--save-outputs", out)
            if rc != 0:
                check(f"{name} -O{level} batch {batch}: kiln run", False, err)
                continue
            for o in sess.get_outputs():
                want = sess.run([o.name], {inp.name: x})[0]
                got = np.load(os.path.join(out, "".join(c if c.isalnum() or c in "._-" else "_" for c in o.name) + ".npy"))
                err = rel_l2(got, want) if got.shape == want.shape else float("inf")
                check(f"{name} -O{level} batch {batch} output {o.name}", err < 1e-5, f"rel L2 {err:.2e} vs ONNX Runtime")


def model_tests(args, path, tmp, rng):
    name = os.path.splitext(os.path.basename(path))[0]
    sess = ort.InferenceSession(path, providers=["CPUExecutionProvider"])
    inp = sess.get_inputs()[0]
    dims = [d if isinstance(d, int) else None for d in inp.shape]
    if dims[0] is not None or None in dims[1:]:
        check(f"{name}: input {inp.name} {inp.shape} has a dynamic batch only", False)
        return
    engines_against_ort(args, name, path, sess, tmp,
                        lambda batch: rng.uniform(0, 1, (batch, *dims[1:])).astype(np.float32))
    rc, out, err = kiln(args, "compare", path, "--tolerance", "1e-5")
    check(f"{name}: kiln compare (fp32) on the tf2onnx model", rc == 0, err or out.strip().splitlines()[-1])
    calib = os.path.join(tmp, f"calib_{name}")
    os.makedirs(calib, exist_ok=True)
    for i in range(4):
        np.save(os.path.join(calib, f"{i:03d}.npy"), rng.uniform(0, 1, (8, *dims[1:])).astype(np.float32))
    # Inputs like the calibration data ([0,1], as images): compare's own random inputs are in [-1,1].
    np.save(os.path.join(tmp, "x8.npy"), rng.uniform(0, 1, (8, *dims[1:])).astype(np.float32))
    cj = os.path.join(tmp, f"compare_{name}.json")
    rc, out, err = kiln(args, "compare", path, "--precisions", "fp32,int8", "--backend", "cpu", "--calib", calib,
                        "--input", f"{inp.name}={tmp}/x8.npy", "--export-json", cj)
    if rc != 0:
        check(f"{name}: kiln compare --precisions fp32,int8", False, err)
    else:
        errs = {e["precision"]: max(o["rel_l2"] for o in e["outputs"]) for e in json.load(open(cj))["engines"]}
        check(f"{name}: kiln compare --precisions fp32,int8", errs.get("fp32", 1) < 1e-5 and errs.get("int8", 1) < 0.1,
              ", ".join(f"{k} rel L2 {v:.2e}" for k, v in errs.items()))
    if dims[1:] == [28, 28, 1]:
        dataset_test(args, path, sess, inp.name, tmp, rng)
        input_scale_test(args, path, inp.name, tmp, rng)


def sequence_input(inp, batch, rng):
    """Token ids (int32, 1..49, each sequence ending in 0 to 5 padding zeros) or a float signal."""
    dims = [batch] + [d for d in inp.shape[1:]]
    if "int" not in inp.type:
        return rng.standard_normal(dims).astype(np.float32)
    x = rng.integers(1, 50, dims).astype(np.int32)
    for b in range(batch):
        pad = int(rng.integers(0, 6))
        if pad:
            x[b, -pad:] = 0
    return x


def recurrent_tests(args, path, tmp, rng):
    """A recurrent model (tf2onnx: Loops over the steps, ReverseSequence for the backward
    directions): CPU engines at -O0 and -O2 with a dynamic batch against ONNX Runtime."""
    name = os.path.splitext(os.path.basename(path))[0]
    sess = ort.InferenceSession(path, providers=["CPUExecutionProvider"])
    engines_against_ort(args, name, path, sess, tmp,
                        lambda batch: sequence_input(sess.get_inputs()[0], batch, rng), ("--backend", "cpu"))


def input_scale_test(args, path, iname, tmp, rng):
    """Fashion-MNIST-like calibration images (60% background, one white pixel a batch): the first
    convolution reads the image as the model normalized it (Rescaling, then tf2onnx's NCHW
    Reshape), and its INT8 input scale is that value's full range, not entropy's clip at the
    background (docs/quantization.md)."""
    calib = os.path.join(tmp, "calib_bimodal")
    os.makedirs(calib, exist_ok=True)
    for i in range(4):
        x = np.where(rng.random((8, 28, 28, 1)) < 0.6, 0.0, rng.random((8, 28, 28, 1))).astype(np.float32)
        x[0, 0, 0, 0] = 1.0
        np.save(os.path.join(calib, f"{i:03d}.npy"), x)
    engine = os.path.join(tmp, "bimodal_int8.kiln")
    rc, _, err = kiln(args, "build", "--onnx", path, "--save-engine", engine, "--backend", "cpu", "--int8",
                      "--calib", calib, "--shapes", f"{iname}:8x28x28x1")
    if rc != 0:
        check("int8 build with image-like calibration data", False, err)
        return
    rc, out, err = kiln(args, "inspect", engine, "--json")
    convs = [layer for layer in json.loads(out)["layers"] if layer["type"] == "kiln.FusedConv"] if rc == 0 else []
    got = convs[0]["int8_scales"]["input"] if convs else float("nan")
    want = (1.0 - 0.286) / 0.353 / 127  # the model's Rescaling of a white pixel
    check("int8: the first convolution's input (the normalized image) at full range", abs(got / want - 1) < 1e-3,
          f"scale {got:.6g}, full range {want:.6g}")


def dataset_test(args, path, sess, iname, tmp, rng):
    """kiln compare --dataset on IDX files with an NHWC input: the same top-1 as ONNX Runtime on
    the same pixels (/255, no mean or std: the model normalizes itself)."""
    d = os.path.join(tmp, "idx")
    os.makedirs(d, exist_ok=True)
    pixels = rng.integers(0, 256, (16, 28, 28)).astype(np.uint8)
    probs = sess.run(None, {iname: (pixels.astype(np.float32) / 255.0)[..., None]})[0]
    # Labels: the model's own answer for the first 11, another class for the last 5.
    labels = probs.argmax(1)
    labels[11:] = (labels[11:] + 1) % probs.shape[1]
    write_idx(os.path.join(d, "t10k-images-idx3-ubyte.gz"), pixels)
    write_idx(os.path.join(d, "t10k-labels-idx1-ubyte.gz"), labels)
    cj = os.path.join(tmp, "compare_dataset.json")
    rc, out, err = kiln(args, "compare", path, "--dataset", d, "--image-layout", "NHWC", "--batch", "5",
                        "--export-json", cj)
    if rc != 0:
        check("kiln compare --dataset (IDX, NHWC input)", False, err)
        return
    top1 = json.load(open(cj))["engines"][0]["dataset"]["top1"]
    check("kiln compare --dataset (IDX, NHWC input): top-1 as ONNX Runtime's", abs(top1 - 11 / 16) < 1e-9,
          f"top-1 {top1:.4f}, expected {11 / 16:.4f}")


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--kiln", default="build/kiln")
    args = ap.parse_args()
    if ort is None:
        print("keras model tests: onnxruntime is not installed (scripts/setup.sh installs it)")
        return 1
    models = sorted(glob.glob(os.path.join(HERE, "keras", "*.onnx")))
    if not models:
        print("keras model tests: no models in tests/models/keras")
        return 1
    rng = np.random.default_rng(0)  # fixed: INT8 error on random data moves with the data
    with tempfile.TemporaryDirectory() as tmp:
        for path in models:
            if os.path.basename(path).startswith("keras_rnn_"):
                recurrent_tests(args, path, tmp, rng)
            else:
                model_tests(args, path, tmp, rng)
    print(f"keras model tests: {'all passed' if not FAILURES else f'{len(FAILURES)} FAILED'}")
    return 1 if FAILURES else 0


if __name__ == "__main__":
    sys.exit(main())
