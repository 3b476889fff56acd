#!/usr/bin/env python3
"""The GPU build step of the ONNX conformance tests, on a machine without a GPU.

Every conformance test the CPU backend passes (the --expect list) must also build for the cuda
backend: each of its layers needs a GPU tactic, every value a layer reads on the host must be
computable there, and shapes must be known when the inputs are set. kiln_lower_check runs that
build step (lowering, tuning off) with no GPU, so CI catches a GPU build regression; the numbers
the GPU computes are checked by the GPU conformance run (bench/device_check.sh conformance).

  scripts/gpu_lower_check.py --lower-check build/tests/cuda/kiln_lower_check \\
      [--data DIR] [--suites node,...] --expect tests/conformance/expected_pass.txt

A test that builds only with kernels not yet run on a GPU (gated: KILN_UNVERIFIED_TACTICS=1,
docs/architecture.md) is checked again with the gate open and listed apart: it is not a failure
while it builds that way, since the GPU session that verifies those kernels opens the gate.

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
    failed = check(args, present)
    if failed is None:
        return 1
    # Failures for want of a gated kernel: again with the gate open.
    gate = "KILN_UNVERIFIED_TACTICS=1 enables it"
    gated_tests = [(t, m) for (t, m), why in zip(present, failed) if why and gate in why]
    gated = check(args, gated_tests, {"KILN_UNVERIFIED_TACTICS": "1"}) if gated_tests else []
    if gated is None:
        return 1
    for (t, m), why in zip(gated_tests, gated):
        failed[present.index((t, m))] = why
    builds_gated = [t for (t, _), why in zip(gated_tests, gated) if why is None]
    failures = [(t, why) for (t, _), why in zip(present, failed) if why and t not in builds_gated]
    print(f"GPU build step: {len(present) - len(failures)} of {len(present)} CPU-passing tests build "
          f"for the cuda backend ({args.flags}), {len(builds_gated)} of them only with gated kernels "
          f"(KILN_UNVERIFIED_TACTICS=1); {len(missing)} not in this data")
    for t in builds_gated:
        print(f"  builds only with gated kernels: {t}")
    for t, why in failures:
        print(f"  does not build on the GPU: {t}: {why}")
    return 1 if failures else 0


def check(args, tests, env_extra=None):
    """kiln_lower_check over (test, model) pairs: None per test that builds, else the reason;
    None instead of the list when the checker itself fails."""
    env = dict(os.environ, **(env_extra or {}))
    if not env_extra:
        env.pop("KILN_UNVERIFIED_TACTICS", None)  # the default build: gated kernels stay out
    result = []
    for i in range(0, len(tests), 200):  # a crash names its chunk, not the whole run
        chunk = tests[i:i + 200]
        p = subprocess.run([args.lower_check, *args.flags.split(), *[m for _, m in chunk]],
                           capture_output=True, text=True, env=env)
        if p.returncode != 0:
            print(f"kiln_lower_check failed (status {p.returncode}) on tests {chunk[0][0]} .. "
                  f"{chunk[-1][0]}: {p.stderr.strip()[-500:]}")
            return None
        by_model = {}
        for line in p.stdout.splitlines():
            parts = line.split("\t")
            by_model[parts[1]] = parts
        for t, m in chunk:
            r = by_model.get(m)
            if not r:
                result.append("no result")
            elif r[0] != "ok":
                result.append(r[2] if len(r) > 2 else "?")
            else:
                result.append(None)
    return result


if __name__ == "__main__":
    sys.exit(main())
