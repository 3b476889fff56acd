#!/usr/bin/env python3
"""The Keras path: a small Keras CNN (channels-last, as Keras makes them) trained on Fashion-MNIST
(Debian's dataset-fashion-mnist) on the CPU, saved as a SavedModel, converted to ONNX with
tf2onnx and built by kiln as FP32, FP16 and INT8 engines (INT8 calibrated on training images).
Writes one table: top-1 on the 10,000 test images, file sizes, and throughput at batch 1 and 32
of Keras (`model.predict`, `predict_on_batch`, the SavedModel's serving function), ONNX Runtime
on the converted model, and each kiln engine (docs/keras.md).

  scripts/keras_fashion_mnist.py [--out out/keras] [--kiln build/kiln] [--backend cpu|cuda|cpu,cuda]

Modes (--mode):
  all    (default; needs TensorFlow and tf2onnx: KILN_WITH_TF=1 scripts/setup.sh) trains, saves
         and converts (--skip-train: reuse the model in --model-dir), measures Keras and ONNX
         Runtime (keras.json), then the kiln columns for each --backend, then the table.
  kiln   needs only kiln, NumPy and the dataset files: the kiln columns from --model-dir's
         model.onnx (kiln_<backend>.json), then the table. For the GPU machine, which has no
         TensorFlow (bench/keras_gpu.sh).
  table  merges keras.json and kiln_*.json (from --out and --model-dir) into table.md/table.json.

Files in --out: model.keras, saved_model/, model.onnx, tf2onnx.log, calib/NNN.npy (training
images, [N,28,28,1] in [0,1]), engines/*.kiln, keras.json, kiln_<backend>.json, table.md,
table.json. The model's input is the image in [0,1], NHWC float32[N,28,28,1]; it normalizes
itself (a Rescaling layer), so `kiln compare --dataset` needs only `--image-layout NHWC`.
"""
import argparse
import contextlib
import datetime
import io
import glob
import json
import os
import platform
import statistics
import subprocess
import sys
import time

import numpy as np

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from fashion_mnist_accuracy import kiln  # noqa: E402  (runs the CLI; exits with its error)
from train_fashion_mnist import MEAN, STD, find_idx, read_idx  # noqa: E402

os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")  # TensorFlow's start-up notices
BATCHES = (1, 32)
MAX_BATCH = 256  # the engines' profile: batch 1..256, tuned at 32
EVAL_BATCH = 250  # images per inference when counting top-1


def log(msg):
    print(f"[keras_fashion_mnist {time.strftime('%H:%M:%S')}] {msg}", flush=True)


def load(split):
    """Images as float32 [N,28,28,1] in [0,1] (NHWC, as Keras takes them) and int64 labels."""
    prefix = "train" if split == "train" else "t10k"
    x = read_idx(find_idx(f"{prefix}-images-idx3-ubyte")).astype(np.float32) / 255.0
    y = read_idx(find_idx(f"{prefix}-labels-idx1-ubyte")).astype(np.int64)
    return x[..., None], y


def dataset_dir():
    return os.path.dirname(find_idx("t10k-images-idx3-ubyte"))


def size_of(path):
    if os.path.isdir(path):
        return sum(os.path.getsize(f) for f in glob.glob(os.path.join(path, "**"), recursive=True)
                   if os.path.isfile(f))
    return os.path.getsize(path)


def write_json(path, obj):
    with open(path, "w") as f:
        json.dump(obj, f, indent=1)
        f.write("\n")


def time_calls(fn, x, min_calls=20, min_seconds=2.0, warmup=3):
    """Median wall-clock latency (ms) of fn(x) over repeated calls."""
    for _ in range(warmup):
        fn(x)
    lat, t0 = [], time.perf_counter()
    while len(lat) < min_calls or time.perf_counter() - t0 < min_seconds:
        a = time.perf_counter()
        fn(x)
        lat.append(1000.0 * (time.perf_counter() - a))
    return {"median_ms": statistics.median(lat), "calls": len(lat)}


