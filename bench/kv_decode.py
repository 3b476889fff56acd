#!/usr/bin/env python3
"""A decoder's generation step with its KV cache, kiln against PyTorch on the same GPU.

The model is the Llama-architecture decoder optimum exports for deployment
(`text-generation-with-past`: inputs input_ids, attention_mask, position_ids and
past_key_values.N.key/value [B, 4, past, 64]; outputs logits and present.N.key/value), kept as a
skeleton in tests/models/transformers/bench/ (scripts/export_kv_cache.py --bench) and filled with
random weights here. For each batch, one new token after `--past` cached positions:

  - kiln: an FP16 engine at exactly those shapes with float16 inputs and outputs (the cache stays
    float16 from step to step, as a serving loop keeps it), timed by `kiln bench --use-cuda-graph
    --no-data-transfers` (median);
  - PyTorch FP16 (transformers' LlamaForCausalLM of the same configuration, BENCH_LLAMA): eager
    with a DynamicCache (the step's new position cropped off again after each timed call);
    `torch.compile(mode="reduce-overhead")` of the step with a StaticCache of past + 1
    positions, as transformers documents for fast generation; and the eager step with that
    StaticCache captured as a CUDA graph (no host work per step); each in a process of its own,
    a failure reported (CUDA events, median).

With --accuracy, batch 1's logits of a strict FP32 and an FP16 engine (float32 inputs) against
ONNX Runtime's CPU float32 output on the same random cache (relative L2).

  python3 bench/kv_decode.py --kiln build/kiln --out OUT [--batches 1,32] [--past 127]
"""
import argparse
import glob
import json
import os
import re
import subprocess
import sys
import time

import numpy as np

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, os.path.join(HERE, "..", "scripts"))
import transformer_export as tx  # noqa: E402
from export_kv_cache import BENCH_LLAMA  # noqa: E402


def shapes(batch, past, heads, head_size, layers):
    s = [f"input_ids:{batch}x1", f"attention_mask:{batch}x{past + 1}", f"position_ids:{batch}x1"]
    for i in range(layers):
        for kv in ("key", "value"):
            s.append(f"past_key_values.{i}.{kv}:{batch}x{heads}x{past}x{head_size}")
    return ",".join(s)


def run(cmd, timeout=900):
    p = subprocess.run(cmd, capture_output=True, text=True, timeout=timeout)
    if p.returncode != 0:
        raise RuntimeError(f"{' '.join(cmd[:3])}: {(p.stderr or p.stdout).strip()[-400:]}")
    return p.stdout


def kiln_step(kiln, onnx_path, out, batch, past, iters):
    """kiln's decode step at this batch: median ms, build seconds, kernel layers."""
    engine = os.path.join(out, f"kv_b{batch}.kiln")
    hk, d = BENCH_LLAMA["num_key_value_heads"], BENCH_LLAMA["hidden_size"] // BENCH_LLAMA["num_attention_heads"]
    t0 = time.time()
    run([kiln, "build", "--onnx", onnx_path, "--save-engine", engine, "--fp16", "--shapes",
         shapes(batch, past, hk, d, BENCH_LLAMA["num_hidden_layers"]), "--input-io-formats", "fp16",
         "--output-io-formats", "fp16"])
    build_s = time.time() - t0
    text = run([kiln, "bench", "--engine", engine, "--use-cuda-graph", "--no-data-transfers",
                "--iterations", str(iters), "--warmup", "30"])
    m = re.search(r"latency .*median ([0-9.]+)", text)
    j = json.loads(run([kiln, "inspect", engine, "--json"]))
    attn = sorted({l.get("type", "") for l in j["layers"] if "Attention" in l.get("type", "")})
    return float(m.group(1)), build_s, f"{j.get('kernel_layers')} of {len(j['layers'])}", attn


def accuracy(kiln, onnx_path, out, past):
    """Batch 1's logits: an FP16 engine (float32 I/O) against ONNX Runtime, relative L2."""
    import onnxruntime as ort
    hk, d = BENCH_LLAMA["num_key_value_heads"], BENCH_LLAMA["hidden_size"] // BENCH_LLAMA["num_attention_heads"]
    rng = np.random.default_rng(0)
    feeds = {"input_ids": rng.integers(0, BENCH_LLAMA["vocab_size"], (1, 1)).astype(np.int64),
             "attention_mask": np.ones((1, past + 1), np.int64),
             "position_ids": np.array([[past]], np.int64)}
    for i in range(BENCH_LLAMA["num_hidden_layers"]):
        for kv in ("key", "value"):
            feeds[f"past_key_values.{i}.{kv}"] = rng.standard_normal((1, hk, past, d)).astype(np.float32)
    so = ort.SessionOptions()
    so.log_severity_level = 3
    ref = ort.InferenceSession(onnx_path, so, providers=["CPUExecutionProvider"]).run(["logits"], feeds)[0]
    errs = {}
    for prec, flag in (("strict FP32", "--no-tf32"), ("FP16", "--fp16")):
        engine = os.path.join(out, "kv_acc.kiln")
        run([kiln, "build", "--onnx", onnx_path, "--save-engine", engine, flag, "--shapes",
             shapes(1, past, hk, d, BENCH_LLAMA["num_hidden_layers"])])
        cmd = [kiln, "run", "--engine", engine, "--save-outputs", os.path.join(out, "acc")]
        for k, v in feeds.items():
            path = os.path.join(out, f"acc_{k}.npy")
            np.save(path, v)
            cmd += ["--input", f"{k}={path}"]
        run(cmd)
        got = np.load(os.path.join(out, "acc", "logits.npy")).astype(np.float64)
        errs["kiln " + prec] = float(np.linalg.norm(got - ref) / np.linalg.norm(ref))
    return errs


