#!/usr/bin/env python3
"""CLI tests of image inputs, `kiln compare` and `kiln report`: good runs check their numbers
against NumPy/Pillow computed here; bad input gives exit status 1 and one line on stderr."""
import argparse
import json
import os
import subprocess
import sys
import tempfile

import numpy as np
import onnx
import onnx.numpy_helper
from onnx import TensorProto, helper
from PIL import Image

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, os.path.join(HERE, "..", "..", "scripts", "models"))
sys.path.insert(0, HERE)
import small_models  # noqa: E402
from run_cli_tests import FAILURES, expect_error, expect_ok  # noqa: E402


def check(label, ok, detail=""):
    print(f"{'ok  ' if ok else 'FAIL'} {label}{': ' + detail if detail else ''}")
    if not ok:
        FAILURES.append(label)


def identity_model(shape):
    g = helper.make_graph([helper.make_node("Identity", ["x"], ["y"], name="id")], "id",
                          [helper.make_tensor_value_info("x", TensorProto.FLOAT, shape)],
                          [helper.make_tensor_value_info("y", TensorProto.FLOAT, shape)])
    m = helper.make_model(g, opset_imports=[helper.make_opsetid("", 17)])
    m.ir_version = 8
    return m


def torchvision_like(path, short, crop, mean, std):
    """Resize(short) + CenterCrop(crop) + ToTensor + Normalize, written with Pillow as
    torchvision does it (bilinear, antialiased)."""
    im = Image.open(path).convert("RGB")
    w, h = im.size
    nw, nh = (short, int(short * h / w)) if w <= h else (int(short * w / h), short)
    im = im.resize((nw, nh), Image.BILINEAR)
    top, left = int(round((nh - crop) / 2.0)), int(round((nw - crop) / 2.0))
    im = im.crop((left, top, left + crop, top + crop))
    a = np.asarray(im, np.float32) / 255.0
    return ((a - np.array(mean, np.float32)) / np.array(std, np.float32)).transpose(2, 0, 1)[None]


def image_tests(args, p):
    rng = np.random.default_rng(0)
    # A smooth picture (resampling filters differ most on noise) with some detail.
    yy, xx = np.mgrid[0:90, 0:120]
    pic = np.stack([xx * 2, yy * 2.5, (xx + yy)], -1) + rng.integers(0, 20, (90, 120, 3))
    Image.fromarray(np.clip(pic, 0, 255).astype(np.uint8)).save(p("pic.png"))
    Image.fromarray(np.clip(pic, 0, 255).astype(np.uint8)).save(p("pic.jpg"), quality=95)
    onnx.save(identity_model([1, 3, 64, 64]), p("id.onnx"))
    onnx.save(identity_model([1, 64, 64, 3]), p("id_nhwc.onnx"))
    mean, std = [0.485, 0.456, 0.406], [0.229, 0.224, 0.225]
    for ext in ("png", "jpg"):
        expect_ok(args, f"run with a .{ext} image", "run", "--onnx", p("id.onnx"), "--input", f"x={p('pic.' + ext)}",
                  "--resize", "72", "--mean", ",".join(map(str, mean)), "--std", ",".join(map(str, std)),
                  "--save-outputs", p(f"img_{ext}"))
        got = np.load(p(f"img_{ext}/y.npy"))
        want = torchvision_like(p("pic." + ext), 72, 64, mean, std)
        err = float(np.abs(got - want).max()) * 0.225  # back in [0,1] pixel units
        check(f".{ext}: kiln's Resize+CenterCrop+Normalize vs Pillow's (torchvision's recipe)",
              got.shape == want.shape and err < 4 / 255, f"max diff {err * 255:.2f}/255")
    expect_ok(args, "run with an NHWC image input", "run", "--onnx", p("id_nhwc.onnx"), "--input",
              f"x={p('pic.png')}", "--resize", "72", "--image-layout", "NHWC", "--save-outputs", p("img_nhwc"))
    nchw = np.load(p("img_png/y.npy")) * np.array(std, np.float32)[:, None, None] + np.array(mean, np.float32)[:, None, None]
    nhwc = np.load(p("img_nhwc/y.npy"))
    check("NHWC layout is the NCHW tensor transposed", np.allclose(nhwc, nchw.transpose(0, 2, 3, 1), atol=1e-5))
    open(p("junk.png"), "wb").write(b"not an image")
    expect_error(args, "image: not an image", "not a readable image", "run", "--onnx", p("id.onnx"), "--input", f"x={p('junk.png')}")
    expect_error(args, "image: missing file", "no such file", "run", "--onnx", p("id.onnx"), "--input", f"x={p('nope.jpg')}")
    expect_error(args, "image: bad --mean", "--mean", "run", "--onnx", p("id.onnx"), "--input", f"x={p('pic.png')}", "--mean", "0.5,abc")
    expect_error(args, "image: bad --resize", "--resize", "run", "--onnx", p("id.onnx"), "--input", f"x={p('pic.png')}", "--resize", "0")
    expect_error(args, "image options without an image", "image inputs", "run", "--onnx", p("id.onnx"), "--mean", "0.5")
    expect_error(args, "image: crop larger than resize", "larger than the resized image", "run", "--onnx", p("id.onnx"),
                 "--input", f"x={p('pic.png')}", "--resize", "32")


