#!/usr/bin/env python3
"""CLI behaviour on good and bad input: every bad input gives exit status 1 and one line on
stderr that names the problem (never a signal, a hang or a traceback)."""
import argparse
import os
import subprocess
import sys
import tempfile

import numpy as np
import onnx
from onnx import TensorProto, helper

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, os.path.join(HERE, "..", "..", "scripts", "models"))
import small_models  # noqa: E402

FAILURES = []


def kiln(args, *a):
    return subprocess.run([args.kiln, *a], capture_output=True, text=True, timeout=300)


def expect_ok(args, label, *a):
    p = kiln(args, *a)
    ok = p.returncode == 0
    print(f"{'ok  ' if ok else 'FAIL'} {label}")
    if not ok:
        FAILURES.append(label)
        print("     stderr:", p.stderr.strip())
    return p


def expect_error(args, label, needle, *a):
    p = kiln(args, *a)
    lines = p.stderr.strip().splitlines()
    problems = []
    if p.returncode != 1:
        problems.append(f"exit status {p.returncode}")
    if len(lines) != 1:
        problems.append(f"{len(lines)} stderr lines")
    if needle.lower() not in p.stderr.lower():
        problems.append(f"message lacks '{needle}'")
    print(f"{'ok  ' if not problems else 'FAIL'} {label}: {lines[-1] if lines else '(no message)'}")
    if problems:
        FAILURES.append(label)
        print("     problems:", "; ".join(problems))


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--kiln", default="build/kiln")
    args = ap.parse_args()
    with tempfile.TemporaryDirectory() as d:
        p = lambda name: os.path.join(d, name)  # noqa: E731
        onnx.save(small_models.small_cnn(), p("cnn.onnx"))
        good = open(p("cnn.onnx"), "rb").read()

        expect_ok(args, "help", "--help")
        for sub in ("build", "run", "inspect"):
            expect_ok(args, f"{sub} --help", sub, "--help")
        expect_ok(args, "build", "build", "--onnx", p("cnn.onnx"), "--save-engine", p("cnn.kiln"))
        expect_ok(args, "run engine", "run", "--engine", p("cnn.kiln"), "--save-outputs", p("out"))
        if not os.path.exists(p("out/probabilities.npy")):
            FAILURES.append("run saved no output")
        expect_ok(args, "inspect engine --json", "inspect", p("cnn.kiln"), "--json")
        expect_ok(args, "inspect onnx", "inspect", p("cnn.onnx"))
        expect_ok(args, "build with profile", "build", "--onnx", p("cnn.onnx"), "--save-engine", p("prof.kiln"),
                  "--min-shapes", "input:1x3x32x32", "--opt-shapes", "input:4x3x32x32", "--max-shapes", "input:8x3x32x32")
        expect_ok(args, "run within profile", "run", "--engine", p("prof.kiln"), "--shapes", "input:8x3x32x32")
        # trtexec's --inputIOFormats / --outputIOFormats: float16 in and out, the same names.
        out = expect_ok(args, "build with fp16 I/O", "build", "--onnx", p("cnn.onnx"), "--save-engine", p("io.kiln"),
                        "--input-io-formats", "fp16:chw", "--output-io-formats", "fp16").stdout
        if "input  input: float16" not in out or "output probabilities: float16" not in out:
            FAILURES.append(f"fp16 I/O build did not declare float16 input and output:\n{out}")
        expect_ok(args, "run fp16 I/O engine", "run", "--engine", p("io.kiln"))
        # A model exported in float16 builds, and the summary says why it is not fused.
        w16 = helper.make_tensor("w", TensorProto.FLOAT16, [4, 3], np.linspace(-1, 1, 12).astype(np.float16).tobytes(),
                                 raw=True)
        g16 = helper.make_graph([helper.make_node("MatMul", ["x", "w"], ["y"], name="mm")], "half",
                                [helper.make_tensor_value_info("x", TensorProto.FLOAT16, [2, 4])],
                                [helper.make_tensor_value_info("y", TensorProto.FLOAT16, [2, 3])], [w16])
        onnx.save(helper.make_model(g16, opset_imports=[helper.make_opsetid("", 17)]), p("half.onnx"))
        out = expect_ok(args, "build a float16 model", "build", "--onnx", p("half.onnx"), "--save-engine",
                        p("half.kiln")).stdout
        if "1 of the model's matrix products and convolutions compute in float16" not in out:
            FAILURES.append(f"float16 model build did not note the float16 products:\n{out}")
        expect_error(args, "bad I/O format", "--output-io-formats: 'int4' is not a type", "build", "--onnx",
                     p("cnn.onnx"), "--save-engine", p("x.kiln"), "--output-io-formats", "int4")
        expect_error(args, "I/O formats with --engine", "apply to --onnx", "run", "--engine", p("cnn.kiln"),
                     "--output-io-formats", "fp16")

        # usage errors
        expect_error(args, "no subcommand", "subcommand")
        expect_error(args, "unknown subcommand", "unknown subcommand 'frobnicate'", "frobnicate", "--onnx", p("cnn.onnx"))
        expect_error(args, "unknown flag", "--bogus", "build", "--onnx", p("cnn.onnx"), "--save-engine", p("x.kiln"), "--bogus")
        expect_error(args, "missing --save-engine", "save-engine", "build", "--onnx", p("cnn.onnx"))
        expect_error(args, "bad --shapes", "--shapes", "build", "--onnx", p("cnn.onnx"), "--save-engine", p("x.kiln"), "--shapes", "input:1xAx3")
        expect_error(args, "--shapes unknown input", "no input named", "build", "--onnx", p("cnn.onnx"), "--save-engine", p("x.kiln"), "--shapes", "nope:1x3x32x32")
        expect_error(args, "--shapes wrong static dim", "dimension 1", "build", "--onnx", p("cnn.onnx"), "--save-engine", p("x.kiln"), "--shapes", "input:1x4x32x32")
        expect_error(args, "min > max", "min <= opt <= max", "build", "--onnx", p("cnn.onnx"), "--save-engine", p("x.kiln"),
                     "--min-shapes", "input:8x3x32x32", "--max-shapes", "input:1x3x32x32")
        expect_error(args, "--opt-level with --engine", "--opt-level applies to --onnx", "run", "--engine", p("cnn.kiln"), "--opt-level", "0")
        expect_error(args, "outside profile", "outside the engine's profile", "run", "--engine", p("prof.kiln"), "--shapes", "input:9x3x32x32")

        # bad models
        expect_error(args, "missing model", "no such file", "build", "--onnx", p("nope.onnx"), "--save-engine", p("x.kiln"))
        open(p("empty.onnx"), "wb").close()
        expect_error(args, "empty model", "empty", "build", "--onnx", p("empty.onnx"), "--save-engine", p("x.kiln"))
        open(p("garbage.onnx"), "wb").write(os.urandom(4096))
        expect_error(args, "garbage model", "not a valid ONNX model", "inspect", p("garbage.onnx"))
        open(p("trunc.onnx"), "wb").write(good[: len(good) // 2])
        expect_error(args, "truncated model", "not a valid ONNX model", "run", "--onnx", p("trunc.onnx"))
        n1 = helper.make_node("FooBar", ["x"], ["y"], name="foo1")
        n2 = helper.make_node("Relu", ["y"], ["z"], name="relu")
        n3 = helper.make_node("FooBar", ["z"], ["w"], name="foo2")
        n4 = helper.make_node("StringNormalizer", ["w"], ["u"], name="strings")
        g = helper.make_graph([n1, n2, n3, n4], "g", [helper.make_tensor_value_info("x", TensorProto.FLOAT, [2])],
                              [helper.make_tensor_value_info("u", TensorProto.FLOAT, None)])
        m = helper.make_model(g, opset_imports=[helper.make_opsetid("", 17)])
        onnx.save(m, p("unsupported.onnx"))
        expect_error(args, "unsupported ops listed together", "FooBar (nodes foo1, foo2); StringNormalizer (node strings)",
                     "build", "--onnx", p("unsupported.onnx"), "--save-engine", p("x.kiln"))
        n = helper.make_node("Relu", ["x", ], ["y"], name="r")
        g = helper.make_graph([n], "g", [helper.make_tensor_value_info("x", TensorProto.FLOAT, [2])],
                              [helper.make_tensor_value_info("missing", TensorProto.FLOAT, [2])])
        onnx.save(helper.make_model(g, opset_imports=[helper.make_opsetid("", 17)]), p("dangling.onnx"))
        expect_error(args, "dangling graph output", "missing", "inspect", p("dangling.onnx"))
        n = helper.make_node("Add", ["x", "ghost"], ["y"], name="add")
        g = helper.make_graph([n], "g", [helper.make_tensor_value_info("x", TensorProto.FLOAT, [2])],
                              [helper.make_tensor_value_info("y", TensorProto.FLOAT, [2])])
        onnx.save(helper.make_model(g, opset_imports=[helper.make_opsetid("", 17)]), p("ghost.onnx"))
        expect_error(args, "undefined node input", "ghost", "inspect", p("ghost.onnx"))
        g = helper.make_graph([helper.make_node("Relu", ["x"], ["y"])], "g",
                              [helper.make_tensor_value_info("x", TensorProto.FLOAT, [2])],
                              [helper.make_tensor_value_info("y", TensorProto.FLOAT, [2])])
        # An opset newer than kiln knows imports with a warning; an op used at an opset before
        # it existed is refused naming the node, op and opset.
        gg = helper.make_graph([helper.make_node("Gelu", ["x"], ["y"], name="gelu")], "g",
                               [helper.make_tensor_value_info("x", TensorProto.FLOAT, [2])],
                               [helper.make_tensor_value_info("y", TensorProto.FLOAT, [2])])
        m = helper.make_model(gg, opset_imports=[helper.make_opsetid("", 13)])
        m.ir_version = 8
        onnx.save(m, p("gelu13.onnx"))
        expect_error(args, "op older than its opset", "Gelu does not exist at opset 13", "inspect", p("gelu13.onnx"))
        n = helper.make_node("Conv", ["x", "w"], ["y"], name="conv")
        g = helper.make_graph([n], "g", [helper.make_tensor_value_info("x", TensorProto.FLOAT, [1, 3, 8, 8])],
                              [helper.make_tensor_value_info("y", TensorProto.FLOAT, None)],
                              [helper.make_tensor("w", TensorProto.FLOAT, [4, 5, 3, 3], np.ones(180, np.float32))])
        onnx.save(helper.make_model(g, opset_imports=[helper.make_opsetid("", 17)]), p("badconv.onnx"))
        expect_error(args, "channel mismatch", "conv", "build", "--onnx", p("badconv.onnx"), "--save-engine", p("x.kiln"))

        # bad engines
        eng = open(p("cnn.kiln"), "rb").read()
        open(p("empty.kiln"), "wb").close()
        expect_error(args, "empty engine", "empty", "run", "--engine", p("empty.kiln"))
        open(p("trunc.kiln"), "wb").write(eng[: len(eng) - 100])
        expect_error(args, "truncated engine", "truncated", "run", "--engine", p("trunc.kiln"))
        bad = bytearray(eng)
        bad[len(bad) // 2] ^= 0x40
        open(p("flip.kiln"), "wb").write(bytes(bad))
        expect_error(args, "corrupted engine", "checksum", "run", "--engine", p("flip.kiln"))
        open(p("magic.kiln"), "wb").write(b"NOTKILN!" + eng[8:])
        expect_error(args, "bad magic", "not a kiln engine", "inspect", p("magic.kiln"))
        expect_error(args, "onnx given as engine", "not a kiln engine", "run", "--engine", p("cnn.onnx"))

        # bad inputs at run time
        np.save(p("wrong_shape.npy"), np.zeros((1, 3, 31, 32), np.float32) + 0.5)
        expect_error(args, "wrong input shape", "dimension 2", "run", "--engine", p("cnn.kiln"), "--input", f"input={p('wrong_shape.npy')}")
        np.save(p("wrong_type.npy"), np.ones((1, 3, 32, 32), np.float64))
        expect_error(args, "wrong input type", "float64", "run", "--engine", p("cnn.kiln"), "--input", f"input={p('wrong_type.npy')}")
        expect_error(args, "unknown input name", "no input named", "run", "--engine", p("cnn.kiln"), "--input", f"nope={p('wrong_type.npy')}")
        expect_error(args, "missing input file", "cannot open", "run", "--engine", p("cnn.kiln"), "--input", f"input={p('nope.npy')}")
        open(p("bad.npy"), "wb").write(b"\x93NUMPY\x01\x00garbage")
        expect_error(args, "corrupt npy", "bad.npy", "run", "--engine", p("cnn.kiln"), "--input", f"input={p('bad.npy')}")
        expect_error(args, "save-outputs onto a file", "save-outputs", "run", "--engine", p("cnn.kiln"), "--save-outputs", p("cnn.onnx"))

        serve_cases(args, p)

        # GPU backend without a GPU says so
        has_gpu = subprocess.run(["sh", "-c", "nvidia-smi -L"], capture_output=True).returncode == 0
        if not has_gpu:
            expect_error(args, "cuda backend without GPU", "GPU", "build", "--onnx", p("cnn.onnx"), "--save-engine", p("x.kiln"), "--backend", "cuda")
        expect_error(args, "fp16 on cpu", "cpu backend", "build", "--onnx", p("cnn.onnx"), "--save-engine", p("x.kiln"), "--backend", "cpu", "--fp16")
        int8_cases(args, p)
    print(f"cli tests: {'all behave' if not FAILURES else str(len(FAILURES)) + ' FAILED: ' + ', '.join(FAILURES)}")
    return 1 if FAILURES else 0


def serve_cases(args, p):
    """kiln serve refuses what it cannot serve before it takes a request (localhost only)."""
    import shutil
    import socket

    os.makedirs(p("serve_repo"), exist_ok=True)
    shutil.copy(p("cnn.kiln"), p("serve_repo/cnn.kiln"))
    os.makedirs(p("serve_empty"), exist_ok=True)
    os.makedirs(p("serve_broken"), exist_ok=True)
    open(p("serve_broken/bad.kiln"), "wb").write(b"not an engine")
    expect_error(args, "serve: no such repository", "is not a folder", "serve", p("nope"))
    expect_error(args, "serve: empty repository", "no engines", "serve", p("serve_empty"))
    expect_error(args, "serve: no engine loads", "no model could be loaded (model bad:", "serve", p("serve_broken"),
                 "--host", "127.0.0.1", "--http-port", "0", "--no-grpc")
    expect_error(args, "serve: bad --devices", "GPU indices", "serve", p("serve_repo"), "--devices", "gpu0")
    expect_error(args, "serve: bad --pad-batches", "pad-batches", "serve", p("serve_repo"), "--pad-batches", "a,b")
    # The deleted Python server's options (docs/python.md: --contexts, --devices and the dynamic
    # batcher's options replace them): the CLI's error for an unknown option, nothing served.
    for opt in (["--workers", "2"], ["--worker-devices", "all"], ["--batcher", "device"], ["--sched-batch"]):
        expect_error(args, f"serve: the Python server's {opt[0]}", opt[0], "serve", p("serve_repo"), *opt)
    with socket.socket() as taken:
        taken.bind(("127.0.0.1", 0))
        taken.listen()
        port = str(taken.getsockname()[1])
        expect_error(args, "serve: port in use", f"cannot listen on 127.0.0.1:{port} (REST)", "serve",
                     p("serve_repo"), "--host", "127.0.0.1", "--http-port", port, "--no-grpc")


def int8_cases(args, p):
    """INT8 (docs/quantization.md): calibration data, the cache and Q/DQ models."""
    rng = np.random.default_rng(0)
    os.makedirs(p("calib"))
    for i in range(3):
        np.save(p(f"calib/{i}.npy"), rng.random((2, 3, 32, 32), dtype=np.float32))
    build = ["build", "--onnx", p("cnn.onnx"), "--save-engine", p("q.kiln"), "--backend", "cpu", "--int8"]
    out = expect_ok(args, "int8 build with calibration", *build, "--calib", p("calib"), "--calib-cache", p("c.cache"))
    if "layers in INT8" not in out.stdout:
        FAILURES.append("int8 build summary")
    # --int8 alone says what runs outside INT8 (FP32 on the cpu backend), in --help too.
    if "precision INT8 where a layer has an INT8 kernel, FP32 elsewhere" not in out.stdout:
        FAILURES.append("int8 build summary names the precision elsewhere")
        print("     stdout:", out.stdout.strip())
    help_text = expect_ok(args, "build --help", "build", "--help").stdout
    for needle in ("--best", "Layers without an INT8 kernel stay FP32/TF32"):
        if needle not in help_text:
            FAILURES.append(f"build --help mentions '{needle}'")
    # A cache is keyed by the model optimized at FP32: builds that differ in float precisions
    # (--layer-precisions here; --fp16/--best on a GPU) reuse it.
    pinned = [a if a != p("q.kiln") else p("pinned.kiln") for a in build]
    out = expect_ok(args, "int8 cache reused with --layer-precisions", *pinned, "--calib-cache", p("c.cache"),
                    "--layer-precisions", "*:fp32")
    if " 0 layers in INT8" not in out.stdout or "scales: cache" not in out.stdout:
        FAILURES.append("int8 cache with every layer pinned to fp32")
    # --best on the cpu backend: INT8 and FP32 (it has no FP16), from the same cache.
    out = expect_ok(args, "best on the cpu backend", "build", "--onnx", p("cnn.onnx"), "--save-engine", p("best.kiln"),
                    "--backend", "cpu", "--best", "--calib-cache", p("c.cache"))
    if "layers in INT8" not in out.stdout or "scales: cache" not in out.stdout:
        FAILURES.append("best on the cpu backend builds INT8 layers from the cache")
    out = expect_ok(args, "inspect int8 engine", "inspect", p("q.kiln"))
    if " int8 " not in out.stdout or "scales: in=" not in out.stdout:
        FAILURES.append("inspect shows int8 layers and scales")
    expect_ok(args, "int8 build from the cache alone", *build, "--calib-cache", p("c.cache"))
    # Files of 2 samples for an engine of batch 4: one stream of samples, cut into batches of 4.
    expect_ok(args, "int8 calibration files of another batch", *build, "--shapes", "input:4x3x32x32",
              "--calib", p("calib"))
    expect_error(args, "int8 calibration with fewer samples than a batch", "holds 6 samples", *build,
                 "--shapes", "input:8x3x32x32", "--calib", p("calib"))
    # An image folder (class subfolders) as calibration data, preprocessed as image inputs are.
    from PIL import Image
    for cls in ("a", "b"):
        os.makedirs(p(f"calib_img/{cls}"))
        for i in range(3):
            Image.fromarray(rng.integers(0, 256, (40, 48, 3), dtype=np.uint8)).save(p(f"calib_img/{cls}/{i}.png"))
    expect_ok(args, "int8 calibration on an image folder", *build, "--calib", p("calib_img"),
              "--resize", "36", "--mean", "0.485,0.456,0.406", "--std", "0.229,0.224,0.225")
    expect_error(args, "image options without calibration images", "apply to calibration images",
                 "build", "--onnx", p("cnn.onnx"), "--save-engine", p("q.kiln"), "--resize", "36")
    expect_error(args, "image options with .npy calibration data", "apply to calibration images",
                 *build, "--calib", p("calib"), "--mean", "0.5")
    expect_error(args, "int8 cache algorithm differs", "algorithm differs", *build, "--calib-cache", p("c.cache"), "--calib-algo", "minmax")
    onnx.save(small_models.mlp(), p("mlp.onnx"))
    expect_error(args, "int8 cache from another model", "fingerprint differs", "build", "--onnx", p("mlp.onnx"), "--save-engine", p("q.kiln"), "--backend", "cpu", "--int8", "--calib-cache", p("c.cache"))
    open(p("junk.cache"), "w").write("hello\n")
    expect_error(args, "int8 cache not a cache", "not a kiln calibration cache", *build, "--calib-cache", p("junk.cache"))
    expect_error(args, "int8 without scales", "--int8 needs scales", *build)
    os.makedirs(p("empty"))
    expect_error(args, "int8 empty calibration dir", "no .npy files", *build, "--calib", p("empty"))
    expect_error(args, "int8 missing calibration dir", "not a readable directory", *build, "--calib", p("nope"))
    os.makedirs(p("badshape"))
    np.save(p("badshape/0.npy"), np.zeros((2, 3, 30, 32), np.float32))
    expect_error(args, "int8 calibration shape", "does not fit input 'input'", *build, "--calib", p("badshape"))
    os.makedirs(p("badtype"))
    np.save(p("badtype/0.npy"), np.zeros((2, 3, 32, 32), np.float64))
    expect_error(args, "int8 calibration type", "float64", *build, "--calib", p("badtype"))
    expect_error(args, "int8 calibration unknown input", "no input of that name", *build, "--calib", "nope=" + p("calib"))
    expect_error(args, "calib without int8", "apply to --int8", "build", "--onnx", p("cnn.onnx"), "--save-engine", p("q.kiln"), "--calib", p("calib"))
    # An asymmetric uint8 Q/DQ pair (ONNX Runtime's default) has no symmetric int8 form: it stays
    # as ops computed in float (ONNX's result), and the build summary names the node.
    x = helper.make_tensor_value_info("x", TensorProto.FLOAT, [1, 4])
    y = helper.make_tensor_value_info("y", TensorProto.FLOAT, [1, 4])
    inits = [helper.make_tensor("s", TensorProto.FLOAT, [], [0.1]), helper.make_tensor("z", TensorProto.UINT8, [], [128])]
    nodes = [helper.make_node("QuantizeLinear", ["x", "s", "z"], ["xq"], name="q_uint8"),
             helper.make_node("DequantizeLinear", ["xq", "s", "z"], ["y"], name="dq")]
    m = helper.make_model(helper.make_graph(nodes, "qdq", [x], [y], inits), opset_imports=[helper.make_opsetid("", 17)])
    onnx.save(m, p("qdq_u8.onnx"))
    out = expect_ok(args, "int8 asymmetric Q/DQ kept as ops", "build", "--onnx", p("qdq_u8.onnx"), "--save-engine", p("qu8.kiln"),
                    "--backend", "cpu", "--int8")
    if "2 Q/DQ nodes kept as ops" not in out.stdout or "q_uint8" not in out.stdout:
        FAILURES.append("int8 asymmetric Q/DQ: the summary counts the nodes kept and names the first")
        print("     stdout:", out.stdout.strip())
    xv = np.array([[-1.0, 0.04, 3.3, 20.0]], np.float32)
    np.save(p("qdq_x.npy"), xv)
    expect_ok(args, "int8 asymmetric Q/DQ runs", "run", "--engine", p("qu8.kiln"), "--input", "x=" + p("qdq_x.npy"),
              "--save-outputs", p("qu8_out"))
    want = (np.clip(np.round(xv / 0.1) + 128, 0, 255) - 128) * np.float32(0.1)  # ONNX's QDQ of x
    got = np.load(p("qu8_out/y.npy")) if os.path.exists(p("qu8_out/y.npy")) else None
    if got is None or not np.allclose(got, want, atol=1e-6):
        FAILURES.append("int8 asymmetric Q/DQ: kiln computes ONNX's QuantizeLinear/DequantizeLinear")
        print("     got", got, "want", want)
    # A symmetric int8 Q/DQ model built without --int8 runs its Q/DQ nodes as float ops; the
    # build summary says so and names the flag.
    inits = [helper.make_tensor("s", TensorProto.FLOAT, [], [0.1]), helper.make_tensor("z", TensorProto.INT8, [], [0])]
    nodes = [helper.make_node("QuantizeLinear", ["x", "s", "z"], ["xq"], name="q"),
             helper.make_node("DequantizeLinear", ["xq", "s", "z"], ["y"], name="dq")]
    m = helper.make_model(helper.make_graph(nodes, "qdq", [x], [y], inits), opset_imports=[helper.make_opsetid("", 17)])
    onnx.save(m, p("qdq_s8.onnx"))
    out = expect_ok(args, "Q/DQ model without --int8", "build", "--onnx", p("qdq_s8.onnx"), "--save-engine", p("qf.kiln"), "--backend", "cpu")
    if "2 QuantizeLinear/DequantizeLinear nodes run as float ops: build with --int8" not in out.stdout:
        FAILURES.append("Q/DQ model without --int8: the summary names --int8")
        print("     stdout:", out.stdout.strip())


if __name__ == "__main__":
    sys.exit(main())