def cpu_model():
    try:
        for ln in open("/proc/cpuinfo"):
            if ln.startswith("model name"):
                return ln.split(":", 1)[1].strip()
    except OSError:
        pass
    return platform.processor() or "unknown"


def write_calib(d, seed, n=512, batch=64):
    """Calibration batches from training images only (a seeded random subset)."""
    cdir = os.path.join(d, "calib")
    if glob.glob(os.path.join(cdir, "*.npy")):
        return cdir
    xtr, _ = load("train")
    os.makedirs(cdir, exist_ok=True)
    pick = np.random.default_rng(seed).permutation(len(xtr))[:n]
    for i in range(0, n, batch):
        np.save(os.path.join(cdir, f"{i // batch:03d}.npy"), xtr[pick[i:i + batch]])
    log(f"wrote {n} calibration images (training set) in {cdir}")
    return cdir


# ---------------------------------------------------------------------------------------------
# TensorFlow side (mode all)


def make_model(keras, channels=(16, 32), dense=64, name="fmnist_keras_cnn",
               out_name="probabilities", norm_name="normalize"):
    """The Keras NHWC CNN (also, at a few channels, scripts/models/keras_models.py's test model;
    None names take Keras's defaults)."""
    layers = keras.layers
    inp = keras.Input((28, 28, 1), name="image")
    x = layers.Rescaling(1.0 / STD, offset=-MEAN / STD, name=norm_name)(inp)
    for ch in channels:
        for _ in range(2):
            x = layers.Conv2D(ch, 3, padding="same", use_bias=False)(x)
            x = layers.BatchNormalization()(x)
            x = layers.ReLU()(x)
        x = layers.MaxPooling2D()(x)
    x = layers.Flatten()(x)
    x = layers.Dropout(0.3)(x)
    x = layers.Dense(dense, activation="relu")(x)
    x = layers.Dropout(0.3)(x)
    out = layers.Dense(10, activation="softmax", name=out_name)(x)
    return keras.Model(inp, out, name=name)


def train_and_convert(a, d):
    import keras  # noqa: PLC0415 (optional dependency)
    import tensorflow as tf  # noqa: PLC0415

    keras.utils.set_random_seed(a.seed)
    xtr, ytr = load("train")
    xte, yte = load("test")
    if a.train_images:
        xtr, ytr = xtr[: a.train_images], ytr[: a.train_images]
    model = make_model(keras)
    model.compile(optimizer=keras.optimizers.Adam(1e-3), loss="sparse_categorical_crossentropy",
                  metrics=["accuracy"])
    log(f"training {model.name} ({model.count_params()} parameters) on {len(xtr)} images, "
        f"{a.epochs} epochs, batch {a.batch}, TensorFlow {tf.__version__} on the CPU")
    t0 = time.time()
    model.fit(xtr, ytr, batch_size=a.batch, epochs=a.epochs, verbose=2)
    train_s = time.time() - t0
    log(f"trained in {train_s:.0f} s")
    # Saved without the optimizer's state (an uncompiled copy): the file is what inference needs.
    infer = keras.models.clone_model(model)
    infer.set_weights(model.get_weights())
    infer.save(os.path.join(d, "model.keras"))
    sm = os.path.join(d, "saved_model")
    with contextlib.redirect_stdout(io.StringIO()) as said:  # it prints every captured variable
        infer.export(sm)  # Keras 3: a TF SavedModel with the "serve"/"serving_default" signature
    with open(os.path.join(d, "export.log"), "w") as f:
        f.write(said.getvalue())
    log(f"saved {sm} (model.export; its report in export.log)")
    onnx_path = os.path.join(d, "model.onnx")
    cmd = [sys.executable, "-m", "tf2onnx.convert", "--saved-model", sm, "--opset", str(a.opset),
           "--output", onnx_path]
    log("converting: " + " ".join(cmd[1:]))
    with open(os.path.join(d, "tf2onnx.log"), "w") as f:
        p = subprocess.run(cmd, stdout=f, stderr=subprocess.STDOUT)
    if p.returncode != 0:
        sys.exit(f"keras_fashion_mnist: tf2onnx failed; see {os.path.join(d, 'tf2onnx.log')}")
    log(f"wrote {onnx_path}")
    return {"train_seconds": train_s, "epochs": a.epochs, "train_images": len(xtr),
            "batch": a.batch, "seed": a.seed, "parameters": int(model.count_params())}


