#!/usr/bin/env python3
"""PyTorch eager and torch.compile(mode="reduce-overhead") on the shapes of a kiln batch sweep,
written as kiln.bench/1 records (docs/report.md) for `kiln report`. The timing is
bench/bench_cnn.py's torch_rows (imported, not copied).

  bench/suite_torch.py MODEL PRECISION BATCHES OUT.json [--iters N] [--no-compile]
                       [--compile-batches 1,32,256]

torch.compile(mode="reduce-overhead") compiles and captures anew for every shape (10-20 s each),
so it runs at --compile-batches only (default: all of BATCHES); eager runs at every batch.
"""
import argparse
import json
import os
import sys

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from bench_cnn import torch_rows  # noqa: E402


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("model")
    ap.add_argument("precision")
    ap.add_argument("batches")
    ap.add_argument("out")
    ap.add_argument("--iters", type=int, default=50)
    ap.add_argument("--no-compile", action="store_true")
    ap.add_argument("--compile-batches", default="")
    args = ap.parse_args()
    import torch
    recs = []
    batches = [int(x) for x in args.batches.split(",")]
    compile_at = set(int(x) for x in args.compile_batches.split(",")) if args.compile_batches else set(batches)
    for b in batches:
        rows = torch_rows(args.model, args.precision, b, args, not args.no_compile and b in compile_at)
        for kind, r in rows.items():
            recs.append({"framework": "pytorch-eager" if kind == "eager" else "torch.compile",
                         "model": args.model, "precision": args.precision, "batch": b,
                         "latency_ms": {"median": r["median_ms"]}, "throughput_per_s": r["images_per_s"],
                         "first_calls_s": r["first_calls_s"], "gpu": torch.cuda.get_device_name(0),
                         "torch": torch.__version__, "command": " ".join(sys.argv)})
        print(f"{args.model} {args.precision} b{b}: " + ", ".join(f"{k} {v['median_ms']:.3f} ms" for k, v in rows.items()),
              flush=True)
    with open(args.out, "w") as f:
        json.dump({"schema": "kiln.bench/1", "records": recs}, f, indent=1)
    return 0


if __name__ == "__main__":
    sys.exit(main())
