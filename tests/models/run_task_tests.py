#!/usr/bin/env python3
"""Task model tests: the tiny versions of the task models (tests/models/tasks/*.onnx, made by
scripts/models/gen_task_tests.py; manifest.json says how to make each one's inputs and judge
its outputs) through kiln's CPU backend against ONNX Runtime. No PyTorch needed.

Models kiln supports: one engine at -O2 (batch 1-3 where the model has a batch axis, else its
one image's shape), compared at batch 1 and 3: dense outputs relative L2 < 1e-4; detections the
FP32 rule of scripts/models/task_checks.py (every detection paired by class and IoU, boxes within
1e-3 of their axis's scale, scores within 1e-3, unpaired ones only as tie-breaks at the cut).
With a CUDA build (no GPU needed), each such model also goes through the cuda build step
(kiln_lower_check, FP32/TF32 and FP16, the same profile): every layer must get a GPU tactic.
Any failure is exit status 1.

Models kiln does not support yet are in UNSUPPORTED with the error they gave when they were
listed: each is still built every run and its error printed, so nothing is skipped silently; one
that builds and agrees is announced (move it to the tested list: delete its UNSUPPORTED line).
"""
import argparse
import json
import os
import subprocess
import sys
import tempfile

import numpy as np

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, os.path.join(HERE, "..", "..", "scripts", "models"))
import task_checks as tc  # noqa: E402
import task_inputs as ti  # noqa: E402

DIR = os.path.join(HERE, "tasks")
DENSE_RTOL = 1e-4
# name: the error kiln gave when it was listed (less the file's path); a different one is printed
# beside it. The ops behind the If and Loop nodes (NonMaxSuppression, TopK, NonZero) come next.
UNSUPPORTED = {}


def run(cmd):
    p = subprocess.run(cmd, capture_output=True, text=True, timeout=900)
    if p.returncode != 0:
        msg = (p.stderr or p.stdout).strip().splitlines() or [f"exit status {p.returncode}"]
        raise RuntimeError(msg[-1] if p.returncode > 0 else f"killed by signal {-p.returncode}")
    return p.stdout


def shapes(meta, batch):
    return ",".join(f"{k}:{'x'.join(map(str, v.shape)) or '1'}" for k, v in ti.feeds(meta["inputs"], batch).items())


def profile_args(meta):
    return (["--min-shapes", shapes(meta, 1), "--opt-shapes", shapes(meta, 2), "--max-shapes", shapes(meta, 3)]
            if meta["batchable"] else ["--shapes", shapes(meta, 1)])


def check_cuda(lower_check, name, meta):
    """The cuda build step at FP32/TF32 and FP16; raises RuntimeError with its error."""
    for flags in ([], ["--fp16"]):
        out = run([lower_check] + flags + profile_args(meta) + [os.path.join(DIR, name + ".onnx")])
        last = out.strip().splitlines()[-1]
        if not last.startswith("ok"):
            raise RuntimeError(f"cuda build step{' (FP16)' if flags else ''}: {last.split(chr(9))[-1]}")
    return "cuda build step ok (FP32, FP16)"