def keras_measure(a, d):
    """Keras (model.predict), the SavedModel's serving function and ONNX Runtime on the converted
    model: top-1 on the test set and median latency at batch 1 and 32. Runs in its own process
    per thread count (TensorFlow fixes its thread pools at start-up)."""
    import keras  # noqa: PLC0415
    import onnxruntime as ort  # noqa: PLC0415
    import tensorflow as tf  # noqa: PLC0415

    if a.threads:
        tf.config.threading.set_intra_op_parallelism_threads(a.threads)
        tf.config.threading.set_inter_op_parallelism_threads(a.threads)
    xte, yte = load("test")
    model = keras.saving.load_model(os.path.join(d, "model.keras"))
    saved = tf.saved_model.load(os.path.join(d, "saved_model"))  # keep it: serve uses its variables
    so = ort.SessionOptions()
    if a.threads:
        so.intra_op_num_threads = so.inter_op_num_threads = a.threads
    sess = ort.InferenceSession(os.path.join(d, "model.onnx"), so, providers=["CPUExecutionProvider"])
    iname = sess.get_inputs()[0].name
    runners = {
        "keras_predict": lambda x: model.predict(x, batch_size=len(x), verbose=0),
        "keras_predict_on_batch": lambda x: model.predict_on_batch(x),
        "keras_saved_model": lambda x: saved.serve(tf.constant(x)).numpy(),
        "onnxruntime": lambda x: sess.run(None, {iname: x})[0],
    }
    out = {}
    for name, fn in runners.items():
        r = {"threads": a.threads or "default"}
        if not a.threads:  # accuracy once (it does not depend on the thread count)
            pred = np.concatenate([fn(xte[i:i + EVAL_BATCH]) for i in range(0, len(xte), EVAL_BATCH)])
            r["top1"] = float((pred.argmax(1) == yte).mean())
        for b in BATCHES:
            r[f"batch{b}"] = time_calls(fn, np.ascontiguousarray(xte[:b]))
        out[name] = r
        log(f"{name} ({r['threads']} threads): "
            + (f"top-1 {100 * r['top1']:.2f}%, " if "top1" in r else "")
            + ", ".join(f"batch {b} {r[f'batch{b}']['median_ms']:.3f} ms" for b in BATCHES))
    return out


def keras_stage(a, d):
    import tensorflow as tf  # noqa: PLC0415
    import tf2onnx  # noqa: PLC0415

    info_path = os.path.join(d, "keras.json")
    if a.skip_train:
        for f in ("model.keras", "saved_model", "model.onnx"):
            if not os.path.exists(os.path.join(d, f)):
                sys.exit(f"keras_fashion_mnist: --skip-train: {os.path.join(d, f)} is missing")
        info = json.load(open(info_path)) if os.path.isfile(info_path) else {}
        log(f"reusing the trained model in {d}")
    else:
        info = {"train": train_and_convert(a, d)}
    import keras  # noqa: PLC0415
    import onnxruntime as ort  # noqa: PLC0415

    info["versions"] = {"tensorflow": tf.__version__, "keras": keras.__version__,
                        "tf2onnx": tf2onnx.__version__, "onnxruntime": ort.__version__,
                        "python": platform.python_version()}
    info["machine"] = {"cpu": cpu_model(), "cores": os.cpu_count()}
    info["sizes"] = {"model.keras": size_of(os.path.join(d, "model.keras")),
                     "saved_model": size_of(os.path.join(d, "saved_model")),
                     "model.onnx": size_of(os.path.join(d, "model.onnx"))}
    info["measured"] = {}
    for t in a.keras_threads:
        log(f"measuring Keras, the SavedModel and ONNX Runtime ({t or 'default'} threads)")
        res = os.path.join(d, f"keras_t{t}.json")
        cmd = [sys.executable, os.path.abspath(__file__), "--mode", "keras-measure", "--out", d,
               "--threads", str(t)]
        if subprocess.run(cmd).returncode != 0:
            sys.exit("keras_fashion_mnist: the Keras measurement failed")
        info["measured"][str(t)] = json.load(open(res))
        os.remove(res)
    info["date"] = datetime.date.today().isoformat()
    write_json(info_path, info)
    log(f"wrote {info_path}")


