#!/usr/bin/env python3
"""Writes the ONNX node tests of the installed onnx package (from PyPI) to a directory.

The onnx wheel ships its node test cases as Python code, not as data; this script runs them and
writes each one as model.onnx + test_data_set_0/{input,output}_*.pb, the layout of Debian's
libonnx-testdata, so scripts/conformance.py can run them. The data is generated at test time
into the build folder and never committed.

  scripts/gen_onnx_node_tests.py build/onnx-node-tests     # writes build/onnx-node-tests/node/...

A stamp file records the onnx version, so a second call with the same onnx does nothing.
"""
import argparse
import os
import shutil
import sys
import types
import warnings


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("output", help="root folder; the tests go to OUTPUT/node/<test>/")
    ap.add_argument("--force", action="store_true", help="regenerate even when the stamp matches")
    args = ap.parse_args()

    import onnx
    import onnx.backend.test.case.node as node_cases
    from onnx.backend.test import cmd_tools

    stamp = os.path.join(args.output, "onnx-version.txt")
    if not args.force and os.path.exists(stamp) and open(stamp).read().strip() == onnx.__version__:
        print(f"onnx {onnx.__version__} node tests already in {args.output}")
        return 0
    if os.path.isdir(os.path.join(args.output, "node")):
        shutil.rmtree(os.path.join(args.output, "node"))
    # cmd_tools.generate_data writes the model test cases; hand it the node cases instead so the
    # files are written exactly as onnx's own tool writes them.
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        cases = node_cases.collect_testcases()
        fake = types.SimpleNamespace(collect_testcases=lambda: cases)
        real = cmd_tools.model_test
        cmd_tools.model_test = fake
        try:
            cmd_tools.generate_data(argparse.Namespace(output=args.output))
        finally:
            cmd_tools.model_test = real
    with open(stamp, "w") as fh:
        fh.write(onnx.__version__ + "\n")
    print(f"wrote {len(cases)} onnx {onnx.__version__} node tests to {os.path.join(args.output, 'node')}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
