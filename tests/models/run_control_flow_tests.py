#!/usr/bin/env python3
"""Control flow (If, Loop, Scan) through kiln's CPU backend against ONNX Runtime.

Each model is made here with onnx.helper in the forms exporters write: branches and bodies that
read values of enclosing graphs (also two levels up), subgraph initializers, branches whose
outputs differ in shape, a Loop whose carried value grows, values appended to by a Concat at
every iteration (kept as scan outputs: loop_concat_to_scan), a while-loop without a trip count, a
Scan over two inputs in opposite directions, and a detector's `if boxes.numel() == 0` after
NonZero. Every model is built at -O0 and -O2 (`kiln build`, then `kiln run --engine`, so the
engine file's subgraphs are written and read back) and compared with ONNX Runtime (relative L2
< 1e-6, shapes equal). Bad input to a Loop (a negative trip count) must be one line on stderr
and exit status 1.
"""
import argparse
import os
import subprocess
import sys
import tempfile

import numpy as np
import onnx
from onnx import TensorProto, helper, numpy_helper

try:
    import onnxruntime as ort
except ImportError:  # setup.sh installs it; say so rather than skip silently
    ort = None

F, I64, B = TensorProto.FLOAT, TensorProto.INT64, TensorProto.BOOL


def vi(name, dtype, shape):
    return helper.make_tensor_value_info(name, dtype, shape)


def const(name, arr):
    return numpy_helper.from_array(np.asarray(arr), name)


def model(graph, opset=17):
    m = helper.make_model(graph, opset_imports=[helper.make_opsetid("", opset)])
    m.ir_version = 8
    onnx.checker.check_model(m)
    return m


def if_capture():
    """If reading outer values (x, y, an outer initializer) and its own initializer."""
    then_g = helper.make_graph([helper.make_node("Add", ["x", "w"], ["t_out"])], "then",
                               [], [vi("t_out", F, None)])
    else_g = helper.make_graph([helper.make_node("Mul", ["y", "two"], ["e_out"])], "else",
                               [], [vi("e_out", F, None)], initializer=[const("two", np.float32(2))])
    nodes = [
        helper.make_node("ReduceSum", ["x"], ["s"], keepdims=0),
        helper.make_node("Greater", ["s", "zero"], ["c"]),
        helper.make_node("If", ["c"], ["out"], then_branch=then_g, else_branch=else_g),
    ]
    g = helper.make_graph(nodes, "if_capture", [vi("x", F, ["N", 4]), vi("y", F, ["N", 4])],
                          [vi("out", F, ["N", 4])],
                          initializer=[const("w", np.arange(4, dtype=np.float32)),
                                       const("zero", np.float32(0))])
    return model(g)


def if_shapes_differ():
    """Branches of different shapes: the output's dims are known only at run time."""
    then_g = helper.make_graph(
        [helper.make_node("Slice", ["x", "st", "en", "ax"], ["t_out"])], "then", [],
        [vi("t_out", F, None)],
        initializer=[const("st", [0]), const("en", [2]), const("ax", [1])])
    else_g = helper.make_graph([helper.make_node("Identity", ["x"], ["e_out"])], "else", [],
                               [vi("e_out", F, None)])
    nodes = [
        helper.make_node("ReduceMax", ["x"], ["m"], keepdims=0),
        helper.make_node("Greater", ["m", "zero"], ["c"]),
        helper.make_node("If", ["c"], ["out"], then_branch=then_g, else_branch=else_g),
    ]
    g = helper.make_graph(nodes, "if_shapes_differ", [vi("x", F, ["N", 4])], [vi("out", F, ["N", None])],
                          initializer=[const("zero", np.float32(0.5))])
    return model(g)