def compare_tests(args, p):
    onnx.save(small_models.small_cnn(), p("cnn.onnx"))
    # The same model with one conv's weights perturbed: an engine of it must be named there.
    m = small_models.small_cnn()
    conv = [n for n in m.graph.node if n.op_type == "Conv"][1]
    w = next(t for t in m.graph.initializer if t.name == conv.input[1])
    arr = onnx.numpy_helper.to_array(w).copy()
    arr += np.random.default_rng(1).standard_normal(arr.shape).astype(np.float32) * np.abs(arr).mean()
    w.CopyFrom(onnx.numpy_helper.from_array(arr, w.name))
    onnx.save(m, p("bad.onnx"))
    expect_ok(args, "build corrupted engine", "build", "--onnx", p("bad.onnx"), "--save-engine", p("bad.kiln"), "--backend", "cpu")
    expect_ok(args, "build engine", "build", "--onnx", p("cnn.onnx"), "--save-engine", p("cnn.kiln"), "--backend", "cpu")
    r = expect_ok(args, "compare --per-layer", "compare", p("cnn.onnx"), "--engines", f"{p('cnn.kiln')},{p('bad.kiln')}",
                  "--per-layer", "--export-json", p("cmp.json"))
    doc = json.load(open(p("cmp.json")))
    good, bad = doc["engines"]
    check("compare json: schema and a good engine near float64", doc["schema"] == "kiln.compare/1" and
          good["outputs"][0]["rel_l2"] < 1e-5 and good["per_layer"]["first_jump"] is None)
    check("compare --per-layer names the corrupted conv", bad["per_layer"]["first_jump"] == conv.name,
          f"{bad['per_layer']['first_jump']} (want {conv.name})")
    check("compare prints the first jump", f"layer '{conv.name}'" in r.stdout)
    expect_error(args, "compare --tolerance exceeded", "tolerance exceeded", "compare", p("cnn.onnx"),
                 "--engines", p("bad.kiln"), "--tolerance", "1e-3")
    expect_ok(args, "compare --tolerance met", "compare", p("cnn.onnx"), "--tolerance", "1e-5")
    # --save-outputs: the float64 reference's outputs and each engine's, under DIR/reference and
    # DIR/<engine file's name>; the engine built from the corrupted model is far from the reference.
    np.save(p("x.npy"), np.random.default_rng(3).uniform(-1, 1, (1, 3, 32, 32)).astype(np.float32))
    expect_ok(args, "compare --save-outputs", "compare", p("cnn.onnx"), "--engines", f"{p('cnn.kiln')},{p('bad.kiln')}",
              "--input", f"{m.graph.input[0].name}={p('x.npy')}", "--save-outputs", p("saved"))
    out = m.graph.output[0].name
    try:
        r64, good32, bad32 = (np.load(p(f"saved/{d}/{out}.npy")) for d in ("reference", "cnn", "bad"))
        check("compare --save-outputs: float64 reference, engines near it and the corrupted one not",
              r64.dtype == np.float64 and good32.dtype == np.float32 and
              np.abs(good32 - r64).max() < 1e-4 * np.abs(r64).max() < np.abs(bad32 - r64).max(),
              f"{r64.dtype} {good32.dtype} {np.abs(good32 - r64).max()} {np.abs(bad32 - r64).max()}")
    except OSError as e:
        check("compare --save-outputs: files written", False, str(e))
    expect_error(args, "compare unknown precision", "unknown precision", "compare", p("cnn.onnx"), "--precisions", "fp8")
    has_gpu = subprocess.run(["sh", "-c", "nvidia-smi -L"], capture_output=True).returncode == 0
    if not has_gpu:
        expect_error(args, "compare fp16 without GPU", "need the cuda backend", "compare", p("cnn.onnx"), "--precisions", "fp16")
    expect_error(args, "compare missing engine", "nope.kiln", "compare", p("cnn.onnx"), "--engines", p("nope.kiln"))
    # --precisions int8 calibrates as kiln build does (the INT8 reference on the cpu backend).
    os.makedirs(p("cal"))
    for i in range(3):
        np.save(p(f"cal/{i}.npy"), np.random.default_rng(i).uniform(-1, 1, (1, 3, 32, 32)).astype(np.float32))
    r = expect_ok(args, "compare --precisions int8 --calib", "compare", p("cnn.onnx"), "--backend", "cpu",
                  "--precisions", "fp32,int8", "--calib", p("cal"), "--per-layer", "--export-json", p("cmp8.json"))
    doc = json.load(open(p("cmp8.json")))
    check("compare int8: both engines reported, int8 per layer", [e["precision"] for e in doc["engines"]] == ["fp32", "int8"]
          and len(doc["engines"][1]["per_layer"]["layers"]) > 0, str([e.get("precision") for e in doc["engines"]]))
    expect_error(args, "compare int8 without scales", "needs scales", "compare", p("cnn.onnx"), "--backend", "cpu",
                 "--precisions", "int8")
    expect_error(args, "compare --calib without int8", "apply to --precisions int8", "compare", p("cnn.onnx"),
                 "--calib", p("cal"))
    # --dataset: gzip IDX files; top-1/top-5 against NumPy's on the same model.
    import gzip
    rng = np.random.default_rng(2)
    imgs = rng.integers(0, 256, (40, 28, 28), dtype=np.uint8)
    labels = rng.integers(0, 10, 40, dtype=np.uint8)
    os.makedirs(p("fm"))
    with gzip.open(p("fm/t10k-images-idx3-ubyte.gz"), "wb") as f:
        f.write(bytes([0, 0, 8, 3]) + np.array([40, 28, 28], ">u4").tobytes() + imgs.tobytes())
    with gzip.open(p("fm/t10k-labels-idx1-ubyte.gz"), "wb") as f:
        f.write(bytes([0, 0, 8, 1]) + np.array([40], ">u4").tobytes() + labels.tobytes())
    W = rng.standard_normal((784, 10)).astype(np.float32)
    g = helper.make_graph([helper.make_node("Flatten", ["x"], ["f"]), helper.make_node("MatMul", ["f", "W"], ["y"])], "lin",
                          [helper.make_tensor_value_info("x", TensorProto.FLOAT, ["N", 1, 28, 28])],
                          [helper.make_tensor_value_info("y", TensorProto.FLOAT, ["N", 10])],
                          [onnx.numpy_helper.from_array(W, "W")])
    mm = helper.make_model(g, opset_imports=[helper.make_opsetid("", 17)])
    mm.ir_version = 8
    onnx.save(mm, p("lin.onnx"))
    expect_ok(args, "compare --dataset (IDX .gz)", "compare", p("lin.onnx"), "--dataset", p("fm"), "--batch", "8",
              "--export-json", p("ds.json"))
    logits = (imgs.reshape(40, -1).astype(np.float32) / 255.0) @ W
    rank = (logits > logits[np.arange(40), labels][:, None]).sum(1)
    ds = json.load(open(p("ds.json")))["engines"][0]["dataset"]
    check("dataset top-1/top-5 match NumPy's", abs(ds["top1"] - (rank < 1).mean()) < 1e-9 and
          abs(ds["top5"] - (rank < 5).mean()) < 1e-9, f"{ds['top1']} {ds['top5']}")
    expect_error(args, "compare --dataset missing", "no such file", "compare", p("lin.onnx"), "--dataset", p("nope"))
    # The image flags apply to the dataset's images: an NHWC input (a Keras model's, through
    # tf2onnx) with --mean/--std, no --input image needed.
    mm.graph.input[0].CopyFrom(helper.make_tensor_value_info("x", TensorProto.FLOAT, ["N", 28, 28, 1]))
    onnx.save(mm, p("lin_nhwc.onnx"))
    expect_ok(args, "compare --dataset --image-layout NHWC --mean --std", "compare", p("lin_nhwc.onnx"), "--dataset",
              p("fm"), "--batch", "8", "--image-layout", "NHWC", "--mean", "0.5", "--std", "0.25",
              "--export-json", p("ds_nhwc.json"))
    logits = ((imgs.reshape(40, -1).astype(np.float32) / 255.0 - 0.5) / 0.25) @ W
    rank = (logits > logits[np.arange(40), labels][:, None]).sum(1)
    ds = json.load(open(p("ds_nhwc.json")))["engines"][0]["dataset"] if os.path.exists(p("ds_nhwc.json")) else {}
    check("dataset NHWC with mean/std: top-1/top-5 match NumPy's", abs(ds.get("top1", -1) - (rank < 1).mean()) < 1e-9
          and abs(ds.get("top5", -1) - (rank < 5).mean()) < 1e-9, str(ds))
    expect_error(args, "compare --image-layout without an image or a dataset", "apply to image inputs", "compare",
                 p("lin_nhwc.onnx"), "--image-layout", "NHWC")


