#!/usr/bin/env python3
"""The model zoo benchmark (GPU machine): models exported as users export them, FP16 engines,
accuracy against ONNX Runtime next to PyTorch's own FP16 error, and kiln against
torch.compile(mode="reduce-overhead") at batch 1 and 32 in the same run.

  python3 bench/zoo.py --kiln .deps/kiln --out OUT [--models a,b] [--batches 1,32]
                       [--iters 200] [--deadline SECONDS] [--no-torch] [--profile]

--models takes the zoo's names below or any other timm architecture (timm.is_model).

Per model (random weights; BatchNorm statistics recalibrated on random images first, as an
untrained network's running statistics would overflow FP16 in deep stacks):
  1. export: torch.onnx.export (TorchScript) with a dynamic batch; the dynamo exporter where
     TorchScript fails (torchvision and timm models both);
  2. accuracy at batch 2: ONNX Runtime's CPU float32 output is the reference; kiln's FP16 engine
     and PyTorch FP16 are each compared with it (relative L2); the target is
     max(1e-2, 1.5 x PyTorch's error);
  3. one FP16 engine with batch 1..max(batches), tuned at the largest batch, built with an empty
     timing cache (its build time is reported);
  4. `kiln bench --use-cuda-graph --no-data-transfers` and torch.compile(mode="reduce-overhead")
     in this process, medians of --iters runs each, at every batch; the layers that launch
     kernels, and how many of them are Reformat or Transpose layers (`kiln inspect --json`).
Writes OUT/zoo.json and OUT/zoo.md (the table for docs/perf.md, with the geometric means).
"""
import argparse
import json
import math
import os
import statistics
import sys
import time
import traceback

import numpy as np

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from transformer_bench import rel_l2, run, time_torch  # noqa: E402

# name: (source, input side); timm models take their pretrained config's input size.
MODELS = {
    "convnext_tiny": ("timm", None),
    "convnext_small": ("timm", None),
    "swin_tiny_patch4_window7_224": ("timm", None),
    "efficientnet_b3": ("timm", None),
    "tv_efficientnet_b0": ("torchvision", 224),
    "tv_densenet121": ("torchvision", 224),
    "mobilenetv3_large_100": ("timm", None),
    "resnext50_32x4d": ("timm", None),
    "ghostnet_100": ("timm", None),
    "repvgg_a2": ("timm", None),
    "vit_small_patch16_224": ("timm", None),
    "fastvit_t8": ("timm", None),
    "nfnet_l0": ("timm", None),
    "regnety_016": ("timm", None),
    "tv_resnet50": ("torchvision", 224),
}


def log(msg):
    print(msg, flush=True)


def torch_model(name):
    """The model in float32 on the GPU, eval mode, and its input shape [3, H, W]."""
    import torch
    torch.manual_seed(0)
    source, side = MODELS.get(name, ("timm", None))  # any other name: a timm architecture
    if source == "torchvision":
        import torchvision
        m = getattr(torchvision.models, name[len("tv_"):])(weights=None)
        shape = [3, side, side]
    else:
        import timm
        m = timm.create_model(name, pretrained=False)
        shape = list(m.pretrained_cfg["input_size"])
    m = m.cuda().eval()
    recalibrate_bn(m, shape)
    return m, shape


def recalibrate_bn(m, shape, batches=4, batch=16):
    """BatchNorm running statistics from a few random batches (cumulative averages)."""
    import torch
    bns = [mod for mod in m.modules() if isinstance(mod, torch.nn.modules.batchnorm._BatchNorm)]
    if not bns:
        return
    for bn in bns:
        bn.reset_running_stats()
        bn.momentum = None
    m.train()
    g = torch.Generator(device="cuda").manual_seed(1)
    with torch.no_grad():
        for _ in range(batches):
            m(torch.randn([batch] + shape, device="cuda", generator=g))
    m.eval()


def export(m, shape, path):
    """ONNX with a dynamic batch: TorchScript first, dynamo where that fails. Returns the
    exporter's name."""
    import torch
    x = torch.randn([2] + shape, device="cuda")
    try:
        torch.onnx.export(m, (x,), path, input_names=["input"], output_names=["output"],
                          dynamic_axes={"input": {0: "N"}, "output": {0: "N"}}, opset_version=17,
                          dynamo=False)
        return "torchscript"
    except Exception as e:  # noqa: BLE001 - any exporter failure falls through to dynamo
        log(f"  TorchScript export failed ({type(e).__name__}: {str(e)[:200]}); dynamo")
    batch = torch.export.Dim("N", min=1, max=1024)
    torch.onnx.export(m, (x,), path, input_names=["input"], output_names=["output"],
                      dynamic_shapes=({0: batch},), dynamo=True)
    return "dynamo"


