#!/usr/bin/env python3
"""The task benchmark (GPU machine): detection, segmentation, video, optical flow, recurrent text
models and Stable Diffusion 1.5's networks, exported as users export them
(scripts/models/tasks.py), built by kiln at FP32/TF32 and FP16, checked against ONNX Runtime's
CPU float32 output and timed against PyTorch eager and torch.compile in the same run.

  python3 bench/tasks.py --kiln .deps/kiln --out OUT [--models a,b] [--batches 1,8] [--iters 100]
                         [--deadline SECONDS] [--no-torch] [--no-compile] [--work DIR]

Per model (random weights, seed 0; scripts/models/tasks.py says how each is made and why the
detectors' class-logit layers are rescaled):
  1. export: TorchScript at the model's opset (17; 14 for Stable Diffusion as diffusers and
     optimum export it), the dynamo exporter where TorchScript fails (said in the row);
  2. two engines with an empty timing cache (the build times are reported): FP32 (kiln's
     default, TF32 tensor cores) and FP16 (`--fp16`); one profile of batch 1..max(--batches)
     where the model has a batch axis (the Stable Diffusion UNet's batch is images: 2 samples
     each, classifier-free guidance), else the one image's fixed shape. A model kiln refuses is
     a row with kiln's one-line error, and the harness goes on;
  3. accuracy on the model's example inputs (batch 2 where it has a batch axis, else 1), ONNX
     Runtime's CPU float32 output the reference:
       dense outputs: relative L2 of kiln FP32 and FP16, next to PyTorch's own FP32 and FP16
       error on the GPU; the FP16 limit is max(1e-2, 1.5 x PyTorch's FP16 error) as in zoo.py,
       the FP32 one max(2e-3, 1.5 x PyTorch's FP32 error);
       detections: FP32 by scripts/models/task_checks.py's rule (every detection paired by
       class and IoU, boxes within 1e-3 of their axis's scale and scores within 1e-3 relative,
       unpaired ones only as tie-breaks at the cut); where kiln misses that, both kiln and ONNX
       Runtime against the PyTorch model in float64 (kiln passes within the same rule of it: ONNX
       Runtime's own FP32 error is then said), and where the TF32 engine still misses, a strict
       `--no-tf32` engine is checked too, so TF32 rounding and a kiln bug are told apart; FP16
       detections matched by class with IoU >= 0.9, kiln's and PyTorch FP16's alike, listing
       those that differ;
  4. speed at each batch: `kiln bench --use-cuda-graph --no-data-transfers` of both engines
     (without CUDA graphs where capture is refused, said in the row), PyTorch eager FP32 and
     FP16 and torch.compile(mode="reduce-overhead") FP16 (where it compiles; the first error
     line where not), medians of --iters runs (CUDA events), all in this process.
     Stable Diffusion's UNet also gets kiln FP16 against PyTorch eager FP32 (target 2.5x).
Writes OUT/tasks.json (after each stage of each model: a run killed at the device's time limit
keeps the rows it got to, the last marked partial) and OUT/tasks.md (the table for
docs/perf.md); `bench/tasks.py --table OUT1/tasks.json OUT2/tasks.json` prints the table of
several runs. --cpu checks the harness itself on a machine without a GPU (kiln's CPU backend,
PyTorch on the CPU; e.g. --models sd15_unet_tiny,yolo_like_tiny --batches 1,2 --iters 3).
On the GPU machine through bench/tasks.sh (which installs the carried diffusers wheel).
"""
import argparse
import json
import os
import sys
import time
import traceback

import numpy as np

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, os.path.join(ROOT, "scripts", "models"))
from transformer_bench import rel_l2, run, time_torch  # noqa: E402
import task_checks as tc  # noqa: E402
import tasks  # noqa: E402

