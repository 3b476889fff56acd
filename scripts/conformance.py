#!/usr/bin/env python3
"""Runs the ONNX backend test data through `kiln run` and reports pass / fail / unsupported.

Each test folder holds model.onnx and test_data_set_*/input_*.pb, output_*.pb. kiln runs the
model on the inputs and saves its outputs as .npy; they are compared with the expected outputs
using the ONNX backend tolerances (rtol 1e-3, atol 1e-7 for float32).

  scripts/conformance.py --kiln build/kiln [--filter REGEX] [--expect tests/conformance/expected_pass.txt]

Exit status: 1 when a test crashes kiln (a signal, a hang, or an exit status other than 0/1),
or when a test listed in --expect does not pass (a regression); else 0.
"""
import argparse
import concurrent.futures
import json
import os
import re
import subprocess
import sys
import tempfile
import time

import numpy as np
import onnx
from onnx import numpy_helper

CORE_OPS = set("""Abs Neg Exp Log Sqrt Reciprocal Relu LeakyRelu Sigmoid Tanh Erf Elu Selu Celu HardSigmoid
HardSwish Softplus Softsign Clip Floor Ceil Round Sign Sin Cos PRelu Not IsNaN IsInf Add Sub Mul Div
Pow Max Min Mean Sum Mod Equal Greater GreaterOrEqual Less LessOrEqual And Or Xor Where Conv
ConvTranspose BatchNormalization InstanceNormalization LayerNormalization MaxPool AveragePool
GlobalAveragePool GlobalMaxPool Gemm MatMul Softmax LogSoftmax Hardmax Dropout Resize Pad
DepthToSpace SpaceToDepth Reshape Shape Size Flatten Squeeze Unsqueeze Transpose Concat Split Slice
Gather GatherElements GatherND Expand Tile Cast CastLike Constant ConstantOfShape Identity Range
Trilu CumSum TopK ArgMax ArgMin ReduceSum ReduceMean ReduceMax ReduceMin ReduceProd ReduceL1
ReduceL2 ReduceLogSum ReduceLogSumExp ReduceSumSquare QuantizeLinear DequantizeLinear""".split())

DATA_DIRS = ["/usr/share/libonnx-testdata/data"]
SUITES = ["node", "pytorch-converted", "pytorch-operator"]


def find_data_root(explicit):
    if explicit:
        return explicit
    for d in DATA_DIRS:
        if os.path.isdir(d):
            return d
    try:  # the onnx wheel ships the same data
        import onnx.backend.test
        d = os.path.join(os.path.dirname(onnx.backend.test.__file__), "data")
        if os.path.isdir(d):
            return d
    except ImportError:
        pass
    sys.exit("conformance: no ONNX backend test data found (install libonnx-testdata)")


def safe_name(name):
    s = re.sub(r"[^A-Za-z0-9._-]", "_", name)
    return "_" + s if s in ("", ".", "..") else s


def model_info(path):
    m = onnx.load(path, load_external_data=False)
    inits = {i.name for i in m.graph.initializer}
    inputs = [i.name for i in m.graph.input if i.name not in inits]
    outputs = [(o.name, o.type.tensor_type.elem_type) for o in m.graph.output]
    ops = {n.op_type for n in m.graph.node if n.domain in ("", "ai.onnx")}
    foreign = {n.domain + "." + n.op_type for n in m.graph.node if n.domain not in ("", "ai.onnx")}
    return inputs, outputs, ops | foreign


# Element types numpy lacks: newer onnx returns them as ml_dtypes arrays; kiln saves them as
# the numpy type that holds every value exactly (float32 for the small floats, int8/uint8 for
# the 4-bit integers), so the expected values are widened the same way before comparing.
WIDEN = {"bfloat16": np.float32, "float8_e4m3fn": np.float32, "float8_e4m3fnuz": np.float32,
         "float8_e5m2": np.float32, "float8_e5m2fnuz": np.float32, "int4": np.int8,
         "uint4": np.uint8}


def widen_numpy_gap_type(a):
    to = WIDEN.get(a.dtype.name)
    return a.astype(to) if to is not None else a


def compare(expected, got):
    if expected.shape != got.shape:
        return f"shape {got.shape} != expected {expected.shape}"
    if expected.dtype.kind in "fc":
        e = expected.astype(np.float64)
        g = got.astype(np.float64)
        nan_e, nan_g = np.isnan(e), np.isnan(g)
        if not np.array_equal(nan_e, nan_g):
            return "NaN positions differ"
        ok = np.isclose(g, e, rtol=1e-3, atol=1e-7, equal_nan=True) | (e == g)
        if not ok.all():
            idx = np.argmax(~ok)
            return f"{(~ok).sum()} of {e.size} values differ (first at {idx}: {g.flat[idx]} vs {e.flat[idx]})"
        if expected.dtype != got.dtype and not (expected.dtype == np.float32 and got.dtype == np.float32):
            return f"dtype {got.dtype} != expected {expected.dtype}"
        return None
    if expected.dtype != got.dtype:
        return f"dtype {got.dtype} != expected {expected.dtype}"
    if not np.array_equal(expected, got):
        return f"{(expected != got).sum()} of {expected.size} values differ"
    return None