def check(kiln, name, meta, tmp, build_flags=("--backend", "cpu")):
    """Builds and compares; returns a one-line description, raises RuntimeError on a failure."""
    import onnxruntime as ort
    path = os.path.join(DIR, name + ".onnx")
    engine = os.path.join(tmp, name + ".kiln")
    batches = (1, 3) if meta["batchable"] else (1,)
    profile = profile_args(meta)
    run([kiln, "build", *build_flags, "--onnx", path, "--save-engine", engine] + profile)
    sess = ort.InferenceSession(path, providers=["CPUExecutionProvider"])
    names = [o.name for o in sess.get_outputs()]
    said = []
    for b in batches:
        feeds = ti.feeds(meta["inputs"], b)
        out = os.path.join(tmp, f"{name}_b{b}")
        cmd = [kiln, "run", "--engine", engine, "--save-outputs", out]
        for k, v in feeds.items():
            np.save(os.path.join(tmp, k + ".npy"), v)
            cmd += ["--input", f"{k}={os.path.join(tmp, k + '.npy')}"]
        run(cmd)
        ref = dict(zip(names, sess.run(None, feeds)))
        got = {n: np.load(os.path.join(out, n + ".npy")) for n in names}
        if meta["kind"] == "detection":
            r = tc.compare_exact(tc.det_rows(ref, meta["det"]), tc.det_rows(got, meta["det"]))
            if not r["ok"]:
                raise RuntimeError(f"batch {b}: {r['why']}")
            said.append(f"b{b}: {r['count']} detections, box rel {r['box_rel']:.1e}, score rel {r['score_rel']:.1e}"
                        + (f", tie-breaks at the cut {r['tie_breaks']}" if any(r["tie_breaks"]) else ""))
        else:
            errs = {n: tc.rel_l2(got[n], ref[n]) for n in names}
            worst = max(errs.values())
            if worst > DENSE_RTOL:
                raise RuntimeError(f"batch {b}: relative L2 " + ", ".join(f"{n} {e:.2e}" for n, e in errs.items())
                                   + f" against ONNX Runtime (limit {DENSE_RTOL})")
            said.append(f"b{b}: rel L2 {worst:.1e}")
    return "; ".join(said)


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--kiln", default="build/kiln")
    ap.add_argument("--build-flags", default="--backend cpu",
                    help="kiln build flags; on the GPU machine '--backend cuda --no-tf32' (strict FP32: "
                         "the same limits hold)")
    ap.add_argument("--models", default=None, help="a comma-separated subset (default: all in the manifest)")
    ap.add_argument("--lower-check", default=None,
                    help="kiln_lower_check (default: next to --kiln, when built with CUDA)")
    a = ap.parse_args()
    lower_check = a.lower_check or os.path.join(os.path.dirname(a.kiln), "tests", "cuda", "kiln_lower_check")
    if not os.path.exists(lower_check):
        print("task model tests: no kiln_lower_check (a build without CUDA): the cuda build step is skipped")
        lower_check = None
    try:
        import onnxruntime  # noqa: F401
    except ImportError:
        print("task model tests: onnxruntime is not installed (scripts/setup.sh installs it)")
        return 1
    with open(os.path.join(DIR, "manifest.json")) as f:
        models = json.load(f)["models"]
    chosen = a.models.split(",") if a.models else sorted(models)
    failures, known, now_pass = 0, 0, []
    with tempfile.TemporaryDirectory() as tmp:
        for name in chosen:
            meta = models[name]
            try:
                said = check(a.kiln, name, meta, tmp, a.build_flags.split())
                if lower_check and name not in UNSUPPORTED:
                    said += "; " + check_cuda(lower_check, name, meta)
            except RuntimeError as e:
                err = str(e).split(": error: ")[-1]
                err = err.split(".onnx: ", 1)[-1]
                if name in UNSUPPORTED:
                    known += 1
                    changed = "" if err == UNSUPPORTED[name] else f" (changed; listed with: {UNSUPPORTED[name]})"
                    print(f"known-unsupported {name} [{meta['what']}]: {err}{changed}")
                else:
                    failures += 1
                    print(f"FAIL {name} [{meta['what']}]: {err}")
                continue
            if name in UNSUPPORTED:
                now_pass.append(name)
                print(f"NOW PASSES {name} [{meta['what']}]: {said} -- move it to the tested list "
                      "(delete its UNSUPPORTED line in tests/models/run_task_tests.py)")
            else:
                print(f"ok   {name}: {said}")
    tested = len(chosen) - known - len(now_pass)
    print(f"task model tests: {tested - failures} of {tested} pass, {known} known-unsupported (listed above)"
          + (f", {len(now_pass)} unsupported ones now pass: {', '.join(now_pass)}" if now_pass else "")
          + (f"; {failures} FAILED" if failures else ""))
    return 1 if failures else 0


if __name__ == "__main__":
    sys.exit(main())
