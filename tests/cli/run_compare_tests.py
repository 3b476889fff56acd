#!/usr/bin/env python3
"""CLI tests of image inputs, `kiln compare` and `kiln report`: good runs check their numbers
against NumPy/Pillow computed here; bad input gives exit status 1 and one line on stderr."""
import argparse
import json
import os
import subprocess
import sys
import tempfile

import numpy as np
import onnx
from onnx import TensorProto, helper
from PIL import Image

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, os.path.join(HERE, "..", "..", "scripts", "models"))
sys.path.insert(0, HERE)
import small_models  # noqa: E402
from run_cli_tests import FAILURES, expect_error, expect_ok  # noqa: E402


def check(label, ok, detail=""):
    print(f"{'ok  ' if ok else 'FAIL'} {label}{': ' + detail if detail else ''}")
    if not ok:
        FAILURES.append(label)


def identity_model(shape):
    g = helper.make_graph([helper.make_node("Identity", ["x"], ["y"], name="id")], "id",
                          [helper.make_tensor_value_info("x", TensorProto.FLOAT, shape)],
                          [helper.make_tensor_value_info("y", TensorProto.FLOAT, shape)])
    m = helper.make_model(g, opset_imports=[helper.make_opsetid("", 17)])
    m.ir_version = 8
    return m


def torchvision_like(path, short, crop, mean, std):
    """Resize(short) + CenterCrop(crop) + ToTensor + Normalize, written with Pillow as
    torchvision does it (bilinear, antialiased)."""
    im = Image.open(path).convert("RGB")
    w, h = im.size
    nw, nh = (short, int(short * h / w)) if w <= h else (int(short * w / h), short)
    im = im.resize((nw, nh), Image.BILINEAR)
    top, left = int(round((nh - crop) / 2.0)), int(round((nw - crop) / 2.0))
    im = im.crop((left, top, left + crop, top + crop))
    a = np.asarray(im, np.float32) / 255.0
    return ((a - np.array(mean, np.float32)) / np.array(std, np.float32)).transpose(2, 0, 1)[None]


def image_tests(args, p):
    rng = np.random.default_rng(0)
    # A smooth picture (resampling filters differ most on noise) with some detail.
    yy, xx = np.mgrid[0:90, 0:120]
    pic = np.stack([xx * 2, yy * 2.5, (xx + yy)], -1) + rng.integers(0, 20, (90, 120, 3))
    Image.fromarray(np.clip(pic, 0, 255).astype(np.uint8)).save(p("pic.png"))
    Image.fromarray(np.clip(pic, 0, 255).astype(np.uint8)).save(p("pic.jpg"), quality=95)
    onnx.save(identity_model([1, 3, 64, 64]), p("id.onnx"))
    onnx.save(identity_model([1, 64, 64, 3]), p("id_nhwc.onnx"))
    mean, std = [0.485, 0.456, 0.406], [0.229, 0.224, 0.225]
    for ext in ("png", "jpg"):
        expect_ok(args, f"run with a .{ext} image", "run", "--onnx", p("id.onnx"), "--input", f"x={p('pic.' + ext)}",
                  "--resize", "72", "--mean", ",".join(map(str, mean)), "--std", ",".join(map(str, std)),
                  "--save-outputs", p(f"img_{ext}"))
        got = np.load(p(f"img_{ext}/y.npy"))
        want = torchvision_like(p("pic." + ext), 72, 64, mean, std)
        err = float(np.abs(got - want).max()) * 0.225  # back in [0,1] pixel units
        check(f".{ext}: kiln's Resize+CenterCrop+Normalize vs Pillow's (torchvision's recipe)",
              got.shape == want.shape and err < 4 / 255, f"max diff {err * 255:.2f}/255")
    expect_ok(args, "run with an NHWC image input", "run", "--onnx", p("id_nhwc.onnx"), "--input",
              f"x={p('pic.png')}", "--resize", "72", "--image-layout", "NHWC", "--save-outputs", p("img_nhwc"))
    nchw = np.load(p("img_png/y.npy")) * np.array(std, np.float32)[:, None, None] + np.array(mean, np.float32)[:, None, None]
    nhwc = np.load(p("img_nhwc/y.npy"))
    check("NHWC layout is the NCHW tensor transposed", np.allclose(nhwc, nchw.transpose(0, 2, 3, 1), atol=1e-5))
    open(p("junk.png"), "wb").write(b"not an image")
    expect_error(args, "image: not an image", "not a readable image", "run", "--onnx", p("id.onnx"), "--input", f"x={p('junk.png')}")
    expect_error(args, "image: missing file", "no such file", "run", "--onnx", p("id.onnx"), "--input", f"x={p('nope.jpg')}")
    expect_error(args, "image: bad --mean", "--mean", "run", "--onnx", p("id.onnx"), "--input", f"x={p('pic.png')}", "--mean", "0.5,abc")
    expect_error(args, "image: bad --resize", "--resize", "run", "--onnx", p("id.onnx"), "--input", f"x={p('pic.png')}", "--resize", "0")
    expect_error(args, "image options without an image", "image inputs", "run", "--onnx", p("id.onnx"), "--mean", "0.5")
    expect_error(args, "image: crop larger than resize", "larger than the resized image", "run", "--onnx", p("id.onnx"),
                 "--input", f"x={p('pic.png')}", "--resize", "32")


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--kiln", default="build/kiln")
    args = ap.parse_args()
    with tempfile.TemporaryDirectory() as d:
        p = lambda name: os.path.join(d, name)  # noqa: E731
        image_tests(args, p)
    print(f"compare/report/image cli tests: {'all behave' if not FAILURES else str(len(FAILURES)) + ' FAILED: ' + ', '.join(FAILURES)}")
    return 1 if FAILURES else 0


if __name__ == "__main__":
    sys.exit(main())