def loop_scan():
    """A counted Loop: a carried sum of x's rows, the running sums as a scan output, an outer
    initializer read in the body; trip count from a graph input."""
    body = helper.make_graph(
        [
            helper.make_node("Gather", ["x", "i"], ["row"], axis=0),
            helper.make_node("Mul", ["row", "scale"], ["srow"]),
            helper.make_node("Add", ["acc_in", "srow"], ["acc_out"]),
            helper.make_node("Identity", ["cond_in"], ["cond_out"]),
            helper.make_node("Identity", ["acc_out"], ["scan_out"]),
        ],
        "body",
        [vi("i", I64, []), vi("cond_in", B, []), vi("acc_in", F, [4])],
        [vi("cond_out", B, []), vi("acc_out", F, [4]), vi("scan_out", F, [4])],
    )
    nodes = [helper.make_node("Loop", ["M", "", "acc0"], ["acc", "sums"], body=body)]
    g = helper.make_graph(nodes, "loop_scan", [vi("x", F, [6, 4]), vi("M", I64, [])],
                          [vi("acc", F, [4]), vi("sums", F, [None, 4])],
                          initializer=[const("acc0", np.zeros(4, np.float32)),
                                       const("scale", np.float32(0.5))])
    return model(g)


def loop_while_growing():
    """A while-loop (no trip count): a carried vector grows by one element per iteration
    until its sum passes a limit that is a graph input."""
    body = helper.make_graph(
        [
            helper.make_node("Cast", ["i"], ["fi"], to=F),
            helper.make_node("Reshape", ["fi", "one"], ["fi1"]),
            helper.make_node("Concat", ["v_in", "fi1"], ["v_out"], axis=0),
            helper.make_node("ReduceSum", ["v_out"], ["s"], keepdims=0),
            helper.make_node("Less", ["s", "limit"], ["cond_out"]),
        ],
        "body",
        [vi("i", I64, []), vi("cond_in", B, []), vi("v_in", F, [None])],
        [vi("cond_out", B, []), vi("v_out", F, [None])],
        initializer=[const("one", np.array([1], np.int64))],
    )
    nodes = [helper.make_node("Loop", ["", "c0", "v0"], ["v"], body=body)]
    g = helper.make_graph(nodes, "loop_while", [vi("limit", F, [])], [vi("v", F, [None])],
                          initializer=[const("c0", np.array(True)),
                                       const("v0", np.array([1.0], np.float32))])
    return model(g)


def loop_append():
    """Two values appended to at every iteration (`acc = torch.cat((acc, part))` in a scripted
    loop), along axis 0 and axis 1, from empty constants: kiln keeps them as scan outputs."""
    body = helper.make_graph(
        [
            helper.make_node("Cast", ["i"], ["fi"], to=F),
            helper.make_node("Add", ["x", "fi"], ["xi"]),
            helper.make_node("Unsqueeze", ["xi", "ax0"], ["part0"]),
            helper.make_node("Concat", ["acc0_in", "part0"], ["acc0_out"], axis=0),
            helper.make_node("Mul", ["y", "fi"], ["yi"]),
            helper.make_node("Unsqueeze", ["yi", "ax1"], ["part1"]),
            helper.make_node("Concat", ["acc1_in", "part1"], ["acc1_out"], axis=-1),
            helper.make_node("Identity", ["cond_in"], ["cond_out"]),
        ],
        "body",
        [vi("i", I64, []), vi("cond_in", B, []), vi("acc0_in", F, [None, 3]), vi("acc1_in", F, [2, None])],
        [vi("cond_out", B, []), vi("acc0_out", F, [None, 3]), vi("acc1_out", F, [2, None])],
        initializer=[const("ax0", np.array([0], np.int64)), const("ax1", np.array([1], np.int64))],
    )
    nodes = [helper.make_node("Loop", ["M", "c0", "a0", "a1"], ["acc0", "acc1"], body=body)]
    g = helper.make_graph(nodes, "loop_append", [vi("M", I64, []), vi("x", F, [3]), vi("y", F, [2])],
                          [vi("acc0", F, [None, 3]), vi("acc1", F, [2, None])],
                          initializer=[const("c0", np.array(True)),
                                       const("a0", np.zeros((0, 3), np.float32)),
                                       const("a1", np.zeros((2, 0), np.float32))])
    return model(g)