DEFAULT = ("ssdlite320_mobilenet_v3_large,retinanet_resnet50_fpn,fcos_resnet50_fpn,"
           "fasterrcnn_mobilenet_v3_large_320_fpn,maskrcnn_resnet50_fpn,keypointrcnn_resnet50_fpn,yolo_like,"
           "fcn_resnet50,deeplabv3_mobilenet_v3_large,lraspp_mobilenet_v3_large,r3d_18,s3d,raft_small,"
           "lstm_classifier,gru_tagger,sd15_text_encoder,sd15_unet,sd15_vae_decoder")
UNET_TARGET = 2.5


def log(msg):
    print(msg, flush=True)


def one_line(e):
    """kiln's one-line error (`kiln: error: ...`, the model's path left out) or the exception's
    last line that says error."""
    s = str(e).strip()
    if "kiln: error: " in s:
        s = s[s.rindex("kiln: error: ") + len("kiln: error: "):].splitlines()[0]
        return s.split(".onnx: ", 1)[-1][:300]
    lines = [l for l in s.splitlines() if "error" in l.lower()] or s.splitlines() or [type(e).__name__]
    return lines[-1].strip()[:300]


def shape_arg(feeds):
    return ",".join(f"{k}:{'x'.join(map(str, v.shape)) or '1'}" for k, v in feeds.items())


DEVICE = "cuda"  # --cpu: "cpu" (a check of the harness itself on a machine without a GPU)


def torch_inputs(feeds, dtype):
    import torch
    return tuple(torch.from_numpy(v).to(DEVICE).to(dtype) if v.dtype.kind == "f" else torch.from_numpy(v).to(DEVICE)
                 for v in feeds.values())


def time_module(fn, args, iters, warmup=5):
    """time_torch (CUDA events) on the GPU after `warmup` untimed calls; wall-clock medians
    with --cpu."""
    import torch
    with torch.inference_mode():
        for _ in range(warmup):
            fn(*args)
    if DEVICE == "cuda":
        torch.cuda.synchronize()
        return time_torch(fn, args, iters)
    import statistics
    times = []
    with torch.inference_mode():
        for _ in range(iters):
            t0 = time.perf_counter()
            fn(*args)
            times.append((time.perf_counter() - t0) * 1e3)
    return statistics.median(times)


def torch_outputs(module, args):
    import torch
    with torch.inference_mode():
        o = module(*args)
    o = o if isinstance(o, (tuple, list)) else (o,)
    return [x.float().cpu().numpy() for x in o]


def kiln_run(a, engine, feeds, names, tag):
    d = os.path.join(a.work, tag)
    os.makedirs(d, exist_ok=True)
    cmd = [a.kiln, "run", "--engine", engine, "--save-outputs", os.path.join(d, "out")]
    for k, v in feeds.items():
        np.save(os.path.join(d, k + ".npy"), v)
        cmd += ["--input", f"{k}={os.path.join(d, k + '.npy')}"]
    run(cmd, timeout=900)
    return {n: np.load(os.path.join(d, "out", n + ".npy")) for n in names}


def kiln_bench(a, engine, feeds, tag):
    """Median ms and whether CUDA graphs were used (retried without them where refused). The
    engine runs on the feeds PyTorch is timed on (`kiln bench --load-inputs`): a detector's
    time depends on how many boxes pass its threshold, which random data would not give."""
    out = os.path.join(a.work, tag + ".json")
    loads = []
    for n, v in feeds.items():
        path = os.path.join(a.work, f"{tag}_{n}.npy")
        np.save(path, v)
        loads += ["--load-inputs", f"{n}:{path}"]
    base = [a.kiln, "bench", "--engine", engine, *loads, "--no-data-transfers",
            "--iterations", str(a.iters), "--warmup", "20", "--duration", "1", "--export-json", out]
    if DEVICE == "cpu":  # the CPU backend has no CUDA graphs
        run(base, timeout=600)
        return _median(out), None
    try:
        run(base + ["--use-cuda-graph"], timeout=600)
    except RuntimeError as e:
        log(f"  kiln bench with CUDA graphs failed ({one_line(e)}); without")
        run(base + ["--no-cuda-graph"], timeout=600)
    with open(out) as f:  # an engine whose sizes the data decides runs without them
        return _median(out), bool(json.load(f).get("cuda_graph"))


