#!/usr/bin/env python3
"""What kiln's CPU backend does with each task model today: export (scripts/models/tasks.py,
cached in --onnx-dir), `kiln build --backend cpu --shapes ...` at the model's example inputs,
`kiln run`, and ONNX Runtime (CPU) on the same inputs; per model whether it builds, the first
error, and whether the outputs agree (dense: relative L2 <= 1e-4; detections: task_checks'
FP32 rule: every detection paired, boxes and scores within 1e-3, unpaired ones only as
tie-breaks at the cut; where kiln and ONNX Runtime differ beyond that, both against PyTorch in
float64 (the arbiter: kiln agrees when it is within the same rule of the float64 outputs).

  python3 scripts/models/task_status.py --kiln build/kiln [--models a,b] [--onnx-dir models/tasks]
                                        [--out DIR] [--timeout 3600]
Writes DIR/task_status.json and DIR/task_status.md (the table) and prints the table.
"""
import argparse
import json
import os
import subprocess
import sys
import time

import numpy as np

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, HERE)
import task_checks as tc  # noqa: E402
import task_inputs as ti  # noqa: E402

DENSE_RTOL = 1e-4


def first_error(text):
    for line in text.strip().splitlines():
        if "error" in line.lower():
            return line.strip()
    return (text.strip().splitlines() or ["(no output)"])[-1].strip()


def kiln(cmd, timeout):
    t0 = time.time()
    try:
        p = subprocess.run(cmd, capture_output=True, text=True, timeout=timeout)
    except subprocess.TimeoutExpired:
        return False, f"timed out after {timeout} s", time.time() - t0
    return p.returncode == 0, (p.stderr + p.stdout), time.time() - t0


def model_files(onnx_dir, name, export_missing):
    """(onnx path, manifest) of `name` (tasks.py --out writes both), exporting it first if
    needed (PyTorch)."""
    for d in (os.path.join(onnx_dir, name), onnx_dir):
        path = os.path.join(d, name + ".onnx")
        if os.path.exists(path) and os.path.exists(path + ".json"):
            with open(path + ".json") as f:
                return path, json.load(f)
    if not export_missing:
        raise FileNotFoundError(f"{name}: no export in {onnx_dir}")
    import tasks
    return tasks.export_to(tasks.MODELS[name](), onnx_dir)


# The ops that decide what a task model needs beyond a CNN or a transformer (counted inside If
# and Loop bodies too): the status table lists those each model has.
WATCH = ("If", "Loop", "Scan", "NonMaxSuppression", "RoiAlign", "GridSample", "LSTM", "GRU", "RNN", "TopK",
         "NonZero", "Resize", "ConvTranspose", "InstanceNormalization", "GroupNormalization")


def onnx_ops(path):
    """{op type: count} over the graph and every subgraph (If branches, Loop bodies)."""
    import onnx
    m = onnx.load(path, load_external_data=False)
    ops = {}

    def walk(g):
        for n in g.node:
            ops[n.op_type] = ops.get(n.op_type, 0) + 1
            for a in n.attribute:
                for sub in ([a.g] if a.HasField("g") else []) + list(a.graphs):
                    walk(sub)
    walk(m.graph)
    return ops


def one(a, name):
    row = {"model": name}
    path, meta = model_files(a.onnx_dir, name, not a.no_export)
    row["_path"] = path
    feeds = ti.feeds(meta["inputs"], 1)
    row.update({k: meta.get(k) for k in ("exporter", "torchscript_error", "opset", "kind")})
    row["ops"] = onnx_ops(path)
    work = os.path.join(a.work, name)
    os.makedirs(work, exist_ok=True)
    engine = os.path.join(work, name + ".kiln")
    shapes = ",".join(f"{k}:{'x'.join(map(str, v.shape)) or '1'}" for k, v in feeds.items())
    ok, out, secs = kiln([a.kiln, "build", "--backend", "cpu", "--onnx", path, "--save-engine", engine,
                          "--shapes", shapes], a.timeout)
    row["build_s"] = round(secs, 1)
    if not ok:
        row.update(builds=False, error=first_error(out))
        return row
    row["builds"] = True
    if a.lower_check:
        lower_check(a, row, meta)
    cmd = [a.kiln, "run", "--engine", engine, "--save-outputs", os.path.join(work, "out")]
    for k, v in feeds.items():
        np.save(os.path.join(work, k + ".npy"), v)
        cmd += ["--input", f"{k}={os.path.join(work, k + '.npy')}"]
    ok, out, secs = kiln(cmd, a.timeout)
    row["run_s"] = round(secs, 1)
    if not ok:
        row.update(runs=False, error=first_error(out))
        return row
    row["runs"] = True
    import onnxruntime as ort
    sess = ort.InferenceSession(path, providers=["CPUExecutionProvider"])
    names = [o.name for o in sess.get_outputs()]
    ref = dict(zip(names, sess.run(None, feeds)))
    got = {n: np.load(os.path.join(work, "out", n + ".npy")) for n in names}
    if meta["kind"] == "detection":
        rref, rgot = tc.det_rows(ref, meta["det"]), tc.det_rows(got, meta["det"])
        r = tc.compare_exact(rref, rgot)
        row["agrees"] = r["ok"]
        row["detail"] = tc.summary_exact(r).replace("(reference", "(ONNX Runtime")
        if not r["ok"] and not a.no_export:
            # The arbiter: the same PyTorch model in float64 (independent of kiln's kernels).
            f64 = torch_float64(name, feeds)
            arb = tc.arbitrate(rref, rgot, tc.det_rows(f64, meta["det"]))
            row["agrees"] = arb["ok"]
            row["detail"] = (tc.summary_exact(r, why=False).replace("(reference", "(ONNX Runtime")
                             + " (outside the rule); PyTorch float64 as the arbiter: "
                             + arb["why"].removeprefix("against float64: "))
    else:
        errs = {n: tc.rel_l2(got[n], ref[n]) for n in names}
        row["agrees"] = all(e <= DENSE_RTOL for e in errs.values())
        row["detail"] = "rel L2 " + ", ".join(f"{n} {e:.1e}" for n, e in errs.items())
    return row