def loop_nested_if():
    """An If inside a Loop body that reads a main-graph value (two levels up) and the body's
    carried value."""
    then_g = helper.make_graph([helper.make_node("Add", ["acc_in", "bias"], ["t"])], "then", [],
                               [vi("t", F, None)])
    else_g = helper.make_graph([helper.make_node("Sub", ["acc_in", "bias"], ["e"])], "else", [],
                               [vi("e", F, None)])
    body = helper.make_graph(
        [
            helper.make_node("Mod", ["i", "two"], ["r"]),
            helper.make_node("Equal", ["r", "zero"], ["even"]),
            helper.make_node("If", ["even"], ["acc_out"], then_branch=then_g, else_branch=else_g),
            helper.make_node("Identity", ["cond_in"], ["cond_out"]),
        ],
        "body",
        [vi("i", I64, []), vi("cond_in", B, []), vi("acc_in", F, ["N", 3])],
        [vi("cond_out", B, []), vi("acc_out", F, ["N", 3])],
        initializer=[const("two", np.int64(2)), const("zero", np.int64(0))],
    )
    nodes = [
        helper.make_node("Relu", ["b"], ["bias"]),
        helper.make_node("Loop", ["M", "", "x"], ["y"], body=body),
    ]
    g = helper.make_graph(nodes, "loop_nested_if", [vi("x", F, ["N", 3]), vi("b", F, [3])],
                          [vi("y", F, ["N", 3])], initializer=[const("M", np.int64(5))])
    return model(g)


def scan_two_ways():
    """Scan over axis 1 of two inputs, the second reversed; a running state; two scan outputs,
    one stacked on axis 1 and reversed."""
    body = helper.make_graph(
        [
            helper.make_node("Add", ["s_in", "a"], ["s1"]),
            helper.make_node("Mul", ["s1", "b"], ["s_out"]),
            helper.make_node("Identity", ["s_out"], ["y1"]),
            helper.make_node("Sub", ["a", "b"], ["y2"]),
        ],
        "body",
        [vi("s_in", F, [2]), vi("a", F, [2]), vi("b", F, [2])],
        [vi("s_out", F, [2]), vi("y1", F, [2]), vi("y2", F, [2])],
    )
    nodes = [helper.make_node("Scan", ["s0", "xa", "xb"], ["s", "ys1", "ys2"], body=body,
                              num_scan_inputs=2, scan_input_axes=[1, 1],
                              scan_input_directions=[0, 1], scan_output_axes=[0, 1],
                              scan_output_directions=[0, 1])]
    g = helper.make_graph(nodes, "scan_two_ways",
                          [vi("s0", F, [2]), vi("xa", F, [2, "T"]), vi("xb", F, [2, "T"])],
                          [vi("s", F, [2]), vi("ys1", F, ["T", 2]), vi("ys2", F, [2, "T"])])
    return model(g, opset=16)


