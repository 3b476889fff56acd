#!/usr/bin/env python3
"""GridSample, RoiAlign and NonMaxSuppression: kiln against ONNX Runtime on random one-node models.

Each case is a model made with onnx.helper (every opset form: GridSample 16/20/22, RoiAlign
10/16/22, NonMaxSuppression 10/11), run with `kiln run --onnx` at -O0 and -O2 on seeded random
inputs and compared with ONNX Runtime's CPU result: floats within 1e-5 (relative, 1e-6 absolute),
NonMaxSuppression's indices exactly. Exit status 1 on any mismatch.

  tests/models/run_sampling_ops_tests.py --kiln build/kiln [--backend cpu] [--filter REGEX]

On a GPU (`--backend cuda`, with KILN_UNVERIFIED_TACTICS=1 until the kernels are verified)
the same cases check the CUDA layers end to end; NonMaxSuppression's small inputs run on the host.
"""
import argparse
import os
import re
import subprocess
import sys
import tempfile

import numpy as np
import onnx
from onnx import TensorProto, helper

try:
    import onnxruntime as ort
except ImportError:  # setup.sh installs it; say so rather than skip silently
    ort = None

F32 = TensorProto.FLOAT
I64 = TensorProto.INT64


def model(op, inputs, attrs, opset):
    """One node of `op`; inputs: (name, elem_type) pairs, None for an omitted optional one."""
    names = [i[0] if i else "" for i in inputs]
    node = helper.make_node(op, names, ["Y"], **attrs)
    graph = helper.make_graph(
        [node], op.lower(),
        [helper.make_tensor_value_info(n, t, None) for n, t in (i for i in inputs if i)],
        [helper.make_tensor_value_info("Y", I64 if op == "NonMaxSuppression" else F32, None)])
    m = helper.make_model(graph, opset_imports=[helper.make_opsetid("", opset)])
    m.ir_version = 10  # what ONNX Runtime 1.30 (the GPU machine's) reads, opsets up to 22
    return m


def grid_sample_cases(rng):
    cases = []
    legacy = {"linear": "bilinear", "cubic": "bicubic", "nearest": "nearest"}
    k = 0
    for opset in (16, 20, 22):
        for mode in ("linear", "nearest", "cubic"):
            for pad in ("zeros", "border", "reflection"):
                for ac in (0, 1):
                    volumetric = opset >= 20 and mode != "cubic" and k % 3 == 0
                    k += 1
                    spatial = [int(v) for v in rng.choice([1, 2, 5, 7, 12], 3 if volumetric else 2)]
                    out = [int(v) for v in rng.integers(1, 6, len(spatial))]
                    n, c = int(rng.integers(1, 3)), int(rng.choice([1, 3, 5]))
                    reach = 3.5 if pad == "reflection" else 1.5
                    feeds = {
                        "X": rng.uniform(-1, 1, [n, c] + spatial).astype(np.float32),
                        "grid": rng.uniform(-reach, reach, [n] + out + [len(spatial)]).astype(np.float32),
                    }
                    attrs = {"mode": legacy[mode] if opset < 20 else mode, "padding_mode": pad,
                             "align_corners": ac}
                    name = f"gridsample{opset}_{mode}_{pad}_ac{ac}_{len(spatial) + 2}d"
                    m = model("GridSample", [("X", F32), ("grid", F32)], attrs, opset)
                    cases.append((name, m, m, feeds))
    return cases


def roi_align_cases(rng):
    cases = []
    for opset in (10, 16, 22):
        for mode in ("avg", "max"):
            for ctm in ((None,) if opset < 16 else ("half_pixel", "output_half_pixel")):
                for ratio in (0, 1, 2, 3):
                    n, c = int(rng.integers(1, 3)), int(rng.choice([1, 3, 4]))
                    h, w = int(rng.choice([1, 5, 9, 16])), int(rng.choice([1, 6, 11]))
                    scale = float(rng.choice([1.0, 0.5, 0.25, 1 / 3]))
                    r = int(rng.integers(1, 7))
                    # Corners from beyond the map on both sides: rois across the borders and
                    # ones wholly outside (not inverted: onnxruntime's adaptive sampling fails on
                    # those with an integer overflow; test-backend-ops covers them, GPU vs CPU).
                    corners = rng.uniform(-3, max(h, w) + 3, (r, 4)) / scale
                    lo, hi = corners[:, :2], corners[:, 2:]
                    rois = np.concatenate([np.minimum(lo, hi), np.maximum(lo, hi)], 1)
                    attrs = {"mode": mode, "output_height": int(rng.integers(1, 5)),
                             "output_width": int(rng.integers(1, 5)), "sampling_ratio": ratio,
                             "spatial_scale": scale}
                    if ctm:
                        attrs["coordinate_transformation_mode"] = ctm
                    feeds = {"X": rng.uniform(-1, 1, (n, c, h, w)).astype(np.float32),
                             "rois": rois.astype(np.float32),
                             "batch_indices": rng.integers(0, n, r).astype(np.int64)}
                    name = f"roialign{opset}_{mode}_{ctm or 'default'}_r{ratio}"
                    ins = [("X", F32), ("rois", F32), ("batch_indices", I64)]
                    # onnxruntime has no RoiAlign-22 (the same op as 16 with more types): its
                    # reference is the opset-16 model.
                    cases.append((name, model("RoiAlign", ins, attrs, opset),
                                  model("RoiAlign", ins, attrs, min(opset, 16)), feeds))
    return cases


