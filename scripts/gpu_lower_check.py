#!/usr/bin/env python3
"""The GPU build step of the ONNX conformance tests, on a machine without a GPU.

Every conformance test the CPU backend passes (the --expect list) must also build for the cuda
backend: each of its layers needs a GPU tactic, every value a layer reads on the host must be
computable there, and shapes must be known when the inputs are set. kiln_lower_check runs that
build step (lowering, tuning off) with no GPU, so CI catches a GPU build regression; the numbers
the GPU computes are checked by the GPU conformance run (bench/device_check.sh conformance).

  scripts/gpu_lower_check.py --lower-check build/tests/cuda/kiln_lower_check \\
      [--data DIR] [--suites node,...] --expect tests/conformance/expected_pass.txt

Exit status 1 when an expected test does not build for the GPU, or the checker crashes.
"""
import argparse
import os
import subprocess
import sys

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from conformance import SUITES, find_data_root  # noqa: E402


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--lower-check", required=True, help="the kiln_lower_check program")
    ap.add_argument("--data", default="", help="ONNX backend test data root")
    ap.add_argument("--suites", default=",".join(SUITES))
    ap.add_argument("--expect", required=True, help="tests the CPU backend passes")
    ap.add_argument("--flags", default="--no-tf32", help="build flags (as the GPU conformance run)")
    args = ap.parse_args()
    root = find_data_root(args.data)
    if not os.access(args.lower_check, os.X_OK):
        sys.exit(f"gpu_lower_check: {args.lower_check} is not a program (build with CUDA: "
                 "build/tests/cuda/kiln_lower_check)")
    if not os.path.isfile(args.expect):
        sys.exit(f"gpu_lower_check: --expect {args.expect}: no such file")
    expected = []
    with open(args.expect) as f:
        for line in f:
            line = line.strip()
            if line and not line.startswith("#") and line.split("/")[0] in args.suites.split(","):
                expected.append(line)
    models = [os.path.join(root, t, "model.onnx") for t in expected]
    missing = [t for t, m in zip(expected, models) if not os.path.exists(m)]
    present = [(t, m) for t, m in zip(expected, models) if os.path.exists(m)]
    failed = []
    for i in range(0, len(present), 200):  # a crash names its chunk, not the whole run
        chunk = present[i:i + 200]
        p = subprocess.run([args.lower_check, *args.flags.split(), *[m for _, m in chunk]],
                           capture_output=True, text=True)
        if p.returncode != 0:
            print(f"kiln_lower_check failed (status {p.returncode}) on tests {chunk[0][0]} .. "
                  f"{chunk[-1][0]}: {p.stderr.strip()[-500:]}")
            return 1
        by_model = {}
        for line in p.stdout.splitlines():
            parts = line.split("\t")
            by_model[parts[1]] = parts
        for t, m in chunk:
            r = by_model.get(m)
            if not r:
                failed.append((t, "no result"))
            elif r[0] != "ok":
                failed.append((t, r[2] if len(r) > 2 else "?"))
    print(f"GPU build step: {len(present) - len(failed)} of {len(present)} CPU-passing tests build "
          f"for the cuda backend ({args.flags}); {len(missing)} not in this data")
    for t, why in failed:
        print(f"  does not build on the GPU: {t}: {why}")
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