def _median(path):
    with open(path) as f:
        return json.load(f)["latency_ms"]["median"]


def build(a, onnx, engine, profile, extra, row, key):
    t0 = time.time()
    try:
        run([a.kiln, "build", "--onnx", onnx, "--save-engine", engine] + profile + extra, timeout=1800)
    except RuntimeError as e:
        row[f"{key}_error"] = one_line(e)
        log(f"  kiln build {key}: {row[f'{key}_error']}")
        return False
    row[f"{key}_build_s"] = round(time.time() - t0, 1)
    return True


def check_dense(row, key, got, ref, names):
    errs = {n: rel_l2(got[n], ref[n]) for n in names}
    row[f"{key}_err"] = max(errs.values())
    row[f"{key}_errs"] = errs


class Autocast16:
    """PyTorch FP16 for a model whose .half() copy cannot run: the float32 model under
    torch.autocast (the inputs given to it in float32)."""

    def __init__(self, m32):
        self.m32 = m32

    def __call__(self, *args):
        import torch
        with torch.autocast("cuda", dtype=torch.float16):
            return self.m32(*[x.float() if x.is_floating_point() else x for x in args])


def check(a, row, task, onnx, engines, feeds, m32, m16):
    """Accuracy of kiln's engines and PyTorch on the GPU against ONNX Runtime's CPU float32.
    Returns the PyTorch FP16 model to time (Autocast16 where .half() fails)."""
    import onnxruntime as ort
    import torch
    so = ort.SessionOptions()
    so.intra_op_num_threads = os.cpu_count() or 4
    sess = ort.InferenceSession(onnx, so, providers=["CPUExecutionProvider"])
    names = [o.name for o in sess.get_outputs()]
    ref = dict(zip(names, sess.run(None, feeds)))
    outs = {}
    for key, engine in engines.items():
        try:
            outs[key] = kiln_run(a, engine, feeds, names, f"{task.name}_{key}")
        except RuntimeError as e:  # an engine that builds but does not run is a result
            row[f"{key}_run_error"] = one_line(e)
            log(f"  kiln run {key}: {row[f'{key}_run_error']}")
    if m32 is not None:
        outs["torch32"] = dict(zip(names, torch_outputs(m32, torch_inputs(feeds, torch.float32))))
    if m16 is not None:
        try:
            outs["torch16"] = dict(zip(names, torch_outputs(m16, torch_inputs(feeds, torch.float16))))
        except Exception as e:  # noqa: BLE001 - a model PyTorch cannot run in FP16 is said so
            # A model whose .half() copy fails (RAFT builds its sampling grid in float32):
            # FP16 as its users run it, under autocast, which keeps such ops in float32.
            try:
                m16 = Autocast16(m32)
                outs["torch16"] = dict(zip(names, torch_outputs(m16, torch_inputs(feeds, torch.float16))))
                row["torch16_autocast"] = f"model.half() fails ({one_line(e)}): PyTorch FP16 is torch.autocast"
                log(f"  {row['torch16_autocast']}")
            except Exception as e2:  # noqa: BLE001
                m16 = None
                row["torch16_error"] = f"{one_line(e)}; under autocast: {one_line(e2)}"
    if task.kind == "dense":
        for key, got in outs.items():
            check_dense(row, key, got, ref, names)
        if "fp16_err" in row:
            row["fp16_limit"] = max(1e-2, 1.5 * row.get("torch16_err", 0.0))
            row["fp16_ok"] = row["fp16_err"] <= row["fp16_limit"]
        if "fp32_err" in row:
            row["fp32_limit"] = max(2e-3, 1.5 * row.get("torch32_err", 0.0))
            row["fp32_ok"] = row["fp32_err"] <= row["fp32_limit"]
        return m16
    rref = tc.det_rows(ref, task.det)
    row["detections_ref"] = len(rref["scores"])
    f64 = {}  # PyTorch's float64 outputs, made when an FP32 check needs the arbiter
    for key, got in outs.items():
        g = tc.det_rows(got, task.det)
        if key in ("fp32", "strict", "torch32"):
            r = tc.compare_exact(rref, g)
            row[f"{key}_det"] = r
            row[f"{key}_ok"] = r["ok"]
            if not r["ok"] and m32 is not None:
                arbitrate(row, key, rref, g, m32, feeds, names, task.det, f64)
        else:
            row[f"{key}_det"] = tc.compare_matched(rref, g)
    if "fp32" in outs and not row["fp32_ok"] and a.strict_check:
        strict = os.path.join(a.work, f"{task.name}_strict.kiln")
        if build(a, onnx, strict, row["_profile"], ["--no-tf32"] + (["--backend", "cpu"] if a.cpu else []), row,
                 "strict"):
            g = tc.det_rows(kiln_run(a, strict, feeds, names, f"{task.name}_strict"), task.det)
            row["strict_det"] = tc.compare_exact(rref, g)
            row["strict_ok"] = row["strict_det"]["ok"]
            if not row["strict_ok"] and m32 is not None:
                arbitrate(row, "strict", rref, g, m32, feeds, names, task.det, f64)
    return m16