def nms_cases(rng):
    cases = []
    k = 0
    for opset in (10, 11):
        for center in (0, 1):
            for inputs in (2, 3, 4, 5):
                for max_out in ((-1, 0, 3, 100) if inputs >= 3 else (None,)):
                    k += 1
                    b, cl, nb = int(rng.integers(1, 3)), int(rng.integers(1, 4)), int(rng.integers(1, 25))
                    # Boxes clustered so that many overlap; scores on a coarse grid so that ties
                    # occur (broken by index); corners in either order.
                    centers = rng.uniform(0, 4, (b, nb, 2))
                    sizes = rng.uniform(0.2, 2.0, (b, nb, 2))
                    if center:
                        boxes = np.concatenate([centers, sizes], axis=2)
                    else:
                        lo, hi = centers - sizes / 2, centers + sizes / 2
                        boxes = np.stack([lo[..., 1], lo[..., 0], hi[..., 1], hi[..., 0]], axis=2)
                        flip = rng.random((b, nb)) < 0.3
                        boxes[flip] = boxes[flip][:, [2, 3, 0, 1]]
                    feeds = {"boxes": boxes.astype(np.float32),
                             "scores": np.round(rng.uniform(0, 1, (b, cl, nb)) * 8) / 8}
                    feeds["scores"] = feeds["scores"].astype(np.float32)
                    names = [("boxes", F32), ("scores", F32)]
                    if inputs >= 3:
                        names.append(("max_output_boxes_per_class", I64))
                        shape = () if k % 2 else (1,)
                        feeds["max_output_boxes_per_class"] = np.full(shape, max_out, np.int64)
                    if inputs >= 4:
                        names.append(("iou_threshold", F32))
                        feeds["iou_threshold"] = np.array([rng.choice([0.0, 0.3, 0.5, 0.9])], np.float32)
                    if inputs >= 5:
                        names.append(("score_threshold", F32))
                        feeds["score_threshold"] = np.array(rng.choice([0.0, 0.25, 0.5]), np.float32)
                    m = model("NonMaxSuppression", names, {"center_point_box": center}, opset)
                    cases.append((f"nms{opset}_cpb{center}_in{inputs}_max{max_out}", m, m, feeds))
    return cases


def run_kiln(kiln, backend, opt_level, model_path, feeds, tmp):
    out_dir = os.path.join(tmp, "out")
    cmd = [kiln, "run", "--onnx", model_path, "--backend", backend, "--opt-level", str(opt_level),
           "--save-outputs", out_dir]
    if backend == "cuda":  # it builds at a profile: the inputs' own shapes
        cmd += ["--shapes", ",".join(f"{k}:{'x'.join(map(str, v.shape)) or '1'}" for k, v in feeds.items()
                                     if v.ndim > 0)]
    for k, v in feeds.items():
        path = os.path.join(tmp, f"{k}.npy")
        np.save(path, v)
        cmd += ["--input", f"{k}={path}"]
    p = subprocess.run(cmd, capture_output=True, text=True, timeout=300)
    if p.returncode != 0:
        raise RuntimeError(f"kiln run failed ({p.returncode}): {p.stderr.strip()[-400:]}")
    return np.load(os.path.join(out_dir, "Y.npy"))


def compare(got, want):
    if got.shape != want.shape and not (got.size == 0 and want.size == 0):
        return f"shape {got.shape} vs {want.shape}"
    if want.dtype == np.int64:
        return None if np.array_equal(got.reshape(want.shape), want) else f"{got.tolist()} vs {want.tolist()}"
    bad = ~np.isclose(got, want, rtol=1e-5, atol=1e-6, equal_nan=True)
    if bad.any():
        i = int(np.argmax(bad))
        return f"{int(bad.sum())} of {want.size} differ (first at {i}: {got.flat[i]} vs {want.flat[i]})"
    return None


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--kiln", default="build/kiln")
    ap.add_argument("--backend", default="cpu")
    ap.add_argument("--filter", default="", help="only cases whose name matches this regex")
    ap.add_argument("--seed", type=int, default=0)
    args = ap.parse_args()
    if ort is None:
        print("sampling op tests: onnxruntime is not installed (scripts/setup.sh installs it)")
        return 1
    ort.set_default_logger_severity(3)  # RoiAlign's max mode warns on every session
    rng = np.random.default_rng(args.seed)
    cases = grid_sample_cases(rng) + roi_align_cases(rng) + nms_cases(rng)
    cases = [c for c in cases if re.search(args.filter, c[0])]
    failures = 0
    with tempfile.TemporaryDirectory() as tmp:
        for name, m, ref, feeds in cases:
            path = os.path.join(tmp, "model.onnx")
            onnx.save(m, path)
            sess = ort.InferenceSession(ref.SerializeToString(), providers=["CPUExecutionProvider"])
            want = sess.run(None, feeds)[0]
            for opt_level in (0, 2):
                label = f"{name} -O{opt_level}"
                try:
                    why = compare(run_kiln(args.kiln, args.backend, opt_level, path, feeds, tmp), want)
                except RuntimeError as e:
                    why = str(e)
                failures += why is not None
                if why:
                    print(f"FAIL {label}: {why}")
    print(f"sampling op tests ({args.backend}): {len(cases)} cases at -O0 and -O2, "
          f"{'all agree with ONNX Runtime' if failures == 0 else f'{failures} FAILED'}")
    return 1 if failures else 0


if __name__ == "__main__":
    sys.exit(main())