# ---------------------------------------------------------------------------------------------
# kiln side (modes all and kiln): needs no TensorFlow


def kiln_configs(backend, calib, cache):
    int8 = ["--int8", "--calib", calib, "--calib-cache", cache]
    if backend == "cpu":  # the cpu backend computes in FP32; its INT8 is the reference arithmetic
        return {"fp32": [], "int8": int8}
    return {"fp32": ["--no-tf32"], "fp16": ["--fp16"], "int8": int8 + ["--fp16"]}


def kiln_stage(a, backend, model_dir, d):
    onnx_path = os.path.join(model_dir, "model.onnx")
    if not os.path.isfile(onnx_path):
        sys.exit(f"keras_fashion_mnist: {onnx_path} is missing (mode all writes it; give --model-dir)")
    inputs = json.loads(kiln(a.kiln, "inspect", onnx_path, "--json"))["inputs"]
    if len(inputs) != 1:
        sys.exit(f"keras_fashion_mnist: {onnx_path} has {len(inputs)} inputs, expected 1 (the image)")
    name = inputs[0]["name"]
    # The calibration batches of --model-dir when it has them (the GPU machine then needs only
    # the test set), else made here from the training images.
    given = os.path.join(model_dir, "calib")
    calib = given if glob.glob(os.path.join(given, "*.npy")) else write_calib(d, a.seed)
    edir = os.path.join(d, "engines")
    os.makedirs(edir, exist_ok=True)
    shapes = ["--min-shapes", f"{name}:1x28x28x1", "--opt-shapes", f"{name}:32x28x28x1",
              "--max-shapes", f"{name}:{MAX_BATCH}x28x28x1"]
    res = {"backend": backend, "model": onnx_path, "engines": {}}
    for prec, flags in kiln_configs(backend, calib, os.path.join(d, f"calib_{backend}.cache")).items():
        engine = os.path.join(edir, f"{prec}_{backend}.kiln")
        log(f"kiln build {prec} ({backend})")
        t0 = time.time()
        out = kiln(a.kiln, "build", "--onnx", onnx_path, "--save-engine", engine, "--backend", backend,
                   *shapes, *flags)
        res["engines"][prec] = {"path": engine, "bytes": os.path.getsize(engine),
                                "build_seconds": time.time() - t0,
                                "build_summary": [ln.strip() for ln in out.splitlines()
                                                  if ln.strip().startswith(("int8 ", "gpu "))]}
    engines = [res["engines"][p]["path"] for p in res["engines"]]
    cmp_json = os.path.join(d, f"compare_{backend}.json")
    # The error against the float64 reference on real images (compare's own random inputs are
    # in [-1, 1], outside what INT8 was calibrated for).
    first = os.path.join(d, "test_first100.npy")
    np.save(first, load("test")[0][:100])
    log(f"kiln compare: top-1 of {len(engines)} engines on the 10,000 test images ({backend})")
    text = kiln(a.kiln, "compare", onnx_path, "--engines", ",".join(engines), "--input", f"{name}={first}",
                "--dataset", dataset_dir(), "--dataset-limit", "10000", "--batch", str(EVAL_BATCH),
                "--image-layout", "NHWC", "--export-json", cmp_json)
    print(text, end="", flush=True)
    report = json.load(open(cmp_json))
    by_file = {r["path"]: p for p, r in res["engines"].items()}
    for e in report["engines"]:
        r = res["engines"][by_file[e["file"]]]
        r["top1"] = e["dataset"]["top1"]
        r["samples"] = e["dataset"]["samples"]
        r["rel_l2_vs_float64"] = max(o["rel_l2"] for o in e["outputs"])
    for prec, r in res["engines"].items():
        bj = os.path.join(d, f"bench_{prec}_{backend}.json")
        log(f"kiln bench {prec} ({backend}), batch {','.join(map(str, BATCHES))}")
        extra = ["--use-cuda-graph"] if backend == "cuda" else []
        kiln(a.kiln, "bench", "--engine", r["path"], "--batch", ",".join(map(str, BATCHES)),
             "--iterations", "50", "--duration", "2", "--export-json", bj, *extra)
        for rec in json.load(open(bj))["records"]:
            r[f"batch{rec['batch']}"] = {"median_ms": rec["latency_ms"]["median"],
                                          "calls": rec["iterations"]}
            res["gpu"] = rec.get("gpu", "")
        log(f"{prec} ({backend}): top-1 {100 * r['top1']:.2f}%, {r['bytes']} bytes, "
            + ", ".join(f"batch {b} {r[f'batch{b}']['median_ms']:.3f} ms" for b in BATCHES))
    res["version"] = kiln(a.kiln, "--version").strip()
    git = subprocess.run(["git", "-C", os.path.dirname(os.path.abspath(__file__)), "rev-parse", "--short", "HEAD"],
                         capture_output=True, text=True)
    if git.returncode == 0:  # the tree the script runs from (kiln is assumed built from it)
        res["version"] += f" (tree at {git.stdout.strip()})"
    res["machine"] = {"cpu": cpu_model(), "cores": os.cpu_count()}
    res["date"] = datetime.date.today().isoformat()
    path = os.path.join(d, f"kiln_{backend}.json")
    write_json(path, res)
    log(f"wrote {path}")


