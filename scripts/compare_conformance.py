#!/usr/bin/env python3
"""Compares two conformance result files (scripts/conformance.py --json): every test that passes
in the reference run (the CPU backend) must pass in the other (the GPU). Prints the counts and
the tests that regress; exit status 1 if any does.

  scripts/compare_conformance.py cpu.json cuda.json
"""
import json
import sys


def load(path):
    with open(path) as f:
        data = json.load(f)
    rows = data["results"] if isinstance(data, dict) and "results" in data else data
    return {f"{r['suite']}/{r['name']}": r for r in rows}


def main():
    ref, got = load(sys.argv[1]), load(sys.argv[2])
    ref_pass = {k for k, r in ref.items() if r["status"] == "pass"}
    got_pass = {k for k, r in got.items() if r["status"] == "pass"}
    # A test either run did not reach (conformance.py --deadline) is neither lost nor kept.
    not_run = {k for k, r in list(ref.items()) + list(got.items()) if r["status"] == "not run"}
    ref_pass -= not_run
    lost = sorted(ref_pass - got_pass)
    crashes = sorted(k for k, r in got.items() if r["status"] == "crash")
    print(f"reference passes {len(ref_pass)}, other passes {len(got_pass)} of {len(got)}; "
          f"{len(ref_pass & got_pass)} of the reference's passes also pass; {len(crashes)} crashes"
          + (f"; {len(not_run)} not run in one or the other (--deadline)" if not_run else ""))
    for k in lost:
        print(f"  regresses: {k}: {got.get(k, {}).get('status')} {got.get(k, {}).get('detail', '')[:240]}")
    for k in crashes:
        print(f"  crash: {k}: {got[k].get('detail', '')[:240]}")
    return 1 if lost or crashes else 0


if __name__ == "__main__":
    sys.exit(main())