def arbitrate(row, key, rref, g, m32, feeds, names, det, f64):
    """Where FP32 detections differ from ONNX Runtime's beyond task_checks' rule: both against
    the PyTorch model in float64 (row[key_arb]); kiln (or PyTorch FP32) passes when within the
    same rule of it. `f64` caches the float64 outputs across calls."""
    import copy

    import torch
    if not f64:
        m64 = copy.deepcopy(m32).double()
        f64.update(zip(names, torch_outputs(m64, torch_inputs(feeds, torch.float64))))
        del m64
    arb = tc.arbitrate(rref, g, tc.det_rows(f64, det))
    row[f"{key}_arb"] = arb["why"]
    row[f"{key}_ok"] = arb["ok"]


def time_torch_variants(a, row, task, m32, m16, b, feeds):
    import torch
    for key, m, dt in (("eager32", m32, torch.float32), ("eager16", m16, torch.float16)):
        if m is None:
            continue
        try:
            args = torch_inputs(feeds, dt)
            row[f"{key}_b{b}"] = time_module(m, args, a.iters)
        except Exception as e:  # noqa: BLE001
            row[f"{key}_b{b}_error"] = one_line(e)
    if a.no_compile or m16 is None or row.get("compile_error") or (a.compile_batches and b not in a.compile_batches):
        return
    torch._dynamo.reset()
    try:
        fn = torch.compile(m16, mode="reduce-overhead")
        args = torch_inputs(feeds, torch.float16)
        t0 = time.time()
        with torch.inference_mode():
            for _ in range(3):
                fn(*args)
            torch.cuda.synchronize()
        row[f"compile_s_b{b}"] = round(time.time() - t0, 1)
        row[f"compile16_b{b}"] = time_module(fn, args, a.iters)
    except Exception as e:  # noqa: BLE001 - torch.compile's failure is a result too
        row["compile_error"] = one_line(e)
        log(f"  torch.compile failed: {row['compile_error']}")
    torch._dynamo.reset()


