#!/usr/bin/env bash
# The C++ examples (examples/classify, examples/batch_csv) on the GPU machine: engines for the
# cuda backend, each example's output checked against `kiln run` and ONNX Runtime by
# tests/examples/run_example_tests.py. Logs under $OUT.
#   here:  scripts/test.sh (or its install + examples steps), then bench/prepare_deps.sh
#   there: bench/examples_gpu.sh   (carry .deps)
set -uo pipefail
. "$(dirname "$0")/device_env.sh" "${OUT:-/tmp/kiln-examples-gpu}"
if [ ! -x .deps/examples/classify/classify ]; then
  echo "examples_gpu: .deps/examples is missing: build examples/ into <build>/examples before bench/prepare_deps.sh"
  exit 1
fi
python3 tests/examples/run_example_tests.py --kiln "$KILN" --examples .deps/examples --backend cuda 2>&1 | tee "$OUT/examples_gpu.log"
