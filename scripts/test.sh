#!/usr/bin/env bash
# Installs what is needed, builds, and runs every test: unit tests (ctest; GPU tests skip
# without a GPU), model-level tests, the C++ examples built against the installed SDK, the
# ONNX conformance suite (fails on any regression), and README's `pip install .` and
# `pip install '.[serve]'` in a fresh virtual environment, made from this build tree
# (scripts/check_install.sh: it fails if pip compiles anything again).
set -euo pipefail
cd "$(dirname "$0")/.."
# Each stage's header, and the time the one before it took (CI must stay under 60 minutes).
stage_name="" stage_start=$SECONDS
stage() {
  [ -z "$stage_name" ] || echo "test.sh: $stage_name: $((SECONDS - stage_start)) s (total $SECONDS s)"
  stage_name=${1:-} stage_start=$SECONDS
  [ -z "$stage_name" ] || echo "== $stage_name =="
}
stage "setup (Debian and PyPI packages)"
scripts/setup.sh
stage "build"
# Without a GPU nothing runs the device code: ptxas assembles it at -O0 (CMakeLists.txt's
# KILN_CUDA_PTXAS_OPT; every kernel still compiles, assembles and links, in much less time). With
# one, the kernels are built as scripts/build.sh builds them.
if command -v nvidia-smi >/dev/null 2>&1 && nvidia-smi >/dev/null 2>&1; then
  export KILN_CMAKE_ARGS="${KILN_CMAKE_ARGS:-} -DKILN_CUDA_PTXAS_OPT="
else
  export KILN_CMAKE_ARGS="${KILN_CMAKE_ARGS:-} -DKILN_CUDA_PTXAS_OPT=0"
fi
scripts/build.sh
BUILD_DIR=${KILN_BUILD_DIR:-build}

# The sanitizer build (clang, ASan+UBSan, the libFuzzer harnesses: scripts/fuzz.sh) runs in the
# background at low priority while the tests below run; its tests and the fuzzers run last.
# KILN_SKIP_FUZZ=1 leaves it out.
FUZZ_BUILD_PID=
if [ "${KILN_SKIP_FUZZ:-0}" != 1 ]; then
  setsid nice -n 10 scripts/fuzz.sh --build-only >"$BUILD_DIR/fuzz-build.log" 2>&1 &
  FUZZ_BUILD_PID=$!
  trap '[ -z "$FUZZ_BUILD_PID" ] || kill -- -"$FUZZ_BUILD_PID" 2>/dev/null || true' EXIT
fi

stage "conformance (ONNX backend test data through kiln run), --opt-level 0"
python3 scripts/conformance.py --kiln "$BUILD_DIR/kiln" --opt-level 0 --expect tests/conformance/expected_pass.txt \
  --json "$BUILD_DIR/conformance_O0.json"
stage "conformance, --opt-level 2 (must match -O0 test for test)"
python3 scripts/conformance.py --kiln "$BUILD_DIR/kiln" --opt-level 2 --expect tests/conformance/expected_pass.txt \
  --json "$BUILD_DIR/conformance.json" --same-as "$BUILD_DIR/conformance_O0.json"

stage "conformance on the node tests of the installed onnx package (generated into $BUILD_DIR)"
python3 scripts/gen_op_versions.py --check
python3 scripts/gen_onnx_node_tests.py "$BUILD_DIR/onnx-node-tests"
python3 scripts/conformance.py --kiln "$BUILD_DIR/kiln" --opt-level 0 --data "$BUILD_DIR/onnx-node-tests" \
  --suites node --expect tests/conformance/expected_pass_onnx_current.txt --json "$BUILD_DIR/conformance_onnx_O0.json"
python3 scripts/conformance.py --kiln "$BUILD_DIR/kiln" --opt-level 2 --data "$BUILD_DIR/onnx-node-tests" \
  --suites node --expect tests/conformance/expected_pass_onnx_current.txt --json "$BUILD_DIR/conformance_onnx.json" \
  --same-as "$BUILD_DIR/conformance_onnx_O0.json"

if [ -x "$BUILD_DIR/tests/cuda/kiln_lower_check" ]; then
  stage "GPU build step of the conformance tests (no GPU needed): every CPU-passing test builds for cuda"
  python3 scripts/gpu_lower_check.py --lower-check "$BUILD_DIR/tests/cuda/kiln_lower_check" \
    --expect tests/conformance/expected_pass.txt
  python3 scripts/gpu_lower_check.py --lower-check "$BUILD_DIR/tests/cuda/kiln_lower_check" \
    --data "$BUILD_DIR/onnx-node-tests" --suites node --expect tests/conformance/expected_pass_onnx_current.txt
