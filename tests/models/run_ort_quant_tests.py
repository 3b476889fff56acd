#!/usr/bin/env python3
"""ONNX Runtime's quantizer output (QOperator and dynamic): kiln against ONNX Runtime on the same
quantized model.

Two small float models made with onnx.helper, a transformer-ish block (MatMuls over [B, S, D]
with biases, a ReLU, a residual Add and an activation x activation^T product) and a small CNN
(Conv 3x3 with padding, a grouped strided Conv, a 1x1 Conv, ReLUs), are quantized by
onnxruntime.quantization:
  - quantize_dynamic: MatMulInteger / ConvInteger after DynamicQuantizeLinear (the
    model_quantized.onnx files on the Hugging Face hub);
  - quantize_static(..., quant_format=QuantFormat.QOperator) with a tiny calibration reader:
    QLinearConv / QLinearMatMul between QuantizeLinear and DequantizeLinear; uint8 asymmetric
    activations, per tensor and per channel, and symmetric int8 (which kiln's --int8 maps onto
    INT8 layers, also checked).
Each quantized model is built at -O0 and -O2 (cpu backend) and run on two random inputs; its
outputs must be within 2 quantization steps of ONNX Runtime's everywhere: for a model ending in a
DequantizeLinear 2 x its scale, for a dynamic one (float outputs) 2 x max|ORT output| / 255 (one
uint8 step of a range that wide). The symmetric int8 models built with --int8 (-O2) run INT8
layers whose int32 accumulators go straight into the float epilogue, skipping requantizations the
QOperator graph does (as TensorRT does; docs/quantization.md): within 4 steps. With a CUDA build (no GPU needed) each model also goes through
the cuda build step (kiln_lower_check): every layer must get a GPU tactic.

Then the four ops alone, against ONNX's reference (onnx.reference) exactly, at -O0 and -O2 (where
qoperator_to_qdq rewrites them): int8/uint8 mixes, zero points and scales per tensor, per row of
A ([..., M, 1]), per column of B ([1, N]), per output channel; batched broadcasting; groups,
strides, dilations, pads, auto_pad and an int32 bias.

  tests/models/run_ort_quant_tests.py --kiln build/kiln

Exit status 1 on any failure.
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
    from onnxruntime import quantization as oq
except ImportError:  # setup.sh installs it; say so rather than skip silently
    ort = None


def transformer_block(seed=0, d=32, hidden=64):
    rng = np.random.default_rng(seed)
    inits = []

    def init(*s):
        inits.append(numpy_helper.from_array(rng.normal(0, 0.2, s).astype(np.float32), f"w{len(inits)}"))
        return inits[-1].name
    w1, b1, w2, b2, wq = init(d, hidden), init(hidden), init(hidden, d), init(d), init(d, d)
    nodes = [
        helper.make_node("MatMul", ["x", w1], ["h0"]),
        helper.make_node("Add", ["h0", b1], ["h1"]),
        helper.make_node("Relu", ["h1"], ["h2"]),
        helper.make_node("MatMul", ["h2", w2], ["h3"]),
        helper.make_node("Add", ["h3", b2], ["h4"]),
        helper.make_node("Add", ["h4", "x"], ["h5"]),
        helper.make_node("MatMul", ["h5", wq], ["q"]),
        helper.make_node("Transpose", ["h5"], ["kt"], perm=[0, 2, 1]),
        helper.make_node("MatMul", ["q", "kt"], ["y"]),
    ]
    g = helper.make_graph(nodes, "block",
                          [helper.make_tensor_value_info("x", TensorProto.FLOAT, ["batch", 8, d])],
                          [helper.make_tensor_value_info("y", TensorProto.FLOAT, None)], inits)
    return helper.make_model(g, opset_imports=[helper.make_opsetid("", 13)]), {"x": ("batch", 8, d)}


def small_cnn(seed=1):
    rng = np.random.default_rng(seed)
    inits = []
    def init(*s, scale=0.3):
        t = numpy_helper.from_array(rng.normal(0, scale, s).astype(np.float32), f"w{len(inits)}")
        inits.append(t)
        return t.name
    nodes = [
        helper.make_node("Conv", ["x", init(8, 3, 3, 3), init(8, scale=0.1)], ["c1"], pads=[1, 1, 1, 1]),
        helper.make_node("Relu", ["c1"], ["r1"]),
        helper.make_node("Conv", ["r1", init(8, 4, 3, 3), init(8, scale=0.1)], ["c2"], group=2,
                         strides=[2, 2], pads=[1, 0, 1, 0]),
        helper.make_node("Relu", ["c2"], ["r2"]),
        helper.make_node("Conv", ["r2", init(4, 8, 1, 1)], ["y"]),
    ]
    g = helper.make_graph(nodes, "cnn",
                          [helper.make_tensor_value_info("x", TensorProto.FLOAT, ["batch", 3, 12, 10])],
                          [helper.make_tensor_value_info("y", TensorProto.FLOAT, None)], inits)
    return helper.make_model(g, opset_imports=[helper.make_opsetid("", 13)]), {"x": ("batch", 3, 12, 10)}


def feeds(shapes, batch, rng):
    return {k: rng.normal(0, 1, [batch if d == "batch" else d for d in s]).astype(np.float32)
            for k, s in shapes.items()}


class Reader:
    """quantize_static's calibration data: a few random batches."""

    def __init__(self, shapes):
        rng = np.random.default_rng(7)
        self.data = iter([feeds(shapes, 2, rng) for _ in range(4)])

    def get_next(self):
        return next(self.data, None)


