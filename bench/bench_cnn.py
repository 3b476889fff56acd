#!/usr/bin/env python3
"""kiln next to PyTorch on torchvision CNNs, in one GPU run (issue 7's speed table).

For each (model, precision, batch): kiln builds an engine (static shapes, timing cache) and
`kiln bench` times it with CUDA events (CUDA graph, no host<->device copies, median of >= 200
inferences); PyTorch times eager and torch.compile(mode="reduce-overhead") on the same input
shape, same precision (FP16: .half() + channels_last; TF32: the allow_tf32 switches), median of
200 event-timed runs. Writes bench_cnn.json and prints a Markdown table. Precision int8 builds
`--int8 --fp16` engines from one calibration cache per model (random inputs, as the weights are
random); PyTorch has no GPU INT8 path, so its FP16 numbers stand beside them (issue 10's table
compares kiln INT8 with kiln FP16 from the same run).

  bench/bench_cnn.py --kiln .deps/kiln --out OUT [--rows resnet50:fp16:256,...]
  bench/bench_cnn.py --kiln .deps/kiln --out OUT --rows resnet50:int8:256,resnet50:fp16:256,resnet50:int8:32,resnet50:int8:1
"""
import argparse
import shutil
import json
import os
import statistics
import subprocess
import sys
import time

DEFAULT_ROWS = ("resnet50:fp16:256,resnet50:fp16:1,resnet50:fp16:32,resnet50:tf32:256,"
                "resnet18:fp16:32,mobilenet_v2:fp16:32,efficientnet_b0:fp16:32,densenet121:fp16:32")


def sh(cmd, with_stderr=False, **kw):
    p = subprocess.run(cmd, capture_output=True, text=True, **kw)
    if p.returncode != 0:
        raise RuntimeError(f"{' '.join(cmd)}\n{p.stdout[-2000:]}\n{p.stderr[-2000:]}")
    return p.stdout + p.stderr if with_stderr else p.stdout


def calib_cache(args, model, onnx):
    """The model's calibration cache: made once (entropy, 8 batches of 32 random normal images,
    what random weights see), then reused by every INT8 engine of the model whatever its batch."""
    cache = os.path.join(args.out, f"{model}.calib")
    if os.path.exists(cache):
        return cache
    import numpy as np
    calib = os.path.join(args.out, f"calib_{model}")
    os.makedirs(calib, exist_ok=True)
    rng = np.random.default_rng(7)
    for i in range(8):
        np.save(os.path.join(calib, f"batch{i}.npy"),
                rng.standard_normal((32, 3, 224, 224)).astype(np.float32))
    sh([args.kiln, "build", "--onnx", onnx, "--save-engine", os.path.join(calib, "e.kiln"),
        "--shapes", "input:32x3x224x224", "--int8", "--fp16", "--calib", calib,
        "--calib-cache", cache])
    shutil.rmtree(calib)
    return cache


def kiln_row(args, model, prec, batch):
    onnx = os.path.join(args.models, f"{model}.onnx")
    if not os.path.exists(onnx):
        sh([sys.executable, "scripts/export_torchvision.py", model, onnx])
    engine = os.path.join(args.out, f"{model}_{prec}_b{batch}.kiln")
    cache = os.path.join(args.out, f"timing_{prec}.cache")
    flags = ["--fp16"] if prec == "fp16" else []
    if prec == "int8":  # INT8 with FP16 where INT8 is slower or unsupported, as TensorRT users build
        flags = ["--int8", "--fp16", "--calib-cache", calib_cache(args, model, onnx)]
    t0 = time.time()
    log = sh([args.kiln, "build", "--onnx", onnx, "--save-engine", engine, "--shapes",
              f"input:{batch}x3x224x224", "--timing-cache", cache] + flags +
             (["--verbose"] if args.profile else []), with_stderr=args.profile)
    build_s = time.time() - t0
    if args.profile:  # every candidate's time and the format choice's moves, per layer
        with open(os.path.join(args.out, "build_logs.txt"), "a") as f:
            f.write(f"==== {model} {prec} b{batch}\n{log}\n")
    js = os.path.join(args.out, f"kiln_{model}_{prec}_b{batch}.json")
    text = sh([args.kiln, "bench", "--engine", engine, "--use-cuda-graph", "--no-data-transfers",
               "--iterations", str(args.iters), "--duration", "1", "--export-json", js] +
              (["--dump-profile"] if args.profile else []))
    if args.profile:
        with open(os.path.join(args.out, "profiles.txt"), "a") as f:
            f.write(f"==== {model} {prec} b{batch}\n{text}\n")
            f.write(sh([args.kiln, "inspect", engine]))
    with open(js) as f:
        r = json.load(f)
    return {"build_s": build_s, "median_ms": r["compute_ms"]["median"],
            "p99_ms": r["compute_ms"]["p99"], "images_per_s": batch * 1000.0 / r["compute_ms"]["median"],
            "throughput_back_to_back": r["throughput_per_s"]}


