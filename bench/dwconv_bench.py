"""Depthwise convolutions against the memory floor: kiln's tactics for one depthwise layer (every
variant the tuner times), PyTorch's (cuDNN, channels-last FP16, as torch.compile runs it) and the
time to read the layer's input and write its output once at the copy bandwidth measured in the
same run.

Each shape is a one-layer ONNX model (Conv with group = C, bias, M = K x C outputs), built with
`kiln build --fp16 --timing-cache`: the tuner times every candidate tactic and variant of the
layer on NHWC FP16 tensors, and the timing cache keeps each time, so one build gives them all.
The shapes are the depthwise layers of ConvNeXt (7x7), EfficientNet and MobileNet (3x3 and 5x5,
stride 1 and 2) and FastViT (7x7 stride 2, K = 2) at batch 32.

    python3 bench/dwconv_bench.py --kiln build/kiln --out OUT [--batch 32] [--shapes NAME,...]

Writes OUT/dwconv.json and OUT/dwconv.md (the table) and prints the table. Needs a GPU and
PyTorch; onnx to write the models.
"""
import argparse
import json
import os
import statistics
import subprocess
import sys
import time

# name: (C, H, W, kernel, stride, K)
SHAPES = {
    "convnext_s0": (96, 56, 56, 7, 1, 1),
    "convnext_s1": (192, 28, 28, 7, 1, 1),
    "convnext_s2": (384, 14, 14, 7, 1, 1),
    "convnext_s3": (768, 7, 7, 7, 1, 1),
    "effnet_112_k3": (32, 112, 112, 3, 1, 1),
    "effnet_112_k3s2": (96, 112, 112, 3, 2, 1),
    "effnet_56_k5s2": (144, 56, 56, 5, 2, 1),
    "effnet_28_k3": (240, 28, 28, 3, 1, 1),
    "effnet_14_k5": (672, 14, 14, 5, 1, 1),
    "effnet_7_k5": (1152, 7, 7, 5, 1, 1),
    "fastvit_k7s2_x2": (48, 64, 64, 7, 2, 2),
}


def log(msg):
    print(msg, file=sys.stderr, flush=True)


def make_model(path, batch, c, h, w, k, s, mult):
    import numpy as np
    import onnx
    from onnx import TensorProto, helper, numpy_helper
    rng = np.random.default_rng(0)
    m = c * mult
    wt = (rng.standard_normal((m, 1, k, k)) / k).astype(np.float32)
    bias = rng.standard_normal(m).astype(np.float32) * 0.1
    p = k // 2
    node = helper.make_node("Conv", ["x", "w", "b"], ["y"], group=c, kernel_shape=[k, k],
                            strides=[s, s], pads=[p, p, p, p])
    ho, wo = (h + 2 * p - k) // s + 1, (w + 2 * p - k) // s + 1
    g = helper.make_graph([node], "dw", [helper.make_tensor_value_info("x", TensorProto.FLOAT, [batch, c, h, w])],
                          [helper.make_tensor_value_info("y", TensorProto.FLOAT, [batch, m, ho, wo])],
                          [numpy_helper.from_array(wt, "w"), numpy_helper.from_array(bias, "b")])
    onnx.save(helper.make_model(g, opset_imports=[helper.make_opsetid("", 17)]), path)
    return wt, bias, (ho, wo)


def kiln_times(kiln, onnx_path, work, name):
    """{tactic/variant: ms} of the model's Conv layer, from the timing cache of one build."""
    cache = os.path.join(work, f"{name}.timing.json")
    if os.path.exists(cache):
        os.remove(cache)
    cmd = [kiln, "build", "--onnx", onnx_path, "--save-engine", os.path.join(work, f"{name}.kiln"),
           "--fp16", "--timing-cache", cache]
    r = subprocess.run(cmd, capture_output=True, text=True, timeout=600)
    if r.returncode != 0:
        raise RuntimeError(f"kiln build failed: {r.stderr.strip()[-300:]}")
    with open(cache) as f:
        return conv_times(json.load(f)["entries"])


def conv_times(entries):
    """{tactic/variant: fastest ms} of the FP16 Conv entries of a timing cache's entries (keys as
    the tuner writes them: DOMAIN.OP{attrs}(inputs)->outputs|precision|tactic/variant; -1: the
    candidate failed)."""
    out = {}
    for key, ms in entries.items():
        if not key.startswith(".Conv{") or "|fp16|" not in key or ms < 0:
            continue
        tactic = key.rsplit("|", 1)[1].rstrip("/")
        out[tactic] = min(ms, out.get(tactic, ms))
    return out