def quantized(tmp, name, model, shapes, how):
    """Quantizes `model` the way `how` names; returns the quantized model's path."""
    src = os.path.join(tmp, name + "_float.onnx")
    onnx.save(model, src)
    dst = os.path.join(tmp, name + ".onnx")
    ops = ["MatMul", "Conv"]
    if how == "dynamic":
        oq.quantize_dynamic(src, dst, op_types_to_quantize=ops, weight_type=oq.QuantType.QUInt8)
        return dst
    extra = {"ActivationSymmetric": True, "WeightSymmetric": True} if how == "static_s8" else {}
    act = oq.QuantType.QInt8 if how == "static_s8" else oq.QuantType.QUInt8
    oq.quantize_static(src, dst, Reader(shapes), quant_format=oq.QuantFormat.QOperator,
                       op_types_to_quantize=ops, per_channel=how != "static_u8",
                       activation_type=act, weight_type=oq.QuantType.QInt8, extra_options=extra)
    return dst


def run(cmd):
    p = subprocess.run(cmd, capture_output=True, text=True, timeout=600)
    if p.returncode != 0:
        raise RuntimeError(f"{' '.join(cmd)} failed ({p.returncode}): {(p.stderr or p.stdout).strip()}")
    return p.stdout


def output_step(model, out_name, ref):
    """One quantization step of an output: the scale of the DequantizeLinear making it, else one
    uint8 step of ONNX Runtime's output range."""
    inits = {t.name: numpy_helper.to_array(t) for t in model.graph.initializer}
    for n in model.graph.node:
        if out_name in n.output and n.op_type == "DequantizeLinear" and n.input[1] in inits:
            return float(inits[n.input[1]].max())
    return float(np.abs(ref).max()) / 255