def torch_float64(name, feeds):
    """{output name: array}: the task's PyTorch module (tasks.py, the weights it was exported
    with) run in float64 on the same inputs."""
    import tasks
    import torch
    task = tasks.MODELS[name]()
    m = task.module.double().eval()
    args = [torch.from_numpy(feeds[k]).double() if feeds[k].dtype.kind == "f" else torch.from_numpy(feeds[k])
            for k in task.inputs]
    with torch.no_grad():
        outs = m(*args)
    outs = outs if isinstance(outs, (tuple, list)) else (outs,)
    return {n: o.detach().numpy() for n, o in zip(task.outputs, outs)}


def lower_check(a, row, meta):
    """The cuda build step (kiln_lower_check: lowering with tuning off, no GPU needed) at FP32
    (TF32) and FP16 with bench/tasks.py's profile (batch 1..8 where the model has a batch axis),
    against an H100's 80 GB."""
    if meta["batchable"]:
        lo, hi = ti.feeds(meta["inputs"], 1), ti.feeds(meta["inputs"], 8)
        sh = lambda f: ",".join(f"{k}:{'x'.join(map(str, v.shape)) or '1'}" for k, v in f.items())  # noqa: E731
        profile = ["--min-shapes", sh(lo), "--opt-shapes", sh(hi), "--max-shapes", sh(hi)]
    else:
        profile = ["--shapes", ",".join(f"{k}:{'x'.join(map(str, v.shape)) or '1'}"
                                        for k, v in ti.feeds(meta["inputs"], 1).items())]
    for key, flags in (("cuda_fp32", []), ("cuda_fp16", ["--fp16"])):
        ok, out, _ = kiln([a.lower_check, "--gpu-memory", "80000,81559"] + flags + profile + [row["_path"]], a.timeout)
        last = (out.strip().splitlines() or ["(no output)"])[-1]
        row[key] = "ok" if ok and last.startswith("ok") else (last.split("\t")[-1] if "\t" in last else last)


def table(rows):
    cuda = any("cuda_fp32" in r for r in rows)
    lines = ["| model | exporter (opset) | ops of note (in subgraphs too) | builds | first error | outputs vs ONNX Runtime |"
             + (" cuda build step FP32 / FP16 |" if cuda else ""), "|---|---|---|---|---|---|" + ("---|" if cuda else "")]
    for r in rows:
        exp = f"{r.get('exporter', '-')} ({r.get('opset', '-')})"
        if r.get("torchscript_error"):
            exp += "; TorchScript failed"
        if "exception" in r:
            lines.append(f"| {r['model']} | - | - | - | harness: {r['exception'][:150]} | - |")
            continue
        built = "yes" if r.get("builds") else "no"
        err = r.get("error", "").split(": error: ")[-1].split(".onnx: ", 1)[-1].replace("|", "\\|")
        agrees = ("yes: " if r.get("agrees") else "NO: ") + r["detail"] if "agrees" in r else "-"
        note = ", ".join(f"{k} {r['ops'][k]}" for k in WATCH if r.get("ops", {}).get(k)) or "-"
        lines.append(f"| {r['model']} | {exp} | {note} | {built} | {err or '-'} | {agrees} |"
                     + (f" {r.get('cuda_fp32', '-')} / {r.get('cuda_fp16', '-')} |" if cuda else ""))
    return "\n".join(lines) + "\n"


def main():
    import tasks
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--kiln", default="build/kiln")
    ap.add_argument("--models", default=",".join(n for n in tasks.MODELS if not n.endswith("_tiny")))
    ap.add_argument("--onnx-dir", default="models/tasks")
    ap.add_argument("--work", default="/tmp/kiln-task-status")
    ap.add_argument("--out", default=None)
    ap.add_argument("--timeout", type=int, default=3600, help="seconds per kiln build or run")
    ap.add_argument("--no-export", action="store_true", help="use existing exports only (no PyTorch)")
    ap.add_argument("--lower-check", default=None,
                    help="kiln_lower_check of a CUDA build (build/tests/cuda/kiln_lower_check): also the cuda "
                         "build step at FP32 and FP16 with bench/tasks.py's profile, no GPU needed")
    ap.add_argument("--table", nargs="+", metavar="JSON", help="only print the table of earlier runs' task_status.json")
    a = ap.parse_args()
    if a.table:
        rows = []
        for p in a.table:
            with open(p) as f:
                rows += json.load(f)
        print(table(rows))
        return 0
    rows = []
    for name in a.models.split(","):
        t0 = time.time()
        try:
            row = one(a, name)
        except Exception as e:  # noqa: BLE001 - one model's failure is its row
            row = {"model": name, "exception": f"{type(e).__name__}: {str(e).strip()[:300]}"}
        row["seconds"] = round(time.time() - t0, 1)
        row.pop("_path", None)
        rows.append(row)
        print(json.dumps({k: v for k, v in row.items() if k != "ops"}), flush=True)
        if a.out:
            os.makedirs(a.out, exist_ok=True)
            with open(os.path.join(a.out, "task_status.json"), "w") as f:
                json.dump(rows, f, indent=1)
    md = table(rows)
    if a.out:
        with open(os.path.join(a.out, "task_status.md"), "w") as f:
            f.write(md)
    print(md)
    return 0


if __name__ == "__main__":
    sys.exit(main())