def one_model(a, name, save):
    """One model's row; save(row) after each stage, so a run killed at its time limit keeps what
    the model got to (the row says "partial")."""
    import torch
    row = {"model": name, "partial": True}
    t0 = time.time()
    task = tasks.MODELS[name]()
    row["note"] = task.note
    d = os.path.join(a.work, name)
    cached = [p for p in (os.path.join(d, name + ".onnx"), os.path.join(d, name, name + ".onnx"))
              if os.path.exists(p + ".json")]
    if cached:  # an export of an earlier run (--work): its manifest says how it was made
        onnx = cached[0]
        with open(onnx + ".json") as f:
            meta = json.load(f)
    else:
        onnx, meta = tasks.export_to(task, d)
    row["exporter"] = meta["exporter"]
    if meta.get("torchscript_error"):
        row["torchscript_error"] = meta["torchscript_error"]
    acc_batch = a.check_batch if task.batchable else 1
    row["opset"] = meta.get("opset", task.opset)
    row["export_s"] = round(time.time() - t0, 1)
    batches = [b for b in a.batches if task.batchable or b == 1]
    row["batches"] = batches
    if task.batchable:  # tuned at the largest timed batch; the accuracy check's batch inside the profile too
        lo, opt, hi = task.feeds(1), task.feeds(max(batches)), task.feeds(max(batches + [acc_batch]))
        profile = ["--min-shapes", shape_arg(lo), "--opt-shapes", shape_arg(opt), "--max-shapes", shape_arg(hi)]
    else:
        profile = ["--shapes", shape_arg(task.feeds(1))]
    row["_profile"] = profile

    engines = {}
    for key, extra in ((("fp32", ["--backend", "cpu"]),) if a.cpu else
                       tuple((p, {"fp32": [], "fp16": ["--fp16"]}[p]) for p in a.precisions)):
        engine = os.path.join(a.work, f"{name}_{key}.kiln")
        if build(a, onnx, engine, profile, extra, row, key):
            engines[key] = engine
        save(row)
    if not engines and not a.torch_when_refused:
        row.pop("partial")
        return row

    m32 = m16 = None
    if not a.no_torch:
        m32 = task.module.to(DEVICE).eval()
        import copy
        m16 = None if a.cpu else copy.deepcopy(m32).half()
    if engines:
        m16 = check(a, row, task, onnx, engines, task.feeds(acc_batch), m32, m16)
        save(row)
    for b in batches:
        feeds = task.feeds(b)
        for key, engine in engines.items():
            try:
                ms, graphs = kiln_bench(a, engine, feeds, f"{name}_{key}_b{b}")
            except RuntimeError as e:
                row[f"kiln_{key}_b{b}_error"] = one_line(e)
                log(f"  kiln bench {key} b{b}: {row[f'kiln_{key}_b{b}_error']}")
                continue
            row[f"kiln_{key}_b{b}"] = ms
            if graphs is not None:
                row["cuda_graphs"] = graphs and row.get("cuda_graphs", True)
        if not a.no_torch:
            time_torch_variants(a, row, task, m32, m16, b, feeds)
        save(row)
    del m32, m16, task
    row.pop("partial")
    torch._dynamo.reset()
    if not a.cpu:
        torch.cuda.empty_cache()
    return row


def fmt_err(r, key):
    if r.get(f"{key}_det"):
        d = r[f"{key}_det"]
        if "ok" in d:
            if r.get(f"{key}_arb"):
                return (f"{d['count']}/{d['count_ref']} det, box {d['box_rel']:.0e}, score {d['score_rel']:.0e}; "
                        + ("" if r.get(f"{key}_ok") else "**") + "PyTorch float64 " +
                        r[f"{key}_arb"].removeprefix("against float64: ") + ("" if r.get(f"{key}_ok") else "**"))
            return (f"{d['count']}/{d['count_ref']} det, box {d['box_rel']:.0e}" if d["ok"]
                    else f"**{d.get('why', 'differs')}**")
        return f"{d['matched']}/{d['count_ref']} matched ({d['count']} det)"
    if f"{key}_err" in r:
        return f"{r[f'{key}_err']:.1e}"
    return "-"