def detector_if():
    """torchvision's postprocessing shape: scores thresholded by NonZero, the kept boxes'
    count tested with Shape -> ReduceProd -> Equal, an If that returns an empty tensor or the
    kept boxes scaled."""
    then_g = helper.make_graph([helper.make_node("Identity", ["empty"], ["t"])], "then", [],
                               [vi("t", F, None)],
                               initializer=[const("empty", np.zeros((0, 4), np.float32))])
    else_g = helper.make_graph([helper.make_node("Mul", ["kept", "k"], ["e"])], "else", [],
                               [vi("e", F, None)], initializer=[const("k", np.float32(2.0))])
    nodes = [
        helper.make_node("Greater", ["scores", "thr"], ["mask"]),
        helper.make_node("NonZero", ["mask"], ["nz"]),
        helper.make_node("Squeeze", ["nz", "ax0"], ["idx"]),
        helper.make_node("Gather", ["boxes", "idx"], ["kept"], axis=0),
        helper.make_node("Shape", ["kept"], ["shp"]),
        helper.make_node("ReduceProd", ["shp"], ["numel"], keepdims=0),
        helper.make_node("Equal", ["numel", "zero"], ["none"]),
        helper.make_node("If", ["none"], ["out"], then_branch=then_g, else_branch=else_g),
    ]
    g = helper.make_graph(nodes, "detector_if", [vi("boxes", F, [8, 4]), vi("scores", F, [8])],
                          [vi("out", F, [None, 4])],
                          initializer=[const("thr", np.float32(0.5)), const("ax0", [0]),
                                       const("zero", np.int64(0))])
    return model(g)


def inputs_for(name, rng, variant):
    if name == "if_capture":
        x = rng.standard_normal((3, 4)).astype(np.float32) + (1.0 if variant else -1.0)
        return {"x": x, "y": rng.standard_normal((3, 4)).astype(np.float32)}
    if name == "if_shapes_differ":
        return {"x": rng.standard_normal((2, 4)).astype(np.float32) - (0 if variant else 10)}
    if name == "loop_scan":
        return {"x": rng.standard_normal((6, 4)).astype(np.float32),
                "M": np.array(5 if variant else 0, np.int64)}
    if name == "loop_while":
        return {"limit": np.array(12.5 if variant else 0.5, np.float32)}
    if name == "loop_append":
        return {"M": np.array(4 if variant else 0, np.int64),
                "x": rng.standard_normal(3).astype(np.float32), "y": rng.standard_normal(2).astype(np.float32)}
    if name == "loop_nested_if":
        return {"x": rng.standard_normal((2, 3)).astype(np.float32),
                "b": rng.standard_normal(3).astype(np.float32)}
    if name == "scan_two_ways":
        return {"s0": rng.standard_normal(2).astype(np.float32),
                "xa": rng.standard_normal((2, 5)).astype(np.float32),
                "xb": rng.standard_normal((2, 5)).astype(np.float32)}
    if name == "detector_if":
        return {"boxes": rng.standard_normal((8, 4)).astype(np.float32),
                "scores": rng.random(8).astype(np.float32) * (1.0 if variant else 0.4)}
    raise KeyError(name)


# The cuda backend builds at a profile: these models' symbolic dims at the sizes the cases use.
CUDA_SHAPES = {
    "if_capture": "x:3x4,y:3x4",
    "if_shapes_differ": "x:2x4",
    "loop_nested_if": "x:2x3,b:3",
    "scan_two_ways": "s0:2,xa:2x5,xb:2x5",
}

MODELS = {
    "if_capture": if_capture,
    "if_shapes_differ": if_shapes_differ,
    "loop_scan": loop_scan,
    "loop_while": loop_while_growing,
    "loop_append": loop_append,
    "loop_nested_if": loop_nested_if,
    "scan_two_ways": scan_two_ways,
    "detector_if": detector_if,
}


def run(cmd):
    return subprocess.run(cmd, capture_output=True, text=True, timeout=300)