fi

stage "model tests (kiln vs ONNX Runtime)"
python3 tests/models/run_model_tests.py --kiln "$BUILD_DIR/kiln"
python3 tests/models/run_rnn_tests.py --kiln "$BUILD_DIR/kiln"   # LSTM/GRU/RNN graphs (onnx.helper)
python3 tests/models/run_sampling_ops_tests.py --kiln "$BUILD_DIR/kiln"   # GridSample, RoiAlign, NMS
python3 tests/models/run_int8_tests.py --kiln "$BUILD_DIR/kiln"
python3 tests/models/run_ort_quant_tests.py --kiln "$BUILD_DIR/kiln"   # ONNX Runtime quantizer output: QOperator, dynamic
python3 tests/models/run_transformer_tests.py --kiln "$BUILD_DIR/kiln"
python3 tests/models/run_control_flow_tests.py --kiln "$BUILD_DIR/kiln"   # If, Loop, Scan
python3 tests/models/run_keras_tests.py --kiln "$BUILD_DIR/kiln"   # tf2onnx conversions of Keras models
python3 tests/models/run_task_checks_tests.py   # the detections rule (scripts/models/task_checks.py)
python3 tests/models/run_task_tests.py --kiln "$BUILD_DIR/kiln"    # detection, RNN, SD 1.5 (tests/models/tasks)

stage "CLI tests (bad input gives one line and exit status 1)"
python3 tests/cli/run_cli_tests.py --kiln "$BUILD_DIR/kiln"
python3 tests/cli/run_compare_tests.py --kiln "$BUILD_DIR/kiln"   # images, compare, report
python3 tests/cli/run_perf_tests.py --kiln "$BUILD_DIR/kiln"   # kiln perf against kiln serve (localhost)

stage "C++ SDK: cmake --install into $BUILD_DIR/install, examples/ built against it, example tests"
if grep -q '^KILN_SHARED:BOOL=OFF' "$BUILD_DIR/CMakeCache.txt"; then
  echo "note: $BUILD_DIR is built with KILN_SHARED=OFF, which installs no kiln CMake package: examples not tested"
else
  PREFIX=$(cd "$BUILD_DIR" && pwd)/install
  cmake --install "$BUILD_DIR" --prefix "$PREFIX" >/dev/null
  cmake -S examples -B "$BUILD_DIR/examples" -G Ninja -DCMAKE_BUILD_TYPE=Release -DCMAKE_PREFIX_PATH="$PREFIX" >/dev/null
  cmake --build "$BUILD_DIR/examples"
  python3 tests/examples/run_example_tests.py --kiln "$PREFIX/bin/kiln" --examples "$BUILD_DIR/examples"
fi

stage "Python package (pytest; the extension from $BUILD_DIR/python, GPU cases skip without a GPU)"
KILN_PYTHON_DIR="$BUILD_DIR/python" python3 -m pytest -q -p no:cacheprovider tests/python

stage "unit tests"
if ! command -v nvidia-smi >/dev/null 2>&1 || ! nvidia-smi >/dev/null 2>&1; then
  echo "note: no GPU on this machine: tests labelled 'gpu' skip (they say so below)"
fi
(cd "$BUILD_DIR" && ctest --output-on-failure -j "$(nproc)")

stage "install: pip install . and pip install '.[serve]' as README.md writes them (fresh venv, reusing $BUILD_DIR)"
scripts/check_install.sh "$BUILD_DIR"

if [ -n "$FUZZ_BUILD_PID" ]; then
  stage "sanitizers and fuzzing (scripts/fuzz.sh): CPU unit tests under ASan+UBSan, each fuzz harness 60 s"
  if ! wait "$FUZZ_BUILD_PID"; then
    tail -40 "$BUILD_DIR/fuzz-build.log"
    echo "the sanitizer build failed (log: $BUILD_DIR/fuzz-build.log)" >&2
    exit 1
  fi
  FUZZ_BUILD_PID=
  grep '^fuzz.sh: .* took' "$BUILD_DIR/fuzz-build.log"
  scripts/fuzz.sh --no-build
fi
stage
