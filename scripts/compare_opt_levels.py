#!/usr/bin/env python3
"""Run an ONNX model through `kiln run` at two optimization levels on the same random inputs
and print the relative L2 difference of every output.

  python3 scripts/compare_opt_levels.py --kiln build/kiln --onnx models/resnet50.onnx \
      --shapes input:1x3x224x224 [--levels 0 2] [--int-range input_ids:0:30522] [--tol 1e-4]

--shapes fixes the input shapes (as `kiln run --shapes` does, which also lets the optimizer
fold shape computations; with --dynamic they only size the random inputs). Integer inputs get
random values in [lo, hi) (default [0, 2)).
Exit status 1 when an output differs by more than --tol.
"""
import argparse
import os
import subprocess
import sys
import tempfile
import time

import numpy as np
import onnx

NP_TYPES = {1: np.float32, 6: np.int32, 7: np.int64, 9: np.bool_, 10: np.float16, 11: np.float64}


def parse_shapes(spec):
    out = {}
    for item in filter(None, spec.split(",")):
        name, dims = item.rsplit(":", 1)
        out[name] = [int(d) for d in dims.split("x")] if dims else []
    return out


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--kiln", default="build/kiln")
    ap.add_argument("--onnx", required=True)
    ap.add_argument("--shapes", default="")
    ap.add_argument("--levels", type=int, nargs=2, default=[0, 2])
    ap.add_argument("--int-range", action="append", default=[])
    ap.add_argument("--tol", type=float, default=1e-4)
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--dynamic", action="store_true",
                    help="use --shapes only for the random inputs; build with dynamic shapes")
    a = ap.parse_args()
    shapes = parse_shapes(a.shapes)
    ranges = {}
    for r in a.int_range:
        name, lo, hi = r.rsplit(":", 2)
        ranges[name] = (int(lo), int(hi))
    model = onnx.load(a.onnx, load_external_data=False)
    inits = {i.name for i in model.graph.initializer}
    rng = np.random.default_rng(a.seed)
    tmp = tempfile.mkdtemp(prefix="kiln_cmp_")
    args = []
    for vi in model.graph.input:
        if vi.name in inits:
            continue
        tt = vi.type.tensor_type
        shape = shapes.get(vi.name) or [d.dim_value if d.dim_value > 0 else 1 for d in tt.shape.dim]
        dt = NP_TYPES.get(tt.elem_type)
        if dt is None:
            sys.exit(f"input {vi.name}: unsupported element type {tt.elem_type}")
        if np.issubdtype(dt, np.floating):
            x = rng.uniform(-1, 1, shape).astype(dt)
        else:
            lo, hi = ranges.get(vi.name, (0, 2))
            x = rng.integers(lo, hi, shape).astype(dt)
        path = os.path.join(tmp, f"in_{len(args)}.npy")
        np.save(path, x)
        args += ["--input", f"{vi.name}={path}"]
    results = {}
    for level in a.levels:
        out_dir = os.path.join(tmp, f"out_{level}")
        cmd = [a.kiln, "run", "--onnx", a.onnx, "--opt-level", str(level), "--save-outputs", out_dir] + args
        if a.shapes and not a.dynamic:
            cmd += ["--shapes", a.shapes]
        t0 = time.time()
        p = subprocess.run(cmd, capture_output=True, text=True)
        if p.returncode != 0:
            sys.exit(f"opt level {level} failed: {p.stderr.strip()}")
        print(f"opt level {level}: ran in {time.time() - t0:.1f} s ({p.stdout.strip().splitlines()[-1]})")
        results[level] = {f[:-4]: np.load(os.path.join(out_dir, f)) for f in sorted(os.listdir(out_dir))}
    l0, l1 = a.levels
    worst = 0.0
    for name, ref in results[l0].items():
        got = results[l1][name].astype(np.float64)
        ref = ref.astype(np.float64)
        if got.shape != ref.shape:
            sys.exit(f"output {name}: shape {got.shape} at level {l1} vs {ref.shape} at level {l0}")
        rel = float(np.linalg.norm(got - ref) / max(np.linalg.norm(ref), 1e-30))
        worst = max(worst, rel)
        print(f"output {name} {list(ref.shape)}: relative L2 (level {l1} vs {l0}) = {rel:.3e}")
    print(f"worst relative L2 = {worst:.3e} ({'OK' if worst < a.tol else 'FAIL'}, tolerance {a.tol:g})")
    sys.exit(0 if worst < a.tol else 1)


if __name__ == "__main__":
    main()