def rel_l2(a, b):
    a, b = a.astype(np.float64), b.astype(np.float64)
    return float(np.linalg.norm(a - b) / max(np.linalg.norm(b), 1e-30))


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--kiln", default="build/kiln")
    ap.add_argument("--build-flags", default="--backend cpu",
                    help="kiln build flags (the GPU machine: --backend cuda, --backend cuda --fp16)")
    ap.add_argument("--save-models", default="", help="also write the models into this folder")
    args = ap.parse_args()
    if ort is None:
        print("control-flow tests: onnxruntime is not installed (scripts/setup.sh installs it)")
        return 1
    failures = 0
    tol = 1e-2 if "--fp16" in args.build_flags else 1e-6
    rng = np.random.default_rng(0)
    with tempfile.TemporaryDirectory() as tmp:
        for name, fn in MODELS.items():
            path = os.path.join(tmp, name + ".onnx")
            onnx.save(fn(), path)
            if args.save_models:
                os.makedirs(args.save_models, exist_ok=True)
                onnx.save(fn(), os.path.join(args.save_models, name + ".onnx"))
            sess = ort.InferenceSession(path, providers=["CPUExecutionProvider"])
            for opt in (0, 2):
                engine = os.path.join(tmp, f"{name}_O{opt}.kiln")
                shapes = ["--shapes", CUDA_SHAPES[name]] if "cuda" in args.build_flags and name in CUDA_SHAPES else []
                p = run([args.kiln, "build", *args.build_flags.split(), *shapes, "--onnx", path,
                         "--save-engine", engine, "--opt-level", str(opt)])
                if p.returncode != 0:
                    print(f"FAIL {name} -O{opt}: build: {p.stderr.strip()}")
                    failures += 1
                    continue
                for variant in (0, 1):  # each branch / trip count
                    feeds = inputs_for(name, rng, variant)
                    out_dir = os.path.join(tmp, "out")
                    cmd = [args.kiln, "run", "--engine", engine, "--save-outputs", out_dir]
                    for k, v in feeds.items():
                        np.save(os.path.join(tmp, k + ".npy"), v)
                        cmd += ["--input", f"{k}={os.path.join(tmp, k + '.npy')}"]
                    label = f"{name} -O{opt} case {variant}"
                    p = run(cmd)
                    if p.returncode != 0:
                        print(f"FAIL {label}: {p.stderr.strip()}")
                        failures += 1
                        continue
                    expected = sess.run(None, feeds)
                    for out, want in zip(sess.get_outputs(), expected):
                        got = np.load(os.path.join(out_dir, out.name + ".npy"))
                        same = got.shape == want.shape
                        err = rel_l2(got, want) if same and want.size else (0.0 if same else float("inf"))
                        ok = same and err < tol
                        failures += not ok
                        print(f"{'ok  ' if ok else 'FAIL'} {label} output {out.name} {tuple(got.shape)}"
                              f" (ORT {tuple(want.shape)}): rel L2 {err:.1e}")
        # The appended values became scan outputs (loop_concat_to_scan), not a Concat an iteration.
        p = run([args.kiln, "build", *args.build_flags.split(), "--onnx", os.path.join(tmp, "loop_append.onnx"),
                 "--save-engine", os.path.join(tmp, "la.kiln"), "--verbose"])
        ok = p.returncode == 0 and "loop_concat_to_scan: 2 rewrites" in p.stdout + p.stderr
        failures += not ok
        print(f"{'ok  ' if ok else 'FAIL'} loop_append: both appended values kept as scan outputs")
        # A negative trip count: one line, exit status 1.
        path = os.path.join(tmp, "loop_scan.onnx")
        np.save(os.path.join(tmp, "x.npy"), np.zeros((6, 4), np.float32))
        np.save(os.path.join(tmp, "M.npy"), np.array(-3, np.int64))
        p = run([args.kiln, "run", *args.build_flags.split(), "--onnx", path,
                 "--input", f"x={os.path.join(tmp, 'x.npy')}", "--input", f"M={os.path.join(tmp, 'M.npy')}"])
        lines = p.stderr.strip().splitlines()
        ok = p.returncode == 1 and len(lines) == 1 and "trip count" in lines[0]
        failures += not ok
        print(f"{'ok  ' if ok else 'FAIL'} negative trip count: exit {p.returncode}: {p.stderr.strip()}")
    print(f"control-flow tests: {'all agree with ONNX Runtime' if failures == 0 else f'{failures} FAILED'}")
    return 1 if failures else 0


if __name__ == "__main__":
    sys.exit(main())