def reference_cases(seed=0):
    """(name, model, inputs): the four ops alone over the forms listed at the top."""
    rng = np.random.default_rng(seed)
    tp = {np.int8: TensorProto.INT8, np.uint8: TensorProto.UINT8}

    def q(t, *s):
        return (rng.integers(-128, 128, s) if t == np.int8 else rng.integers(0, 256, s)).astype(t)

    def model(node, inputs, consts):
        ins = [helper.make_tensor_value_info(k, tp[v.dtype.type], list(v.shape)) for k, v in inputs.items()]
        g = helper.make_graph([node], "g", ins, [helper.make_tensor_value_info("y", TensorProto.UNDEFINED, None)],
                              [numpy_helper.from_array(v, k) for k, v in consts.items()])
        m = helper.make_model(g, opset_imports=[helper.make_opsetid("", 13)])
        m.ir_version = 8
        return m

    for it in range(6):
        xt, wt = (np.int8, np.uint8)[it % 2], (np.int8, np.uint8)[(it // 2) % 2]
        yt, group, pc, M = (np.uint8, np.int8)[it % 2], 1 + it % 2, it % 2 == 1, 6
        attrs = dict(group=group, strides=[1 + it % 2, 1], dilations=[1, 1 + it // 3],
                     pads=[it % 2, 1, 0, it % 3])
        if it == 5:
            attrs = dict(group=group, auto_pad="SAME_UPPER", strides=[2, 2])
        x, w = q(xt, 2, 4, 7, 6), q(wt, M, 4 // group, 3, 2)
        wzp = q(wt, M) if pc else q(wt)
        yield (f"ConvInteger_{it}", model(helper.make_node("ConvInteger", ["x", "w", "xzp", "wzp"], ["y"], **attrs),
                                          {"x": x}, {"w": w, "xzp": q(xt), "wzp": wzp}), {"x": x})
        ws = rng.uniform(0.001, 0.01, M if pc else ()).astype(np.float32)
        yield (f"QLinearConv_{it}", model(
            helper.make_node("QLinearConv", ["x", "xs", "xzp", "w", "ws", "wzp", "ys", "yzp", "B"], ["y"], **attrs),
            {"x": x}, {"xs": np.array(0.05, np.float32), "xzp": q(xt), "w": w, "ws": ws, "wzp": wzp,
                       "ys": np.array(rng.uniform(0.05, 2), np.float32), "yzp": q(yt),
                       "B": rng.integers(-5000, 5000, M).astype(np.int32)}), {"x": x})
        a = q(xt, 2, 3, 5, 8)
        b = q(wt, 3, 8, 4) if it < 3 else q(wt, 8, 4)
        azp = q(xt, 2, 3, 5, 1) if it % 3 == 0 else q(xt)
        bzp = q(wt, 1, 4) if it % 2 else q(wt)
        yield (f"MatMulInteger_{it}", model(helper.make_node("MatMulInteger", ["a", "b", "azp", "bzp"], ["y"]),
                                            {"a": a}, {"b": b, "azp": azp, "bzp": bzp}), {"a": a})
        consts = {"as": rng.uniform(0.01, 0.05, azp.shape).astype(np.float32), "azp": azp, "b": b,
                  "bs": rng.uniform(0.01, 0.05, bzp.shape).astype(np.float32), "bzp": bzp,
                  "ys": np.array(rng.uniform(0.5, 3), np.float32), "yzp": q(yt)}
        yield (f"QLinearMatMul_{it}", model(
            helper.make_node("QLinearMatMul", ["a", "as", "azp", "b", "bs", "bzp", "ys", "yzp"], ["y"]),
            {"a": a}, consts), {"a": a})


def check_reference(kiln, tmp):
    """Each reference case at -O0 and -O2: kiln's output equals onnx.reference's. Failures."""
    from onnx.reference import ReferenceEvaluator
    failures = runs = 0
    for name, m, inputs in reference_cases():
        path = os.path.join(tmp, "ref.onnx")
        onnx.save(m, path)
        want = ReferenceEvaluator(m).run(None, inputs)[0]
        cmd = []
        for k, v in inputs.items():
            np.save(os.path.join(tmp, k + ".npy"), v)
            cmd += ["--input", f"{k}={os.path.join(tmp, k + '.npy')}"]
        for level in ("0", "2"):
            runs += 1
            engine, out = os.path.join(tmp, "ref.kiln"), os.path.join(tmp, "ref_out")
            try:
                run([kiln, "build", "--onnx", path, "--backend", "cpu", "--save-engine", engine, "--opt-level", level])
                run([kiln, "run", "--engine", engine, "--save-outputs", out] + cmd)
                got = np.load(os.path.join(out, "y.npy"))
                if got.dtype != want.dtype or not np.array_equal(got, want):
                    raise RuntimeError(f"{got.dtype}{list(got.shape)} differs from the reference's "
                                       f"{want.dtype}{list(want.shape)}"
                                       + (f" in {(got != want).sum()} elements" if got.shape == want.shape else ""))
            except RuntimeError as e:
                print(f"FAIL {name} -O{level}: {e}")
                failures += 1
    print(f"ORT quantizer tests: the ops alone: {runs} runs, "
          f"{'all equal to onnx.reference' if failures == 0 else f'{failures} FAILED'}")
    return failures


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--kiln", default="build/kiln")
    ap.add_argument("--lower-check", default=None,
                    help="kiln_lower_check (default: next to --kiln, when built with CUDA)")
    ap.add_argument("--steps", type=float, default=2.0, help="tolerance in output quantization steps")
    ap.add_argument("--int8-steps", type=float, default=4.0,
                    help="tolerance of --int8 builds (INT8 layers skip requantizations, see the top)")
    ap.add_argument("--verbose", action="store_true", help="print every comparison")
    a = ap.parse_args()
    if ort is None:
        print("ORT quantizer tests: onnxruntime is not installed (scripts/setup.sh installs it)")
        return 1
    lower_check = a.lower_check or os.path.join(os.path.dirname(a.kiln), "tests", "cuda", "kiln_lower_check")
    if not os.path.exists(lower_check):
        print("ORT quantizer tests: no kiln_lower_check (a build without CUDA): the cuda build step is skipped")
        lower_check = None
    failures = checked = 0
    with tempfile.TemporaryDirectory() as tmp:
        for mname, make in (("block", transformer_block), ("cnn", small_cnn)):
            model, shapes = make()
            for how in ("dynamic", "static_u8", "static_u8_pc", "static_s8"):
                name = f"{mname}_{how}"
                try:
                    path = quantized(tmp, name, model, shapes, how)
                except Exception as e:  # the quantizer itself failing is a failure of this test
                    print(f"FAIL {name}: quantization: {e}")
                    failures += 1
                    continue
                qmodel = onnx.load(path)
                types = {n.op_type for n in qmodel.graph.node}
                want = {("block", True): "MatMulInteger", ("cnn", True): "ConvInteger",
                        ("block", False): "QLinearMatMul", ("cnn", False): "QLinearConv"}
                missing = {want[mname, how == "dynamic"]} - types
                if missing:
                    print(f"FAIL {name}: the quantizer wrote no {sorted(missing)} (ops: {sorted(types)})")
                    failures += 1
                sess = ort.InferenceSession(path, providers=["CPUExecutionProvider"])
                rng = np.random.default_rng(3)
                inputs = [feeds(shapes, b, rng) for b in (1, 3)]
                flags = [("-O0", ["--opt-level", "0"]), ("-O2", ["--opt-level", "2"])]
                if how == "static_s8":
                    flags.append(("-O2 --int8", ["--opt-level", "2", "--int8"]))
                for label, fl in flags:
                    engine = os.path.join(tmp, name + ".kiln")
                    try:
                        run([a.kiln, "build", "--onnx", path, "--backend", "cpu", "--save-engine", engine,
                             "--min-shapes", "x:" + "x".join(str(1 if d == "batch" else d) for d in shapes["x"]),
                             "--opt-shapes", "x:" + "x".join(str(3 if d == "batch" else d) for d in shapes["x"]),
                             "--max-shapes", "x:" + "x".join(str(3 if d == "batch" else d) for d in shapes["x"]),
                             *fl])
                    except RuntimeError as e:
                        print(f"FAIL {name} {label}: build: {e}")
                        failures += 1
                        continue
                    for f in inputs:
                        out_dir = os.path.join(tmp, "out")
                        cmd = [a.kiln, "run", "--engine", engine, "--save-outputs", out_dir]
                        for k, v in f.items():
                            np.save(os.path.join(tmp, k + ".npy"), v)
                            cmd += ["--input", f"{k}={os.path.join(tmp, k + '.npy')}"]
                        try:
                            run(cmd)
                        except RuntimeError as e:
                            print(f"FAIL {name} {label}: run: {e}")
                            failures += 1
                            continue
                        ref = sess.run(None, f)
                        for out, want in zip(qmodel.graph.output, ref):
                            got = np.load(os.path.join(out_dir, out.name + ".npy"))
                            step = output_step(qmodel, out.name, want)
                            err = float(np.abs(got.astype(np.float64) - want).max()) if got.shape == want.shape else float("inf")
                            checked += 1
                            steps = a.int8_steps if "--int8" in fl else a.steps
                            ok = err <= steps * step
                            failures += not ok
                            if not ok or a.verbose:
                                print(f"{'ok  ' if ok else 'FAIL'} {name} {label} batch {f['x'].shape[0]}: "
                                      f"max |kiln - ORT| {err:.3g} {'<=' if ok else '>'} {steps:g} steps of {step:.3g}")
                if lower_check:
                    try:
                        last = run([lower_check, "--shapes", "x:" + "x".join(
                            str(2 if d == "batch" else d) for d in shapes["x"]), path]).strip().splitlines()[-1]
                        if not last.startswith("ok"):
                            raise RuntimeError(last.split("\t")[-1])
                    except RuntimeError as e:
                        print(f"FAIL {name}: cuda build step: {e}")
                        failures += 1
        failures += check_reference(a.kiln, tmp)
    print(f"ORT quantizer tests: {checked} outputs compared, "
          f"{'all within tolerance of ONNX Runtime' if failures == 0 else f'{failures} FAILED'}")
    return 1 if failures else 0


if __name__ == "__main__":
    sys.exit(main())