def torch_time(batch, c, h, w, k, s, mult, wt, bias, reps=20, rounds=50):
    """cuDNN's depthwise convolution as PyTorch runs it (channels-last FP16, benchmark mode):
    median ms of one call over `rounds` replays of a CUDA graph of `reps` calls."""
    import torch
    torch.backends.cudnn.benchmark = True
    x = torch.randn(batch, c, h, w, device="cuda").half().to(memory_format=torch.channels_last)
    wt_t = torch.from_numpy(wt).cuda().half().to(memory_format=torch.channels_last)
    b_t = torch.from_numpy(bias).cuda().half()
    f = lambda: torch.nn.functional.conv2d(x, wt_t, b_t, stride=s, padding=k // 2, groups=c)
    for _ in range(3):
        f()
    torch.cuda.synchronize()
    g = torch.cuda.CUDAGraph()
    with torch.cuda.graph(g):
        for _ in range(reps):
            f()
    return graph_median(g, reps, rounds)


def graph_median(g, reps, rounds):
    import torch
    times = []
    for _ in range(rounds):
        a, b = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        a.record()
        g.replay()
        b.record()
        b.synchronize()
        times.append(a.elapsed_time(b) / reps)
    return statistics.median(times)


def copy_bandwidth():
    """Bytes read plus written per second of a 512 MiB device-to-device copy (CUDA graph)."""
    import torch
    n = 256 << 20
    x = torch.empty(n, dtype=torch.float16, device="cuda")
    y = torch.empty_like(x)
    y.copy_(x)
    torch.cuda.synchronize()
    g = torch.cuda.CUDAGraph()
    with torch.cuda.graph(g):
        for _ in range(5):
            y.copy_(x)
    ms = graph_median(g, 5, 20)
    return 2 * n * 2 / (ms * 1e-3)


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--kiln", required=True)
    ap.add_argument("--out", required=True)
    ap.add_argument("--work", default="/tmp/kiln-dwconv")
    ap.add_argument("--batch", type=int, default=32)
    ap.add_argument("--shapes", default=",".join(SHAPES), help="names from: " + ", ".join(SHAPES))
    a = ap.parse_args()
    names = a.shapes.split(",")
    unknown = [n for n in names if n not in SHAPES]
    if unknown:
        sys.exit(f"dwconv_bench: unknown shape '{unknown[0]}' (known: {', '.join(SHAPES)})")
    os.makedirs(a.out, exist_ok=True)
    os.makedirs(a.work, exist_ok=True)
    import torch
    bw = copy_bandwidth()
    log(f"copy bandwidth {bw / 1e12:.2f} TB/s (read + write)")
    rows = []
    for name in names:
        c, h, w, k, s, mult = SHAPES[name]
        t0 = time.time()
        path = os.path.join(a.work, f"{name}.onnx")
        wt, bias, (ho, wo) = make_model(path, a.batch, c, h, w, k, s, mult)
        row = {"shape": name, "input": f"{a.batch}x{c}x{h}x{w}", "kernel": k, "stride": s, "mult": mult}
        try:
            row["kiln"] = kiln_times(a.kiln, path, a.work, name)
        except Exception as e:  # noqa: BLE001 - one failed shape is a row with its error
            row["error"] = str(e)[:300]
            row["kiln"] = {}
        row["torch_ms"] = torch_time(a.batch, c, h, w, k, s, mult, wt, bias)
        nbytes = 2 * a.batch * (c * h * w + c * mult * ho * wo)
        row["floor_ms"] = nbytes / bw * 1e3
        dw = {t: ms for t, ms in row["kiln"].items()}
        if dw:
            best = min(dw, key=dw.get)
            row["best"], row["best_ms"] = best, dw[best]
        log(f"{name}: {time.time() - t0:.1f} s")
        rows.append(row)
    lines = [f"Depthwise convolutions, batch {a.batch}, FP16 NHWC, on {torch.cuda.get_device_name()} "
             f"(copy {bw / 1e12:.2f} TB/s). Times in microseconds; floor: reading the input and "
             "writing the output once.", "",
             "| layer | input | k/s/K | floor | kiln best | tactic | / floor | PyTorch (cuDNN) | kiln variants |",
             "|---|---|---|---|---|---|---|---|---|"]
    for r in rows:
        us = lambda ms: f"{ms * 1e3:.1f}"
        variants = ", ".join(f"{t} {us(ms)}" for t, ms in sorted(r["kiln"].items(), key=lambda kv: kv[1]))
        best = r.get("best_ms")
        lines.append(f"| {r['shape']} | {r['input']} | {r['kernel']}/{r['stride']}/{r['mult']} | "
                     f"{us(r['floor_ms'])} | {us(best) if best else r.get('error', '-')} | {r.get('best', '-')} | "
                     f"{best / r['floor_ms']:.1f}x | {us(r['torch_ms'])} | {variants} |" if best else
                     f"| {r['shape']} | {r['input']} | {r['kernel']}/{r['stride']}/{r['mult']} | "
                     f"{us(r['floor_ms'])} | - | {r.get('error', '-')} | - | {us(r['torch_ms'])} | |")
    text = "\n".join(lines)
    print(text)
    with open(os.path.join(a.out, "dwconv.md"), "w") as f:
        f.write(text + "\n")
    with open(os.path.join(a.out, "dwconv.json"), "w") as f:
        json.dump({"gpu": torch.cuda.get_device_name(), "torch": torch.__version__,
                   "copy_bytes_per_s": bw, "batch": a.batch, "rows": rows}, f, indent=1)


if __name__ == "__main__":
    main()