def torch_rows(model_name, prec, batch, args, compile_ok):
    import torch
    import torchvision
    torch.backends.cudnn.benchmark = True
    torch.backends.cuda.matmul.allow_tf32 = prec == "tf32"
    torch.backends.cudnn.allow_tf32 = prec == "tf32"
    dev = torch.device("cuda")
    model = getattr(torchvision.models, model_name)(weights=None).eval().to(dev)
    x = torch.randn(batch, 3, 224, 224, device=dev)
    if prec in ("fp16", "int8"):  # PyTorch has no GPU INT8 path: its FP16 is the comparison
        model = model.half()
        x = x.half()
    model = model.to(memory_format=torch.channels_last)
    x = x.to(memory_format=torch.channels_last)
    out = {}
    variants = [("eager", None)] + ([("compile", "reduce-overhead")] if compile_ok else [])
    for kind, mode in variants:
        torch._dynamo.reset()
        fn = model if mode is None else torch.compile(model, mode=mode)
        t0 = time.time()
        with torch.inference_mode():
            for _ in range(3):
                fn(x)
            torch.cuda.synchronize()
            first = time.time() - t0
            times = []
            for _ in range(args.iters):
                a = torch.cuda.Event(enable_timing=True)
                b = torch.cuda.Event(enable_timing=True)
                a.record()
                fn(x)
                b.record()
                b.synchronize()
                times.append(a.elapsed_time(b))
        ms = statistics.median(times)
        out[kind] = {"median_ms": ms, "images_per_s": batch * 1000.0 / ms, "first_calls_s": first}
    return out


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--kiln", required=True)
    ap.add_argument("--out", required=True)
    ap.add_argument("--models", default="models")
    ap.add_argument("--rows", default=DEFAULT_ROWS)
    ap.add_argument("--iters", type=int, default=200)
    ap.add_argument("--compile-budget-s", type=float, default=240.0)
    ap.add_argument("--profile", action="store_true")
    args = ap.parse_args()
    os.makedirs(args.out, exist_ok=True)
    os.makedirs(args.models, exist_ok=True)
    import torch
    results = {"gpu": torch.cuda.get_device_name(0), "torch": torch.__version__,
               "cudnn_torch": torch.backends.cudnn.version(), "rows": []}
    compile_spent = 0.0
    for spec in args.rows.split(","):
        model, prec, batch = spec.split(":")
        batch = int(batch)
        row = {"model": model, "precision": prec, "batch": batch}
        try:
            row["kiln"] = kiln_row(args, model, prec, batch)
        except Exception as e:  # report and go on
            row["kiln_error"] = str(e)[-600:]
        t0 = time.time()
        try:
            row["torch"] = torch_rows(model, prec, batch, args, compile_spent < args.compile_budget_s)
        except Exception as e:
            row["torch_error"] = str(e)[-600:]
        compile_spent += time.time() - t0
        results["rows"].append(row)
        k = row.get("kiln", {})
        t = row.get("torch", {})
        c = t.get("compile", {}).get("images_per_s")
        print(f"{model:16s} {prec} b{batch:<4d} kiln {k.get('images_per_s', 0):9.0f} img/s "
              f"({k.get('median_ms', 0):.3f} ms, build {k.get('build_s', 0):.1f} s)  "
              f"eager {t.get('eager', {}).get('images_per_s', 0):9.0f}  "
              f"compile {c or 0:9.0f}  kiln/compile {k.get('images_per_s', 0) / c if c else 0:.2f}"
              + (f"  KILN ERROR {row['kiln_error'][-300:]}" if "kiln_error" in row else ""), flush=True)
        with open(os.path.join(args.out, "bench_cnn.json"), "w") as f:
            json.dump(results, f, indent=1)
    print("\n| model | precision | batch | kiln ms | kiln img/s | eager img/s | torch.compile img/s | kiln / compile |")
    print("|---|---|---|---|---|---|---|---|")
    for r in results["rows"]:
        k, t = r.get("kiln", {}), r.get("torch", {})
        c = t.get("compile", {}).get("images_per_s")
        print(f"| {r['model']} | {r['precision']} | {r['batch']} | {k.get('median_ms', float('nan')):.3f} | "
              f"{k.get('images_per_s', 0):.0f} | {t.get('eager', {}).get('images_per_s', 0):.0f} | "
              f"{c or 0:.0f} | {k.get('images_per_s', 0) / c if c else float('nan'):.2f} |")
    return 0


if __name__ == "__main__":
    sys.exit(main())