def bench_tests(args, p):
    expect_ok(args, "build dynamic engine", "build", "--onnx", p("cnn.onnx"), "--save-engine", p("dyn.kiln"), "--backend", "cpu",
              "--min-shapes", "input:1x3x32x32", "--opt-shapes", "input:2x3x32x32", "--max-shapes", "input:4x3x32x32")
    expect_ok(args, "bench --batch sweep", "bench", "--engine", p("dyn.kiln"), "--batch", "1,4", "--iterations", "3",
              "--duration", "0", "--export-json", p("sweep.json"))
    d = json.load(open(p("sweep.json")))
    check("bench --batch: one kiln.bench/1 record per batch", d["schema"] == "kiln.bench/1" and
          [r["batch"] for r in d["records"]] == [1, 4] and all(r["model"] == "cnn" for r in d["records"]))
    expect_ok(args, "build static engine", "build", "--onnx", p("cnn.onnx"), "--save-engine", p("static.kiln"), "--backend", "cpu",
              "--shapes", "input:2x3x32x32")
    expect_error(args, "bench --batch on a static engine", "dynamic first dimension", "bench", "--engine", p("static.kiln"), "--batch", "1,2")
    expect_error(args, "bench --batch outside the profile", "outside the engine's profile", "bench", "--engine", p("dyn.kiln"),
                 "--batch", "8", "--iterations", "1", "--duration", "0")
    # CUDA graphs: on by default on the cuda backend; --use-cuda-graph asks for them (a cpu engine
    # has none), --no-cuda-graph turns them off (nothing to turn off on the cpu), not both
    expect_error(args, "bench --use-cuda-graph on a cpu engine", "needs an engine for the cuda backend", "bench",
                 "--engine", p("static.kiln"), "--use-cuda-graph", "--iterations", "1", "--duration", "0")
    expect_ok(args, "bench --no-cuda-graph on a cpu engine", "bench", "--engine", p("static.kiln"), "--no-cuda-graph",
              "--iterations", "2", "--duration", "0", "--export-json", p("nograph.json"))
    check("bench on a cpu engine reports no CUDA graph", json.load(open(p("nograph.json")))["cuda_graph"] is False)
    expect_error(args, "bench --use-cuda-graph --no-cuda-graph", "excludes", "bench", "--engine", p("static.kiln"),
                 "--use-cuda-graph", "--no-cuda-graph")
    # --load-inputs (trtexec's --loadInputs): the file's shape is the run's shape
    np.save(p("in3.npy"), np.random.default_rng(0).uniform(-1, 1, (3, 3, 32, 32)).astype(np.float32))
    expect_ok(args, "bench --load-inputs", "bench", "--engine", p("dyn.kiln"), "--load-inputs", f"input:{p('in3.npy')}",
              "--iterations", "2", "--duration", "0", "--export-json", p("loaded.json"))
    check("bench --load-inputs runs at the file's shape", json.load(open(p("loaded.json")))["batch"] == 3)
    expect_error(args, "bench --load-inputs of an unknown input", "nosuch", "bench", "--engine", p("dyn.kiln"),
                 "--load-inputs", f"nosuch:{p('in3.npy')}")
    expect_error(args, "bench --load-inputs without NAME:", "is not NAME:FILE", "bench", "--engine", p("dyn.kiln"),
                 "--load-inputs", p("in3.npy").replace(":", ""))
    expect_error(args, "bench --load-inputs with --batch", "cannot be used with --batch", "bench", "--engine",
                 p("dyn.kiln"), "--load-inputs", f"input:{p('in3.npy')}", "--batch", "1,2")