def table(rows, batches):
    head = ["model", "exporter", "build s (FP32, FP16)", "FP32 check: kiln / PyTorch", "FP16 check: kiln / PyTorch"]
    for b in batches:
        head.append(f"b{b} ms: kiln FP16 / eager FP16 / compile FP16 (kiln FP32 / eager FP32)")
    lines = ["| " + " | ".join(head) + " |", "|" + "---|" * len(head)]
    notes = []
    for r in rows:
        if "error" in r:
            lines.append(f"| {r['model']} | harness: {r['error'][:150]} |" + " |" * (len(head) - 2))
            continue
        exp = r.get("exporter", "-") + (" (TorchScript failed)" if r.get("torchscript_error") else "")
        if r.get("partial"):
            notes.append(f"- {r['model']}: partial row (the run stopped inside this model)")
        if "fp32_build_s" not in r and "fp16_build_s" not in r:
            lines.append(f"| {r['model']} | {exp} | refused: {r.get('fp32_error') or r.get('fp16_error')} |"
                         + " - |" * (len(head) - 3))
            continue
        builds = f"{r.get('fp32_build_s', '-')}, {r.get('fp16_build_s', '-')}"
        c32 = f"{fmt_err(r, 'fp32')} / {fmt_err(r, 'torch32')}"
        if r.get("strict_det"):
            c32 += f"; --no-tf32: {fmt_err(r, 'strict')}"
        if "fp32_ok" in r and r.get("fp32_limit") and not r["fp32_ok"]:
            c32 += " (over)"
        c16 = f"{fmt_err(r, 'fp16')} / {fmt_err(r, 'torch16')}"
        if "fp16_ok" in r and not r["fp16_ok"]:
            c16 += " (over)"
        cells = [r["model"], exp, builds, c32, c16]
        for b in batches:
            if b not in r.get("batches", []):
                cells.append("n/a (one image a call)")
                continue
            g = lambda k: f"{r[k]:.3f}" if isinstance(r.get(k), float) else "-"  # noqa: E731
            cells.append(f"{g(f'kiln_fp16_b{b}')} / {g(f'eager16_b{b}')} / {g(f'compile16_b{b}')} "
                         f"({g(f'kiln_fp32_b{b}')} / {g(f'eager32_b{b}')})")
        lines.append("| " + " | ".join(cells) + " |")
        for k in sorted(r):
            if k.endswith("_run_error") or (k.startswith("kiln_") and k.endswith("_error")):
                notes.append(f"- {r['model']}: {k[:-len('_error')].replace('_', ' ')}: {r[k]}")
        if r.get("torch16_autocast"):
            notes.append(f"- {r['model']}: {r['torch16_autocast']}")
        if r.get("compile_error"):
            notes.append(f"- {r['model']}: torch.compile failed: {r['compile_error']}")
        if r.get("cuda_graphs") is False:
            notes.append(f"- {r['model']}: kiln timed without CUDA graphs (capture refused)")
        for key in ("fp16", "torch16"):
            if r.get(f"{key}_det", {}).get("n_unmatched_ref"):
                notes.append(f"- {r['model']} {key}: {tc.summary_matched(r[f'{key}_det'])}")
        if r["model"] == "sd15_unet":
            for b in r.get("batches", []):
                k, e = r.get(f"kiln_fp16_b{b}"), r.get(f"eager32_b{b}")
                if k and e:
                    notes.append(f"- sd15_unet batch {b} ({2 * b} samples): PyTorch eager FP32 {e:.2f} ms / kiln FP16 "
                                 f"{k:.2f} ms = **{e / k:.2f}x** (target {UNET_TARGET}x)")
    return "\n".join(lines) + "\n" + ("\n" + "\n".join(notes) + "\n" if notes else "")


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--kiln", required=True)
    ap.add_argument("--out", required=True)
    ap.add_argument("--work", default="/tmp/kiln-tasks")
    ap.add_argument("--models", default=DEFAULT)
    ap.add_argument("--batches", default="1,8")
    ap.add_argument("--iters", type=int, default=100)
    ap.add_argument("--deadline", type=float, default=0, help="stop starting models after this many seconds")
    ap.add_argument("--no-torch", action="store_true", help="kiln only (no PyTorch timings or checks)")
    ap.add_argument("--no-compile", action="store_true", help="no torch.compile")
    ap.add_argument("--compile-batches", default="",
                    help="torch.compile at these batches only (default: every batch; compiling the SD UNet "
                         "takes a minute or two a batch)")
    ap.add_argument("--torch-when-refused", action="store_true",
                    help="time PyTorch also for models kiln refuses (default: skip them)")
    ap.add_argument("--no-strict-check", dest="strict_check", action="store_false",
                    help="detections: no --no-tf32 engine where the TF32 one misses the FP32 rule")
    ap.add_argument("--precisions", default="fp32,fp16", help="kiln engines to build: fp32 (TF32), fp16")
    ap.add_argument("--check-batch", type=int, default=2,
                    help="the batch of the accuracy check (models with a batch axis; 1 saves ONNX Runtime's "
                         "CPU time on the big ones)")
    ap.add_argument("--cpu", action="store_true",
                    help="a check of the harness on a machine without a GPU: kiln's CPU backend (FP32 "
                         "engines only), PyTorch float32 on the CPU, no torch.compile")
    ap.add_argument("--table", nargs="+", metavar="JSON",
                    help="only print the table of earlier runs' tasks.json (partial rows too), in order")
    if "--table" in sys.argv:  # no --kiln or --out needed
        j = [json.load(open(p)) for p in sys.argv[sys.argv.index("--table") + 1:]]
        rows = [r for x in j for r in x["rows"]]
        batches = sorted({b for r in rows for b in r.get("batches", [])}) or [1]
        print(table(rows, batches))
        return 0
    a = ap.parse_args()
    global DEVICE
    if a.cpu:
        DEVICE, a.no_compile = "cpu", True
    a.batches = [int(b) for b in a.batches.split(",")]
    a.precisions = [p for p in a.precisions.split(",") if p]
    a.compile_batches = [int(b) for b in a.compile_batches.split(",") if b]
    if any(p not in ("fp32", "fp16") for p in a.precisions):
        sys.exit(f"tasks: --precisions takes fp32 and fp16, not {','.join(a.precisions)}")
    if not os.access(a.kiln, os.X_OK):
        sys.exit(f"tasks: --kiln {a.kiln} is not an executable")
    unknown = [m for m in a.models.split(",") if m not in tasks.MODELS]
    if unknown:
        sys.exit(f"tasks: unknown model(s) {', '.join(unknown)} (known: {', '.join(tasks.MODELS)})")
    import torch
    if not a.cpu and not torch.cuda.is_available():
        sys.exit("tasks: PyTorch sees no GPU (this is the GPU machine's benchmark)")
    os.makedirs(a.out, exist_ok=True)
    os.makedirs(a.work, exist_ok=True)
    env = {"gpu": None if a.cpu else torch.cuda.get_device_name(0), "torch": torch.__version__, "command": " ".join(sys.argv)}
    for mod in ("torchvision", "transformers", "diffusers", "onnxruntime"):
        try:
            env[mod] = __import__(mod).__version__
        except ImportError:
            env[mod] = None
    log(f"tasks: {env}")
    rows, start = [], time.time()
    for name in a.models.split(","):
        if a.deadline and time.time() - start > a.deadline:
            log(f"{name}: skipped (deadline)")
            rows.append({"model": name, "error": "not run (deadline)"})
            continue
        t0 = time.time()

        def save(partial):
            with open(os.path.join(a.out, "tasks.json"), "w") as f:
                json.dump({"env": env, "rows": rows + [partial]}, f, indent=1, default=str)
        try:
            row = one_model(a, name, save)
        except Exception as e:  # noqa: BLE001 - a failing model is a row of the table
            traceback.print_exc()
            row = {"model": name, "error": f"{type(e).__name__}: {one_line(e)}"}
        row.pop("_profile", None)
        row["seconds"] = round(time.time() - t0, 1)
        rows.append(row)
        log(json.dumps(row, default=str))
        with open(os.path.join(a.out, "tasks.json"), "w") as f:
            json.dump({"env": env, "rows": rows}, f, indent=1, default=str)
        with open(os.path.join(a.out, "tasks.md"), "w") as f:  # after each model: a killed run keeps its rows
            f.write(table(rows, a.batches))
    log(table(rows, a.batches))
    return 0


if __name__ == "__main__":
    sys.exit(main())