def run_test(kiln, test_dir, extra_args, timeout, deadline=None):
    name = os.path.basename(test_dir)
    model = os.path.join(test_dir, "model.onnx")
    if deadline is not None and time.monotonic() > deadline:
        return {"name": name, "status": "not run", "detail": "--deadline passed before it started", "ops": []}
    try:
        inputs, outputs, ops = model_info(model)
    except Exception as e:  # noqa: BLE001 - malformed test model
        return {"name": name, "status": "fail", "detail": f"cannot read model: {e}", "ops": []}
    sets = sorted(d for d in os.listdir(test_dir) if d.startswith("test_data_set_"))
    result = {"name": name, "ops": sorted(ops), "status": "pass", "detail": ""}
    for s in sets:
        sdir = os.path.join(test_dir, s)
        in_files = sorted((f for f in os.listdir(sdir) if f.startswith("input_")),
                          key=lambda f: int(re.findall(r"\d+", f)[0]))
        out_files = sorted((f for f in os.listdir(sdir) if f.startswith("output_")),
                           key=lambda f: int(re.findall(r"\d+", f)[0]))
        with tempfile.TemporaryDirectory() as tmp:
            cmd = [kiln, "run", "--onnx", model, "--save-outputs", tmp] + extra_args
            for i, f in enumerate(in_files):
                if i < len(inputs):
                    cmd += ["--input", f"{inputs[i]}={os.path.join(sdir, f)}"]
            try:
                p = subprocess.run(cmd, capture_output=True, text=True, timeout=timeout)
            except subprocess.TimeoutExpired:
                return dict(result, status="crash", detail=f"timeout after {timeout}s")
            if p.returncode not in (0, 1):
                return dict(result, status="crash", detail=f"exit status {p.returncode}: {p.stderr.strip()[-300:]}")
            if p.returncode == 1:
                err = p.stderr.strip().splitlines()
                err = err[-1] if err else "(no message)"
                if len(p.stderr.strip().splitlines()) != 1:
                    return dict(result, status="fail", detail="error was not one line: " + err)
                unsupported = re.search(r"unsupported|not supported|not implemented", err)
                return dict(result, status="unsupported" if unsupported else "fail", detail=err)
            for i, f in enumerate(out_files):
                t = onnx.TensorProto()
                with open(os.path.join(sdir, f), "rb") as fh:
                    t.ParseFromString(fh.read())
                expected = numpy_helper.to_array(t)
                out_name, out_type = outputs[i] if i < len(outputs) else (t.name, 0)
                path = os.path.join(tmp, safe_name(out_name) + ".npy")
                if not os.path.exists(path):
                    return dict(result, status="fail", detail=f"output '{out_name}' not saved")
                got = np.load(path)
                if out_type == onnx.TensorProto.BFLOAT16 and expected.dtype == np.uint16:
                    # The test data stores bfloat16 as uint16 bits; kiln saves bfloat16 as float32.
                    expected = (expected.astype(np.uint32) << 16).view(np.float32)
                expected = widen_numpy_gap_type(expected)
                if expected.dtype == np.dtype("bool") and got.dtype != np.bool_:
                    return dict(result, status="fail", detail=f"dtype {got.dtype} != bool")
                why = compare(expected, got)
                if why:
                    return dict(result, status="fail", detail=f"{s} output '{out_name}': {why}")
    return result


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--kiln", default="build/kiln")
    ap.add_argument("--data", help="test data root (holds node/, pytorch-converted/, ...)")
    ap.add_argument("--filter", default="", help="regex on test names")
    ap.add_argument("--suites", default=",".join(SUITES))
    ap.add_argument("--jobs", type=int, default=os.cpu_count() or 2)
    ap.add_argument("--timeout", type=int, default=120)
    ap.add_argument("--deadline", type=float, default=None,
                    help="start no test after this many seconds; the rest count as not run (a bounded run "
                         "on a machine with a time limit still prints its results)")
    ap.add_argument("--opt-level", type=int, default=None, help="pass --opt-level to kiln run")
    ap.add_argument("--expect", help="file listing tests that must pass (regression check)")
    ap.add_argument("--write-expect", help="write the passing tests to this file")
    ap.add_argument("--json", help="write all results as JSON here")
    ap.add_argument("--same-as", help="results JSON of another run (e.g. --opt-level 0): fail if any "
                    "test's status differs")
    ap.add_argument("--verbose", "-v", action="store_true", help="print every test, not only failures")
    args = ap.parse_args()
    root = find_data_root(args.data)
    extra = ["--opt-level", str(args.opt_level)] if args.opt_level is not None else []
    rx = re.compile(args.filter)
    tests = []
    for suite in args.suites.split(","):
        d = os.path.join(root, suite)
        if not os.path.isdir(d):
            continue
        for t in sorted(os.listdir(d)):
            if rx.search(t) and os.path.exists(os.path.join(d, t, "model.onnx")):
                tests.append((suite, os.path.join(d, t)))
    results = []
    deadline = time.monotonic() + args.deadline if args.deadline is not None else None
    t0 = time.monotonic()
    with concurrent.futures.ThreadPoolExecutor(max_workers=args.jobs) as pool:
        futs = {pool.submit(run_test, args.kiln, path, extra, args.timeout, deadline): suite
                for suite, path in tests}
        for fut in concurrent.futures.as_completed(futs):
            r = fut.result()
            r["suite"] = futs[fut]
            results.append(r)
            # Progress on stderr, a line every 10% (a slow backend shows where it is).
            if len(tests) >= 50 and len(results) % max(1, len(tests) // 10) == 0:
                print(f"conformance: {len(results)} of {len(tests)} tests ({time.monotonic() - t0:.0f} s)",
                      file=sys.stderr, flush=True)
    results.sort(key=lambda r: (r["suite"], r["name"]))
    for r in results:
        if args.verbose or r["status"] in ("fail", "crash"):
            print(f"{r['status'].upper():11} {r['suite']}/{r['name']}  {r['detail']}")

    def count(rs, st):
        return sum(1 for r in rs if r["status"] == st)

    print("\n== conformance summary ==")
    for suite in args.suites.split(","):
        rs = [r for r in results if r["suite"] == suite]
        if not rs:
            continue
        not_run = count(rs, "not run")
        print(f"{suite:18} {len(rs):4} tests: {count(rs, 'pass'):4} pass, {count(rs, 'fail'):4} fail, "
              f"{count(rs, 'unsupported'):4} unsupported, {count(rs, 'crash'):3} crash"
              + (f", {not_run} not run (--deadline)" if not_run else ""))
        if suite == "node":
            core = [r for r in rs if r["ops"] and set(r["ops"]) <= CORE_OPS]
            if core:
                p = count(core, "pass")
                print(f"{'  core-op subset':18} {len(core):4} tests: {p:4} pass ({100.0 * p / len(core):.1f}%)")
    crashes = [r for r in results if r["status"] == "crash"]
    rc = 0
    if crashes:
        print(f"CRASHES: {len(crashes)} (any crash fails the run)")
        rc = 1
    if args.expect:
        with open(args.expect) as fh:
            expected = {l.strip() for l in fh if l.strip() and not l.startswith("#")}
        passing = {f"{r['suite']}/{r['name']}" for r in results if r["status"] == "pass"}
        ran = {f"{r['suite']}/{r['name']}" for r in results if r["status"] != "not run"}
        regressions = sorted((expected & ran) - passing)
        if regressions:
            print(f"REGRESSIONS: {len(regressions)} tests that passed before fail now: " + ", ".join(regressions[:20]))
            rc = 1
        else:
            print(f"no regressions against {args.expect} ({len(expected & ran)} expected passes)")
    if args.same_as:
        with open(args.same_as) as fh:
            other = {(r["suite"], r["name"]): r["status"] for r in json.load(fh)}
        diff = [f"{r['suite']}/{r['name']} ({other[(r['suite'], r['name'])]} there, {r['status']} here)"
                for r in results if (r["suite"], r["name"]) in other and other[(r["suite"], r["name"])] != r["status"]
                and "not run" not in (r["status"], other[(r["suite"], r["name"])])]
        if diff:
            print(f"DIFFERENT from {args.same_as}: {len(diff)} tests: " + ", ".join(diff[:20]))
            rc = 1
        else:
            print(f"statuses identical to {args.same_as} ({len(other)} tests)")
    if args.write_expect:
        with open(args.write_expect, "w") as fh:
            fh.write("# tests that pass; scripts/conformance.py --expect fails if one of these regresses\n")
            for r in results:
                if r["status"] == "pass":
                    fh.write(f"{r['suite']}/{r['name']}\n")
    if args.json:
        with open(args.json, "w") as fh:
            json.dump(results, fh, indent=1)
    total_pass = count(results, "pass")
    print(f"conformance: {total_pass} of {len(results)} tests pass")
    return rc


if __name__ == "__main__":
    sys.exit(main())
