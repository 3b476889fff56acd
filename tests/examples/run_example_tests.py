#!/usr/bin/env python3
"""The C++ examples (examples/), built against an installed kiln, on the cpu backend (CI) or
the cuda backend (a GPU machine):

- classify: its top-5 on an image equals the arg sort of the softmax of `kiln run`'s output on
  the same image with the same preprocessing flags, for FP32 and INT8 (and on cuda FP16)
  engines of a small CNN that ends in logits, and of one that ends in a softmax already; bad
  input gives one line and exit 1.
- batch_csv: its predictions CSV, for a dynamic-batch MLP and the small CNN in batches of N,
  equals ONNX Runtime's outputs on the same rows; no host<->device copies on the cpu backend,
  one each way a batch on cuda; bad input gives one line and exit 1.

  tests/examples/run_example_tests.py --kiln build/install/bin/kiln --examples build/examples
"""
import argparse
import csv
import os
import subprocess
import sys
import tempfile

import numpy as np
import onnx
import onnxruntime as ort
from PIL import Image

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, os.path.join(HERE, "..", "..", "scripts", "models"))
import small_models  # noqa: E402

FAILURES = []
MEAN, STD = "0.485,0.456,0.406", "0.229,0.224,0.225"
LABELS = ["airplane", "automobile", "bird", "cat", "deer", "dog", "frog", "horse", "ship", "truck"]


def check(label, ok, detail=""):
    print(f"{'ok  ' if ok else 'FAIL'} {label} {detail}".rstrip())
    if not ok:
        FAILURES.append(label)


def run(cmd):
    return subprocess.run([str(c) for c in cmd], capture_output=True, text=True, timeout=600)


def must(cmd):
    p = run(cmd)
    if p.returncode != 0:
        raise RuntimeError(f"{' '.join(map(str, cmd))} failed ({p.returncode}): {p.stderr.strip()}")
    return p.stdout


def expect_error(label, needle, cmd):
    p = run(cmd)
    lines = p.stderr.strip().splitlines()
    ok = p.returncode == 1 and len(lines) == 1 and needle in lines[0] and "error" in lines[0]
    check(f"{label}: one line, exit 1", ok, f"(rc {p.returncode}: {p.stderr.strip()[:200]})")


def softmax(x):
    e = np.exp(x.astype(np.float64) - x.max())
    return e / e.sum()


def classify_top(stdout):
    """(class, probability) rows of classify's table."""
    rows, table = [], False
    for line in stdout.splitlines():
        f = line.split()
        if f[:4] == ["rank", "class", "probability", "label"]:
            table = True
        elif table and f and f[0].isdigit():
            rows.append((int(f[1]), float(f[2]), " ".join(f[3:])))
    return rows


