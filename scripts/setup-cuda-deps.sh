#!/usr/bin/env bash
# Optional dependencies of the CUDA backend (idempotent, non-interactive).
#  - CUTLASS headers (header-only) from PyPI's nvidia-cutlass, for the Hopper INT8 conv tactic.
#    CMake finds them through `python3` (importlib) or -DKILN_CUTLASS_DIR=<dir with cutlass/>.
#  - cuDNN's frontend headers from PyPI's nvidia-cudnn-frontend, for mha.cudnn (fused attention):
#    site-packages/include, or -DKILN_CUDNN_FRONTEND_DIR=<dir with cudnn_frontend.h>.
# cuDNN 9 and cuBLASLt come with the CUDA toolkit image (/usr/local/cuda) and are not installed
# here. Without CUTLASS the build still works: the CUTLASS tactic is simply left out.
set -euo pipefail
PY=${PYTHON:-python3}
CUTLASS_VERSION=${KILN_CUTLASS_VERSION:-4.2.0.0}
have=$("$PY" -c "import importlib.metadata as m; print(m.version('nvidia-cutlass'))" 2>/dev/null || true)
if [ "$have" != "$CUTLASS_VERSION" ]; then
  # --no-deps: only the headers are needed, not the Python generator's dependencies.
  "$PY" -m pip install --quiet --no-deps --disable-pip-version-check \
    "nvidia-cutlass==$CUTLASS_VERSION"
fi
# cuDNN's frontend (header-only C++, PyPI's nvidia-cudnn-frontend) for the fused-attention
# tactic mha.cudnn; --no-deps: the headers it puts in site-packages/include are what CMake reads.
CUDNN_FE_VERSION=${KILN_CUDNN_FRONTEND_VERSION:-1.32.0}
have=$("$PY" -c "import importlib.metadata as m; print(m.version('nvidia-cudnn-frontend'))" 2>/dev/null || true)
if [ "$have" != "$CUDNN_FE_VERSION" ]; then
  "$PY" -m pip install --quiet --no-deps --disable-pip-version-check \
    "nvidia-cudnn-frontend==$CUDNN_FE_VERSION"
fi
"$PY" - <<'PY'
import importlib.util, os
spec = importlib.util.find_spec("cutlass_library")
inc = os.path.join(spec.submodule_search_locations[0], "source", "include")
assert os.path.exists(os.path.join(inc, "cutlass", "cutlass.h")), inc
print("CUTLASS headers:", inc)
import sysconfig
fe = os.path.join(sysconfig.get_paths()["purelib"], "include")
assert os.path.exists(os.path.join(fe, "cudnn_frontend.h")), fe
print("cuDNN frontend headers:", fe)
PY