def torch_step(batch, past, iters, mode):
    """PyTorch FP16's decode step, median ms: `eager` with a DynamicCache (the new position
    cropped off again after each call); `compile`, torch.compile(mode="reduce-overhead") of the
    step with a StaticCache; `graph`, the eager step with a StaticCache replayed as a CUDA graph."""
    import torch
    from transformers import DynamicCache, LlamaConfig, LlamaForCausalLM
    torch.manual_seed(0)
    m = LlamaForCausalLM(LlamaConfig(**BENCH_LLAMA)).half().cuda().eval()
    ids = torch.randint(0, BENCH_LLAMA["vocab_size"], (batch, past), device="cuda")
    tok = torch.randint(0, BENCH_LLAMA["vocab_size"], (batch, 1), device="cuda")

    def median(step, after=None):
        times = []
        for i in range(iters + 30):
            s, e = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
            s.record()
            step()
            e.record()
            torch.cuda.synchronize()
            if after:
                after()
            if i >= 30:
                times.append(s.elapsed_time(e))
        return float(np.median(times))

    with torch.no_grad():
        if mode == "eager":
            cache = DynamicCache()
            m(input_ids=ids, past_key_values=cache, use_cache=True)
            return median(lambda: m(input_ids=tok, past_key_values=cache, use_cache=True),
                          lambda: cache.crop(-1))
        from transformers import StaticCache
        try:
            sc = StaticCache(config=m.config, max_cache_len=past + 1)
        except TypeError:  # older transformers
            sc = StaticCache(config=m.config, max_batch_size=batch, max_cache_len=past + 1,
                             device="cuda", dtype=torch.float16)
        m(input_ids=ids, past_key_values=sc, cache_position=torch.arange(past, device="cuda"), use_cache=True)
        pos = torch.tensor([past], device="cuda")
        step = lambda: m(input_ids=tok, past_key_values=sc, cache_position=pos, use_cache=True).logits  # noqa: E731
        if mode == "compile":
            return median(torch.compile(step, mode="reduce-overhead", fullgraph=True))
        side = torch.cuda.Stream()
        side.wait_stream(torch.cuda.current_stream())
        with torch.cuda.stream(side):
            for _ in range(3):
                step()
        torch.cuda.current_stream().wait_stream(side)
        g = torch.cuda.CUDAGraph()
        with torch.cuda.graph(g):
            step()
        return median(g.replay)


def torch_fp16_error(past):
    """PyTorch's own FP16 error on the same kind of step: batch 1's logits of its FP16 model
    against its float32 one (no TF32), one new token after a random N(0, 1) cache."""
    import copy
    import torch
    from transformers import DynamicCache, LlamaConfig, LlamaForCausalLM
    torch.backends.cuda.matmul.allow_tf32 = False
    torch.manual_seed(0)
    m32 = LlamaForCausalLM(LlamaConfig(**BENCH_LLAMA)).cuda().eval()
    m16 = copy.deepcopy(m32).half()
    hk, d = BENCH_LLAMA["num_key_value_heads"], BENCH_LLAMA["hidden_size"] // BENCH_LLAMA["num_attention_heads"]
    g = torch.Generator().manual_seed(0)
    kv = [(torch.randn(1, hk, past, d, generator=g), torch.randn(1, hk, past, d, generator=g))
          for _ in range(BENCH_LLAMA["num_hidden_layers"])]
    tok = torch.randint(0, BENCH_LLAMA["vocab_size"], (1, 1), generator=g).cuda()

    def logits(m, dtype):
        c = DynamicCache()
        for i, (k, v) in enumerate(kv):
            c.update(k.to("cuda", dtype), v.to("cuda", dtype), i)
        with torch.no_grad():
            return m(input_ids=tok, attention_mask=torch.ones(1, past + 1, dtype=torch.int64, device="cuda"),
                     position_ids=torch.tensor([[past]], device="cuda"), past_key_values=c).logits.double()

    ref, got = logits(m32, torch.float32), logits(m16, torch.float16)
    return float(torch.linalg.norm(got - ref) / torch.linalg.norm(ref))