def classify_tests(args, p, cnn_logits, cnn_probs):
    classify = os.path.join(args.examples, "classify", "classify")
    rng = np.random.default_rng(0)
    # A 48x40 picture: smooth colour ramps and noise (resized to 37, cropped to 32x32).
    yy, xx = np.mgrid[0:40, 0:48]
    pic = np.stack([xx * 5, yy * 6, (xx + yy) * 3], -1) + rng.normal(0, 20, (40, 48, 3))
    Image.fromarray(np.clip(pic, 0, 255).astype(np.uint8)).save(p("pic.png"))
    Image.fromarray(np.clip(pic, 0, 255).astype(np.uint8)).save(p("pic.jpg"), quality=90)
    with open(p("labels.txt"), "w") as f:
        f.write("\n".join(LABELS) + "\n")
    os.makedirs(p("calib"))
    for i in range(4):
        np.save(p(f"calib/{i}.npy"), rng.uniform(-2, 2, (4, 3, 32, 32)).astype(np.float32))
    profile = ["--min-shapes", "input:1x3x32x32", "--opt-shapes", "input:4x3x32x32",
               "--max-shapes", "input:8x3x32x32"]
    engines = {
        "fp32 logits": (cnn_logits, []),
        "int8 logits": (cnn_logits, ["--int8", "--calib", f"input={p('calib')}"]),
        "fp32 softmax": (cnn_probs, []),
    }
    if args.backend == "cuda":
        engines["fp16 logits"] = (cnn_logits, ["--fp16"])
    # The same engine on the same tensor: the cpu backend gives the same bits; cuda kernels may
    # sum in another order from run to run.
    tol = 2e-6 if args.backend == "cpu" else 1e-4
    for name, (model, flags) in engines.items():
        engine = p(name.replace(" ", "_") + ".kiln")
        must([args.kiln, "build", "--onnx", model, "--backend", args.backend, "--save-engine", engine,
              *profile, *flags])
        for image in ("pic.png", "pic.jpg"):
            out = must([classify, engine, p(image), "--labels", p("labels.txt"), "--resize", "37"])
            top = classify_top(out)
            out_dir = p(f"run_{name.replace(' ', '_')}_{image}")
            must([args.kiln, "run", "--engine", engine, "--input", f"input={p(image)}", "--resize", "37",
                  "--mean", MEAN, "--std", STD, "--save-outputs", out_dir])
            (y,) = [np.load(os.path.join(out_dir, f)) for f in os.listdir(out_dir)]
            probs = y.reshape(-1).astype(np.float64)
            if name.endswith("logits"):
                probs = softmax(probs)
            want = [int(c) for c in np.argsort(-probs, kind="stable")[:5]]
            got = [c for c, _, _ in top]
            err = max((abs(pr - probs[c]) for c, pr, _ in top), default=1.0)
            check(f"classify {name} {image}: top-5 = arg sort of kiln run's", got == want and err < tol,
                  f"{got} vs {want}, max |p diff| {err:.1e}")
            check(f"classify {name} {image}: labels", [lb for _, _, lb in top] == [LABELS[c] for c in got])
            if name == "fp32 softmax" and image == "pic.png":
                check("classify: a softmax output is taken as a distribution", "already a distribution" in out)
            if name == "fp32 logits" and image == "pic.png":
                print("\n".join("    " + line for line in out.splitlines()))
    e = p("fp32_logits.kiln")
    expect_error("classify: missing image", "no such file", [classify, e, p("nope.png"), "--resize", "37"])
    open(p("junk.png"), "wb").write(b"not an image")
    expect_error("classify: not an image", "not an image", [classify, e, p("junk.png"), "--resize", "37"])
    with open(p("nine.txt"), "w") as f:
        f.write("\n".join(LABELS[:9]) + "\n")
    expect_error("classify: labels file of the wrong length", "9 labels", [classify, e, p("pic.png"), "--labels", p("nine.txt")])
    expect_error("classify: crop larger than the resize", "larger than", [classify, e, p("pic.png"), "--resize", "20"])
    expect_error("classify: bad --mean", "--mean", [classify, e, p("pic.png"), "--mean", "0.5,x"])
    expect_error("classify: missing engine", "nope.kiln", [classify, p("nope.kiln"), p("pic.png")])
    expect_error("classify: an ONNX file for an engine", "cnn_logits.onnx", [classify, cnn_logits, p("pic.png")])
    return engines


def write_csv(path, x, header=True):
    with open(path, "w") as f:
        if header:
            f.write(",".join(f"f{i}" for i in range(x.shape[1])) + "\n")
        for row in x:
            f.write(",".join(repr(float(v)) for v in row) + "\n")


def read_predictions(path):
    with open(path) as f:
        rows = list(csv.reader(f))
    header, body = rows[0], rows[1:]
    return header, np.array([[float(v) for v in r] for r in body])