# ---------------------------------------------------------------------------------------------
# The table


def speed_cells(r):
    cells = []
    for b in BATCHES:
        m = r.get(f"batch{b}")
        cells.append(f"{m['median_ms']:.3f} ms, {1000.0 * b / m['median_ms']:,.0f}/s" if m else "—")
    return cells


def table_stage(a, dirs):
    def first(name):
        for dd in dirs:
            if os.path.isfile(os.path.join(dd, name)):
                return json.load(open(os.path.join(dd, name)))
        return None

    rows = []
    keras_info = first("keras.json")
    if keras_info:
        sizes, meas = keras_info["sizes"], keras_info["measured"]
        top1 = {k: v["top1"] for k, v in meas.get("0", {}).items() if "top1" in v}
        what = {"keras_predict": ("Keras `model.predict`", "model.keras", sizes["model.keras"]),
                "keras_predict_on_batch": ("Keras `model.predict_on_batch`", "model.keras",
                                           sizes["model.keras"]),
                "keras_saved_model": ("Keras SavedModel `serve` (tf.function)", "saved_model/",
                                      sizes["saved_model"]),
                "onnxruntime": ("ONNX Runtime (the tf2onnx model)", "model.onnx", sizes["model.onnx"])}
        for t, res in meas.items():
            for k, r in res.items():
                label, f, nbytes = what[k]
                threads = "1 thread" if t == "1" else ("default threads" if t == "0" else f"{t} threads")
                rows.append({"what": label, "where": f"CPU, {threads}", "top1": top1.get(k),
                             "file": f, "bytes": nbytes, **{f"batch{b}": r.get(f"batch{b}") for b in BATCHES}})
    for backend in ("cpu", "cuda"):
        k = first(f"kiln_{backend}.json")
        if not k:
            continue
        where = "CPU, 1 thread (reference backend)" if backend == "cpu" else f"GPU: {k.get('gpu', '')}"
        for prec, r in k["engines"].items():
            rows.append({"what": f"kiln {prec.upper()} ({backend})", "where": where, "top1": r.get("top1"),
                         "file": os.path.basename(r["path"]), "bytes": r["bytes"],
                         "rel_l2": r.get("rel_l2_vs_float64"),
                         **{f"batch{b}": r.get(f"batch{b}") for b in BATCHES}})
    lines = ["| model | runs on | top-1 % | rel. L2 vs float64 | file | size | batch 1: latency, images/s "
             "| batch 32: latency, images/s |", "|---|---|---|---|---|---|---|---|"]
    for r in rows:
        top1 = f"{100 * r['top1']:.2f}" if r["top1"] is not None else "(as above)"
        l2 = f"{r['rel_l2']:.1e}" if r.get("rel_l2") is not None else "—"
        lines.append(f"| {r['what']} | {r['where']} | {top1} | {l2} | {r['file']} | {r['bytes'] / 1024:,.0f} KiB | "
                     + " | ".join(speed_cells(r)) + " |")
    notes = []
    if keras_info:
        v, m, t = keras_info["versions"], keras_info["machine"], keras_info.get("train", {})
        notes.append(f"Keras rows: {keras_info['date']}, {m['cpu']} ({m['cores']} cores), TensorFlow "
                     f"{v['tensorflow']}, Keras {v['keras']}, tf2onnx {v['tf2onnx']}, ONNX Runtime "
                     f"{v['onnxruntime']}" + (f"; trained {t['epochs']} epochs on {t['train_images']} "
                                              f"images in {t['train_seconds']:.0f} s" if t else "") + ".")
    for backend in ("cpu", "cuda"):
        k = first(f"kiln_{backend}.json")
        if k:
            on = k["machine"]["cpu"] if backend == "cpu" else k.get("gpu", "")
            notes.append(f"kiln {backend} rows: {k['date']}, {k['version']}, {on}.")
    notes.append("Latency: the median of repeated calls (Keras, ONNX Runtime: wall clock around each call, at "
                 "least 20 calls and 2 s; kiln: `kiln bench`, at least 50 inferences and 2 s, on the GPU "
                 "with the host-device copies and CUDA graphs); images/s = batch / median. rel. L2: each kiln "
                 "engine against `kiln compare`'s float64 reference of the ONNX model on the first 100 test "
                 "images. Top-1: all 10,000 test images.")
    text = "\n".join(lines) + "\n\n" + "\n".join(f"- {n}" for n in notes) + "\n"
    os.makedirs(a.out, exist_ok=True)
    with open(os.path.join(a.out, "table.md"), "w") as f:
        f.write(text)
    write_json(os.path.join(a.out, "table.json"), {"rows": rows, "notes": notes})
    print("\n" + text, flush=True)
    log(f"wrote {os.path.join(a.out, 'table.md')} and table.json")


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0],
                                 formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--mode", default="all", choices=["all", "kiln", "table", "keras-measure"])
    ap.add_argument("--out", default="out/keras")
    ap.add_argument("--model-dir", help="where model.onnx (and keras.json) are (default: --out)")
    ap.add_argument("--skip-train", action="store_true", help="reuse the trained and converted model")
    ap.add_argument("--kiln", default="build/kiln")
    ap.add_argument("--backend", default="cpu", help="kiln backends: cpu, cuda or cpu,cuda (\"\": none)")
    ap.add_argument("--epochs", type=int, default=4)
    ap.add_argument("--batch", type=int, default=128)
    ap.add_argument("--train-images", type=int, default=0, help="only the first N (a quick check)")
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--opset", type=int, default=17)
    ap.add_argument("--keras-threads", default="0,1",
                    help="thread counts for the Keras/ONNX Runtime timings; 0 = their default (all cores)")
    ap.add_argument("--threads", type=int, default=0, help=argparse.SUPPRESS)  # keras-measure
    a = ap.parse_args()
    a.keras_threads = [int(t) for t in a.keras_threads.split(",") if t != ""]
    os.makedirs(a.out, exist_ok=True)
    model_dir = a.model_dir or a.out
    if a.mode == "keras-measure":
        write_json(os.path.join(a.out, f"keras_t{a.threads}.json"), keras_measure(a, a.out))
        return 0
    if a.mode == "all":
        if model_dir != a.out:
            sys.exit("keras_fashion_mnist: --mode all trains into --out; --model-dir is for --mode kiln/table")
        keras_stage(a, a.out)
    if a.mode in ("all", "kiln"):
        for backend in [b for b in a.backend.split(",") if b]:
            kiln_stage(a, backend, model_dir, a.out)
    table_stage(a, [a.out, model_dir])
    return 0


if __name__ == "__main__":
    sys.exit(main())
