"""`kiln serve`'s request decoding refuses every malformed body that tests/fuzz/fuzz_serving.py
found raising something else (a 500): each input in tests/fuzz/regressions/serving/ must be
refused with a 4xx. In a subprocess: kserve and tritonclient.grpc (test_serve.py) register the
same protobuf messages and cannot share one process."""
import glob
import importlib.util
import os
import subprocess
import sys

import pytest

ROOT = os.path.abspath(os.path.join(os.path.dirname(__file__), "..", ".."))
if importlib.util.find_spec("kserve") is None:
    pytest.skip("kserve is not installed (scripts/setup.sh installs it)", allow_module_level=True)


def test_fuzz_findings_are_refused_with_a_4xx():
    inputs = sorted(glob.glob(os.path.join(ROOT, "tests", "fuzz", "regressions", "serving", "*")))
    assert inputs
    env = dict(os.environ)
    pkg = os.environ.get("KILN_PYTHON_DIR", os.path.join(ROOT, "build", "python"))
    env["PYTHONPATH"] = os.pathsep.join(p for p in [pkg, env.get("PYTHONPATH", "")] if p)
    r = subprocess.run([sys.executable, os.path.join(ROOT, "tests", "fuzz", "fuzz_serving.py"),
                        "--expect-refused", *inputs], env=env, capture_output=True, text=True,
                       timeout=300)
    assert r.returncode == 0, r.stdout + r.stderr
    assert f"{len(inputs)} of {len(inputs)} inputs refused" in r.stdout