def batch_csv_tests(args, p, cnn_probs):
    batch_csv = os.path.join(args.examples, "batch_csv", "batch_csv")
    rng = np.random.default_rng(1)
    onnx.save(small_models.mlp(), p("mlp.onnx"))
    cases = [("mlp", p("mlp.onnx"), "x", (64,), 37, 8, 16), ("small_cnn", cnn_probs, "input", (3, 32, 32), 10, 4, 4)]
    for name, model, inp, dims, rows, batch, max_batch in cases:
        shape = "x".join(map(str, dims))
        engine = p(f"{name}_dyn.kiln")
        must([args.kiln, "build", "--onnx", model, "--backend", args.backend, "--save-engine", engine,
              "--min-shapes", f"{inp}:1x{shape}", "--opt-shapes", f"{inp}:{batch}x{shape}",
              "--max-shapes", f"{inp}:{max_batch}x{shape}", *(["--no-tf32"] if args.backend == "cuda" else [])])
        x = rng.standard_normal((rows, int(np.prod(dims)))).astype(np.float32)
        write_csv(p(f"{name}.csv"), x)
        out = must([batch_csv, engine, p(f"{name}.csv"), p(f"{name}_pred.csv"), "--batch", batch])
        header, pred = read_predictions(p(f"{name}_pred.csv"))
        (want,) = ort.InferenceSession(model, providers=["CPUExecutionProvider"]).run(
            None, {inp: x.reshape((rows,) + dims)})
        want = want.reshape(rows, -1)
        got = pred[:, 3:]
        err = float(np.abs(got - want).max() / np.abs(want).max())
        n_batches = -(-rows // batch)
        check(f"batch_csv {name}: {rows} rows in batches of {batch} = ONNX Runtime",
              got.shape == want.shape and err < (1e-5 if args.backend == "cpu" else 1e-4)
              and list(pred[:, 0]) == list(range(rows)),
              f"max rel diff {err:.1e}")
        check(f"batch_csv {name}: prediction and score are the arg max",
              list(pred[:, 1].astype(int)) == list(want.argmax(1)) and np.allclose(pred[:, 2], want.max(1), rtol=1e-5))
        check(f"batch_csv {name}: header", header[:3] == ["row", "prediction", "score"] and len(header) == 3 + want.shape[1])
        copies = (f"transfers  0 host->device (0 bytes), 0 device->host (0 bytes)" if args.backend == "cpu" else
                  f"transfers  {n_batches} host->device ({x.nbytes} bytes), {n_batches} device->host "
                  f"({want.astype(np.float32).nbytes} bytes)")
        ok = f"batches    {n_batches} of up to {batch}" in out and copies in out and "samples/s" in out
        check(f"batch_csv {name}: {n_batches} batches, " +
              ("no host<->device copies" if args.backend == "cpu" else "one copy each way a batch"), ok,
              "" if ok else "\n" + out)
        if name == "mlp":
            print("\n".join("    " + line for line in out.splitlines()))
    e = p("mlp_dyn.kiln")
    x = rng.standard_normal((5, 64)).astype(np.float32)
    write_csv(p("short.csv"), np.concatenate([x[:, :63]]), header=False)
    expect_error("batch_csv: wrong column count", "line 1: 63 values", [batch_csv, e, p("short.csv"), p("o.csv")])
    with open(p("bad.csv"), "w") as f:
        f.write(",".join(["1.0"] * 64) + "\n" + ",".join(["1.0"] * 10 + ["abc"] + ["1.0"] * 53) + "\n")
    expect_error("batch_csv: not a number", "line 2, column 11: 'abc'", [batch_csv, e, p("bad.csv"), p("o.csv")])
    write_csv(p("ok.csv"), x)
    expect_error("batch_csv: batch beyond the profile", "16", [batch_csv, e, p("mlp.csv"), p("o.csv"), "--batch", "32"])
    expect_error("batch_csv: missing CSV", "nope.csv", [batch_csv, e, p("nope.csv"), p("o.csv")])
    expect_error("batch_csv: bad --batch", "--batch", [batch_csv, e, p("ok.csv"), p("o.csv"), "--batch", "0"])
    must([args.kiln, "build", "--onnx", p("mlp.onnx"), "--backend", args.backend, "--save-engine", p("mlp_fixed.kiln"),
          "--shapes", "x:4x64"])
    expect_error("batch_csv: an engine without a dynamic batch", "dynamic batch",
                 [batch_csv, p("mlp_fixed.kiln"), p("ok.csv"), p("o.csv")])
    expect_error("batch_csv: an image engine for a 64-column CSV", "3072", [batch_csv, p("small_cnn_dyn.kiln"), p("ok.csv"), p("o.csv")])
    classify = os.path.join(args.examples, "classify", "classify")
    expect_error("classify: an engine that takes no image", "not an NCHW float image", [classify, e, p("pic.png")])


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--kiln", required=True, help="the kiln CLI (the installed one)")
    ap.add_argument("--examples", required=True, help="build folder of examples/")
    ap.add_argument("--backend", default="cpu", choices=["cpu", "cuda"])
    args = ap.parse_args()
    with tempfile.TemporaryDirectory() as d:
        p = lambda n: os.path.join(d, n)  # noqa: E731
        # small_cnn ends in a Softmax; classify's usual case is a model that ends in logits.
        onnx.save(small_models.small_cnn(), p("cnn_probs.onnx"))
        logits = small_models.small_cnn()
        softmax_node = [n for n in logits.graph.node if n.op_type == "Softmax"][0]
        logits.graph.node.remove(softmax_node)
        logits.graph.output[0].name = softmax_node.input[0]
        onnx.save(logits, p("cnn_logits.onnx"))
        classify_tests(args, p, p("cnn_logits.onnx"), p("cnn_probs.onnx"))
        batch_csv_tests(args, p, p("cnn_probs.onnx"))
    if FAILURES:
        print(f"example tests: {len(FAILURES)} failed: {', '.join(FAILURES)}")
        return 1
    print("example tests: all passed")
    return 0


if __name__ == "__main__":
    sys.exit(main())
