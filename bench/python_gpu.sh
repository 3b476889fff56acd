#!/usr/bin/env bash
# The Python package on the GPU machine (Python 3.12 there; an extension built elsewhere for
# another Python does not load): builds kiln's extension against the carried kiln build, runs the
# GPU cases of tests/python, and measures docs/perf.md's Python numbers on ResNet-50 FP16:
# ctx.run on PyTorch CUDA tensors against `kiln bench` at batch 1 and 32. (kiln serve under
# load on the GPU is bench/serve_gpu.sh's, with Triton's clients carried as wheels.)
# Logs and JSON under $OUT.
#
# Here, before the call:  KILN_DEPS_LEAN=1 KILN_DEPS_PYTHON=1 bench/prepare_deps.sh
#   (the CLI, and kiln as a shared library: libkiln.so, the fmt headers; it prints the size)
# The call:  run(command="bench/python_gpu.sh", carry=[".deps"])
set -uo pipefail
. "$(dirname "$0")/device_env.sh" "${OUT:-/tmp/kiln-python-gpu}"
LOG=$OUT/python_gpu.log
exec > >(tee -a "$LOG") 2>&1
nvidia-smi --query-gpu=name,driver_version,clocks.sm,clocks.max.sm --format=csv,noheader
python3 --version
if [ ! -e .deps/libkiln.so ]; then
  echo "python_gpu: .deps/libkiln.so is missing: the extension links kiln as a shared library" \
       "(bench/prepare_deps.sh with KILN_DEPS_PYTHON=1 packs it from a build where kiln is shared)"
  exit 1
fi

echo "== build the extension for $(python3 -c 'import sys; print(sys.version.split()[0])')"
cmake -S python -B /tmp/kiln-py -G Ninja -DCMAKE_BUILD_TYPE=Release \
  -DKILN_LIBRARY="$PWD/.deps/libkiln.so" -DKILN_INCLUDE_DIRS="$PWD/include;$PWD/.deps/include" \
  -DKILN_LINK_LIBRARIES="$PWD/.deps/libfmt.so.9" -DKILN_WITH_CUDA=ON \
  -Dnanobind_DIR="$(python3 -m nanobind --cmake_dir)" >"$OUT/extension_build.log" 2>&1 &&
  cmake --build /tmp/kiln-py >>"$OUT/extension_build.log" 2>&1 ||
  { tail -30 "$OUT/extension_build.log"; exit 1; }
export PYTHONPATH=/tmp/kiln-py${PYTHONPATH:+:$PYTHONPATH} KILN_CLI=$KILN

echo "== GPU cases of tests/python"
[ "${KILN_PY_SKIP_TESTS:-0}" = 1 ] ||
python3 -m pytest -q -rs -p no:cacheprovider tests/python/test_engine.py tests/python/test_errors.py \
  tests/python/test_tools.py --tb=short 2>&1 | tail -40

echo "== ResNet-50 FP16, dynamic batch 1..32"
[ -f models/resnet50.onnx ] || python3 scripts/export_resnet50.py models/resnet50.onnx
"$KILN" build --onnx models/resnet50.onnx --fp16 --save-engine models/resnet50_fp16_py.kiln \
  --min-shapes input:1x3x224x224 --opt-shapes input:32x3x224x224 --max-shapes input:32x3x224x224 \
  --timing-cache models/timing.cache | tail -3
# KILN_PY_NUMBERS_ARGS: more python_numbers.py flags (--breakdown); KILN_PY_SKIP_TESTS=1 skips pytest above.
python3 bench/python_numbers.py --engine models/resnet50_fp16_py.kiln --batch 1,32 \
  --json "$OUT/python_numbers.json" ${KILN_PY_NUMBERS_ARGS:-}