def inspect_counts(kiln, engine):
    """Layers that launch kernels, and those of them that are Reformat or Transpose layers; each
    layer's tactic (and variant) by name."""
    out, _ = run([kiln, "inspect", engine, "--json"])
    j = json.loads(out)
    launching = [l for l in j["layers"] if l.get("launches", True) and l.get("tactic") != "host"]
    kinds = {}
    for l in launching:
        kinds[l["type"]] = kinds.get(l["type"], 0) + 1
    tactics = {l["name"]: l.get("tactic", "?") + ("/" + l["variant"] if l.get("variant") else "")
               for l in j["layers"]}
    return {"kernel_layers": j.get("kernel_layers", len(launching)),
            "reformat": kinds.get("kiln.Reformat", 0), "transpose": kinds.get("Transpose", 0)}, tactics


def kiln_bench(kiln, engine, shape, iters, out_json, profile=False):
    run([kiln, "bench", "--engine", engine, "--shapes", shape, "--use-cuda-graph",
         "--no-data-transfers", "--iterations", str(iters), "--warmup", "50", "--duration", "1",
         "--export-json", out_json] + (["--dump-profile"] if profile else []))
    with open(out_json) as f:
        rec = json.load(f)
    return rec


def profile_by_type(rec, tactics, top=6):
    """The bench record's per-layer profile summed by layer type and by tactic: [(type or
    tactic, ms, share)] each."""
    prof = rec.get("profile") or []
    total = sum(p.get("ms", 0.0) for p in prof) or 1.0
    by_type, by_tactic = {}, {}
    for p in prof:
        by_type[p.get("type", "?")] = by_type.get(p.get("type", "?"), 0.0) + p.get("ms", 0.0)
        t = tactics.get(p.get("name"), "?")
        by_tactic[t] = by_tactic.get(t, 0.0) + p.get("ms", 0.0)
    rank = lambda d: [(k, round(v, 4), round(v / total, 3))
                      for k, v in sorted(d.items(), key=lambda kv: -kv[1])[:top]]
    return rank(by_type), rank(by_tactic)


def one_model(a, name):
    import onnxruntime as ort
    import torch
    row = {"model": name}
    t0 = time.time()
    m, shape = torch_model(name)
    row["input"] = "x".join(map(str, shape))
    path = os.path.join(a.work, f"{name}.onnx")
    row["exporter"] = export(m, shape, path)
    row["export_s"] = round(time.time() - t0, 1)

    # Accuracy at batch 2 against ONNX Runtime's CPU float32.
    rng = np.random.default_rng(2)
    x2 = rng.standard_normal([2] + shape).astype(np.float32)
    so = ort.SessionOptions()
    so.intra_op_num_threads = os.cpu_count() or 4
    ref = ort.InferenceSession(path, so, providers=["CPUExecutionProvider"]).run(None, {"input": x2})[0]
    m16 = m.half()
    with torch.inference_mode():
        t16 = m16(torch.from_numpy(x2).cuda().half()).float().cpu().numpy()
    row["torch_fp16_err"] = rel_l2(t16, ref)

    bmax = max(a.batches)
    engine = os.path.join(a.work, f"{name}.kiln")
    dims = "x".join(map(str, shape))
    _, build_s = run([a.kiln, "build", "--onnx", path, "--save-engine", engine, "--fp16",
                      "--min-shapes", f"input:1x{dims}", "--opt-shapes", f"input:{bmax}x{dims}",
                      "--max-shapes", f"input:{bmax}x{dims}"], timeout=900)
    row["build_s"] = round(build_s, 1)
    xin = os.path.join(a.work, f"{name}_x2.npy")
    np.save(xin, x2)
    outdir = os.path.join(a.work, f"{name}_out")
    run([a.kiln, "run", "--engine", engine, "--input", f"input={xin}", "--save-outputs", outdir])
    got = np.load(os.path.join(outdir, "output.npy"))
    row["kiln_fp16_err"] = rel_l2(got, ref)
    row["err_limit"] = max(1e-2, 1.5 * row["torch_fp16_err"])
    row["accurate"] = bool(row["kiln_fp16_err"] <= row["err_limit"])
    counts, tactics = inspect_counts(a.kiln, engine)
    row.update(counts)

    for b in a.batches:
        rec = kiln_bench(a.kiln, engine, f"input:{b}x{dims}", a.iters,
                         os.path.join(a.work, f"{name}_b{b}.json"), profile=a.profile and b == bmax)
        row[f"kiln_b{b}"] = rec["latency_ms"]["median"]
        if a.profile and b == bmax:
            row["profile"], row["profile_tactics"] = profile_by_type(rec, tactics)
        if not a.no_torch:
            torch._dynamo.reset()
            fn = torch.compile(m16, mode="reduce-overhead")
            xb = torch.randn([b] + shape, device="cuda").half()
            tc = time.time()
            with torch.inference_mode():
                for _ in range(5):
                    fn(xb)
                torch.cuda.synchronize()
            row[f"compile_s_b{b}"] = round(time.time() - tc, 1)
            row[f"torch_compile_b{b}"] = time_torch(fn, (xb,), a.iters)
            row[f"ratio_b{b}"] = row[f"torch_compile_b{b}"] / row[f"kiln_b{b}"]
    del m, m16
    torch._dynamo.reset()
    torch.cuda.empty_cache()
    return row