def torch_in_subprocess(batch, past, mode):
    """torch_step (batch 0: torch_fp16_error) in a process of its own (a failed step can leave
    CUDA unusable): its number, or why it failed."""
    cmd = [sys.executable, os.path.abspath(__file__), "--torch-step", f"{batch},{past},{mode}"]
    p = subprocess.run(cmd, capture_output=True, text=True, timeout=600)
    for line in p.stdout.splitlines():
        if line.startswith("TORCH "):
            return json.loads(line[6:])
    err = [l for l in (p.stderr or p.stdout).strip().splitlines() if "Error" in l or "error" in l]
    return "fails: " + (err[-1][:160] if err else f"exit status {p.returncode}")


def main():
    if len(sys.argv) == 3 and sys.argv[1] == "--torch-step":
        b, past, mode = sys.argv[2].split(",")
        r = torch_fp16_error(int(past)) if b == "0" else torch_step(int(b), int(past), 200, mode)
        print("TORCH " + json.dumps(r), flush=True)
        return 0
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--kiln", default="build/kiln")
    ap.add_argument("--out", default="/tmp/kv_decode")
    ap.add_argument("--model", default="", help="the skeleton (default: tests/models/transformers/bench/kvcache_llama_bench_*.onnx)")
    ap.add_argument("--batches", default="1,32")
    ap.add_argument("--past", type=int, default=127)
    ap.add_argument("--iters", type=int, default=300)
    ap.add_argument("--accuracy", action="store_true")
    ap.add_argument("--no-torch", action="store_true")
    ap.add_argument("--no-compile", action="store_true")
    a = ap.parse_args()
    os.makedirs(a.out, exist_ok=True)
    found = sorted(glob.glob(os.path.join(HERE, "..", "tests", "models", "transformers", "bench",
                                          "kvcache_llama_bench_*.onnx")))
    skeleton = a.model or (found[-1] if found else "")
    if not os.path.isfile(skeleton):
        sys.exit(f"kv_decode.py: no model {skeleton or 'in tests/models/transformers/bench'} "
                 "(scripts/export_kv_cache.py --bench writes it)")
    onnx_path = os.path.join(a.out, "kvcache_llama_bench.onnx")
    tx.materialize(skeleton, onnx_path, seed=1)
    rows = []
    if a.accuracy:
        errs = accuracy(a.kiln, onnx_path, a.out, a.past)
        if not a.no_torch:
            errs["PyTorch FP16 against its float32 (another random model, same kind of step)"] = \
                torch_in_subprocess(0, a.past, "")
        print("batch 1 logits, relative L2 against ONNX Runtime (float32): " +
              ", ".join(f"{k} {v:.2e}" if isinstance(v, float) else f"{k} {v}" for k, v in errs.items()),
              flush=True)
        rows.append({"accuracy_rel_l2": errs})
    batches = [int(x) for x in a.batches.split(",")]
    kiln_rows = {}
    for b in batches:
        kiln_rows[b] = kiln_step(a.kiln, onnx_path, a.out, b, a.past, a.iters)
        print(f"kiln batch {b}: {kiln_rows[b][0]:.3f} ms", flush=True)
    print("| batch | kiln FP16 ms | build s | layers launching kernels | attention | PyTorch FP16 eager ms | "
          "torch.compile ms | eager as a CUDA graph ms | kiln / the faster of the last two |")
    print("|---|---|---|---|---|---|---|---|---|")
    modes = [] if a.no_torch else ["eager"] + ([] if a.no_compile else ["compile"]) + ["graph"]
    for b in batches:
        ms, build_s, kernels, attn = kiln_rows[b]
        t = {mode: torch_in_subprocess(b, a.past, mode) for mode in modes}
        fast = [v for k, v in t.items() if k != "eager" and isinstance(v, float)]
        ratio = f"{min(fast) / ms:.2f}x" if fast else "-"
        fmt = lambda v: f"{v:.3f}" if isinstance(v, float) else (v or "-")  # noqa: E731
        print(f"| {b} | {ms:.3f} | {build_s:.1f} | {kernels} | {', '.join(attn)} | {fmt(t.get('eager'))} | "
              f"{fmt(t.get('compile'))} | {fmt(t.get('graph'))} | {ratio} |", flush=True)
        rows.append({"batch": b, "past": a.past, "kiln_ms": ms, "build_s": build_s, "kernel_layers": kernels,
                     "attention": attn, "torch_ms": t})
    with open(os.path.join(a.out, "kv_decode.json"), "w") as f:
        json.dump(rows, f, indent=1)
    return 0


if __name__ == "__main__":
    sys.exit(main())