def report_tests(args, p):
    # Synthetic result files: these test the plotting and the page only (never put in docs).
    os.makedirs(p("results"))
    recs = []
    for fw in ("kiln", "pytorch-eager", "torch.compile"):
        for prec in ("fp32", "fp16"):
            for b in (1, 8, 32):
                ms = 0.5 + 0.05 * b * (1.0 if prec == "fp32" else 0.5) * (1.3 if fw != "kiln" else 1.0)
                rec = {"framework": fw, "model": "resnet_synthetic", "precision": prec, "batch": b,
                       "latency_ms": {"median": ms, "p99": ms * 1.1}, "throughput_per_s": b * 1000 / ms,
                       "command": "synthetic"}
                if fw == "kiln":
                    rec["memory"] = {"weights": 50 << 20, "activations": b << 20, "workspace": 0}
                recs.append(rec)
    json.dump({"schema": "kiln.bench/1", "records": recs}, open(p("results/bench.json"), "w"))
    json.dump({"schema": "kiln.env/1", "gpu": "synthetic"}, open(p("results/env.json"), "w"))
    os.system(f"cp {p('cmp.json')} {p('results/compare.json')}")
    expect_ok(args, "report", "report", p("results"), "-o", p("report.html"), "--save-plots", p("plots"))
    check("report --save-plots: each model's plots as PNG files",
          all(open(p(f"plots/resnet_synthetic_{k}.png"), "rb").read(8) == b"\x89PNG\r\n\x1a\n"
              for k in ("latency", "throughput", "speedup", "memory")) if os.path.isdir(p("plots")) else False,
          str(os.listdir(p("plots")) if os.path.isdir(p("plots")) else "no plots folder"))
    page = open(p("report.html")).read() if os.path.exists(p("report.html")) else ""
    check("report: self-contained HTML with plots and the tables", page.count("data:image/png;base64,") >= 5 and
          "Every number" in page and "Accuracy" in page and "src=\"http" not in page, f"{page.count('data:image/png')} images")
    expect_error(args, "report --save-plots onto a file", "cannot create", "report", p("results"), "-o", p("r.html"),
                 "--save-plots", p("report.html"))
    os.makedirs(p("empty"))
    expect_error(args, "report on an empty folder", "no *.json", "report", p("empty"), "-o", p("r.html"))
    open(p("results/broken.json"), "w").write("{not json")
    expect_error(args, "report on broken JSON", "not valid JSON", "report", p("results"), "-o", p("r.html"))
    expect_error(args, "report on a missing folder", "not a folder", "report", p("nope"), "-o", p("r.html"))


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--kiln", default="build/kiln")
    args = ap.parse_args()
    with tempfile.TemporaryDirectory() as d:
        p = lambda name: os.path.join(d, name)  # noqa: E731
        image_tests(args, p)
        compare_tests(args, p)
        bench_tests(args, p)
        report_tests(args, p)
    print(f"compare/report/image cli tests: {'all behave' if not FAILURES else str(len(FAILURES)) + ' FAILED: ' + ', '.join(FAILURES)}")
    return 1 if FAILURES else 0


if __name__ == "__main__":
    sys.exit(main())