def table(rows, batches):
    head = ["model", "exporter", "kernel layers (Reformat, Transpose)", "build s", "kiln / PyTorch FP16 error"]
    for b in batches:
        head.append(f"b{b}: kiln / torch.compile ms")
    lines = ["| " + " | ".join(head) + " |", "|" + "---|" * len(head)]
    for r in rows:
        if "error" in r:
            lines.append(f"| {r['model']} | failed: {r['error'][:120]} |" + " |" * (len(head) - 2))
            continue
        cells = [r["model"], r["exporter"], f"{r['kernel_layers']} ({r['reformat']}, {r['transpose']})",
                 f"{r['build_s']:.0f}",
                 f"{r['kiln_fp16_err']:.1e} / {r['torch_fp16_err']:.1e}" + ("" if r["accurate"] else " (over)")]
        for b in batches:
            k, t = r.get(f"kiln_b{b}"), r.get(f"torch_compile_b{b}")
            cells.append(f"{k:.3f} / {t:.3f} = **{t / k:.2f}x**" if k and t else (f"{k:.3f} / -" if k else "-"))
        lines.append("| " + " | ".join(cells) + " |")
    geo = []
    for b in batches:
        ratios = [r[f"ratio_b{b}"] for r in rows if f"ratio_b{b}" in r]
        if ratios:
            geo.append(f"batch {b}: {math.exp(statistics.fmean(math.log(x) for x in ratios)):.2f}x "
                       f"over {len(ratios)} models (min {min(ratios):.2f}x)")
    return "\n".join(lines) + ("\n\nGeometric mean of torch.compile / kiln: " + "; ".join(geo) if geo else "") + "\n"


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--kiln", required=True)
    ap.add_argument("--out", required=True)
    ap.add_argument("--work", default="/tmp/kiln-zoo")
    ap.add_argument("--models", default=",".join(MODELS))
    ap.add_argument("--batches", default="1,32")
    ap.add_argument("--iters", type=int, default=200)
    ap.add_argument("--deadline", type=float, default=0, help="stop starting models after this many seconds")
    ap.add_argument("--no-torch", action="store_true", help="kiln only (no torch.compile)")
    ap.add_argument("--profile", action="store_true", help="kiln's per-layer profile at the largest batch")
    a = ap.parse_args()
    a.batches = [int(b) for b in a.batches.split(",")]
    if not os.access(a.kiln, os.X_OK):
        sys.exit(f"zoo: --kiln {a.kiln} is not an executable")
    try:
        import onnxruntime  # noqa: F401
        import timm  # noqa: F401
        import torch
        import torchvision  # noqa: F401
    except ImportError as e:
        sys.exit(f"zoo: {e}: the zoo needs PyTorch, torchvision, timm and ONNX Runtime "
                 "(a GPU machine; KILN_WITH_TORCH=1 scripts/setup.sh for PyTorch)")
    # Beyond the zoo's own list, any timm architecture by its name (models not tuned on).
    unknown = [m for m in a.models.split(",") if m not in MODELS and not timm.is_model(m)]
    if unknown:
        sys.exit(f"zoo: unknown model(s) {', '.join(unknown)}: neither the zoo's "
                 f"({', '.join(MODELS)}) nor timm architectures")
    os.makedirs(a.out, exist_ok=True)
    os.makedirs(a.work, exist_ok=True)
    env = {"gpu": torch.cuda.get_device_name(0), "torch": torch.__version__,
           "command": " ".join(sys.argv)}
    import timm
    env["timm"] = timm.__version__
    log(f"zoo: {env}")
    rows, start = [], time.time()
    for name in a.models.split(","):
        if a.deadline and time.time() - start > a.deadline:
            log(f"{name}: skipped (deadline)")
            rows.append({"model": name, "error": "not run (deadline)"})
            continue
        t0 = time.time()
        try:
            row = one_model(a, name)
        except Exception as e:  # noqa: BLE001 - a failing model is a row of the table
            traceback.print_exc()
            row = {"model": name, "error": f"{type(e).__name__}: {str(e)[-300:]}"}
        row["seconds"] = round(time.time() - t0, 1)
        rows.append(row)
        log(json.dumps(row))
        with open(os.path.join(a.out, "zoo.json"), "w") as f:
            json.dump({"env": env, "rows": rows}, f, indent=1)
    md = table(rows, a.batches)
    with open(os.path.join(a.out, "zoo.md"), "w") as f:
        f.write(md)
    log(md)
    return 0


if __name__ == "__main__":
    sys.exit(main())
