#!/usr/bin/env python3
"""PyTorch baseline for the kernel study: torchvision ResNet-50 (random weights), eval, FP16,
channels_last; eager and torch.compile at batch 256 and 1. Prints images/s and latency (median of
CUDA-event timed iterations after warm-up) as a Markdown table; --json writes the numbers too."""
import argparse
import json
import os
import statistics
import sys
import time

import torch
import torchvision


def time_model(fn, x, warmup, iters):
    with torch.inference_mode():
        for _ in range(warmup):
            fn(x)
        torch.cuda.synchronize()
        times = []
        for _ in range(iters):
            start = torch.cuda.Event(enable_timing=True)
            stop = torch.cuda.Event(enable_timing=True)
            start.record()
            fn(x)
            stop.record()
            stop.synchronize()
            times.append(start.elapsed_time(stop))
    return statistics.median(times)


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--batches", default="256,1")
    ap.add_argument("--iters", type=int, default=50)
    ap.add_argument("--warmup", type=int, default=10)
    ap.add_argument("--compile-budget-s", type=float, default=150.0,
                    help="skip further torch.compile variants once this much time went to them")
    ap.add_argument("--json", default="")
    args = ap.parse_args()

    torch.backends.cudnn.benchmark = True
    dev = torch.device("cuda")
    print(f"torch {torch.__version__}, torchvision {torchvision.__version__}, cuDNN "
          f"{torch.backends.cudnn.version()}, {torch.cuda.get_device_name(0)}", flush=True)
    model = torchvision.models.resnet50(weights=None).eval().to(dev)
    model = model.half().to(memory_format=torch.channels_last)

    rows = []
    compile_spent = 0.0
    variants = [("eager", None), ("compile", "default"), ("compile", "max-autotune-no-cudagraphs"),
                ("compile", "reduce-overhead")]
    for batch in [int(b) for b in args.batches.split(",")]:
        x = torch.randn(batch, 3, 224, 224, device=dev, dtype=torch.half)
        x = x.to(memory_format=torch.channels_last)
        for kind, mode in variants:
            if mode == "max-autotune-no-cudagraphs":
                continue  # autotuning compiles for many minutes; listed for completeness
            name = kind if mode is None else f"compile[{mode}]"
            if mode is not None and compile_spent > args.compile_budget_s:
                print(f"  skip {name} at batch {batch}: compile budget spent", flush=True)
                continue
            torch._dynamo.reset()
            fn = model if mode is None else torch.compile(model, mode=mode)
            t0 = time.time()
            try:
                with torch.inference_mode():
                    fn(x)  # compile (or first cuDNN benchmark) outside the timing
                torch.cuda.synchronize()
            except Exception as e:  # report and go on: the kernel bench matters more
                print(f"  {name} batch {batch} failed: {e!r}", flush=True)
                continue
            first = time.time() - t0
            if mode is not None:
                compile_spent += first
            ms = time_model(fn, x, args.warmup, args.iters)
            rows.append({"batch": batch, "variant": name, "ms": ms,
                         "images_per_s": batch * 1000.0 / ms, "first_call_s": first})
            print(f"  batch {batch:4d} {name:28s} {ms:8.3f} ms  {batch * 1000.0 / ms:9.0f} img/s"
                  f"  (first call {first:.1f} s)", flush=True)

    print("\n| batch | PyTorch variant | latency ms | images/s | first call s |")
    print("|---|---|---|---|---|")
    for r in rows:
        print(f"| {r['batch']} | {r['variant']} | {r['ms']:.3f} | {r['images_per_s']:.0f} | "
              f"{r['first_call_s']:.1f} |")
    if args.json:
        with open(args.json, "w") as f:
            json.dump(rows, f, indent=1)
    return 0


if __name__ == "__main__":
    sys.exit(main())
