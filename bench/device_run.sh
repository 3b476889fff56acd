#!/usr/bin/env bash
# The kernel study in one command on a GPU machine: environment, (build if needed), the
# convolution bench and the PyTorch baseline, all logs under $OUT (default build-cuda/kernel-study-out).
#   bench/device_run.sh [extra kiln_conv_bench arguments]
# KILN_BUILD_DIR: build tree holding bench/kernels/kiln_conv_bench (default build-cuda); built
# with CMake here when missing. KILN_CUDNN_LIB_DIR: cuDNN to load (default: the one PyTorch's
# wheel ships if present, so both sides of the comparison run the same cuDNN; else the system's).
set -uo pipefail
ROOT=$(cd "$(dirname "$0")/.." && pwd)
OUT=${OUT:-$ROOT/build-cuda/kernel-study-out}  # build*/ is git-ignored
mkdir -p "$OUT"
BUILD=${KILN_BUILD_DIR:-$ROOT/build-cuda}
BIN=$BUILD/bench/kernels/kiln_conv_bench
cd "$ROOT"

{
  date -u
  nvidia-smi --query-gpu=name,driver_version,clocks.sm,clocks.max.sm,power.limit,temperature.gpu \
    --format=csv
  nvcc --version | tail -1
  grep -h "define CUDNN_M" /usr/include/cudnn_version*.h /usr/local/cuda/include/cudnn_version.h \
    2>/dev/null | head -3
} 2>&1 | tee "$OUT/env.txt"

if [ ! -x "$BIN" ]; then
  echo "== building $BIN"
  # The whole project needs protobuf/fmt/CLI11, which a bare GPU image may lack: by default
  # build just the two CUDA folders through a scratch top level (KILN_ROOT_CMAKE=1: the project's).
  if [ "${KILN_ROOT_CMAKE:-0}" = 1 ]; then
    cmake -S "$ROOT" -B "$BUILD" -DCMAKE_BUILD_TYPE=Release -DKILN_CUDA=ON >"$OUT/build.log" 2>&1
  else  # before the top-level CMakeLists.txt exists: a scratch one over the two folders
    mkdir -p /tmp/kiln-cuda-top
    cat >/tmp/kiln-cuda-top/CMakeLists.txt <<CML
cmake_minimum_required(VERSION 3.25)
project(kiln_cuda_study LANGUAGES CXX CUDA)
set(CMAKE_CXX_STANDARD 20)
find_package(CUDAToolkit REQUIRED)
set(CMAKE_CUDA_ARCHITECTURES 90a)
add_subdirectory($ROOT/src/backends/cuda src/backends/cuda)
add_subdirectory($ROOT/bench/kernels bench/kernels)
enable_testing()
add_subdirectory($ROOT/tests/cuda tests/cuda)
CML
    cmake -S /tmp/kiln-cuda-top -B "$BUILD" -DCMAKE_BUILD_TYPE=Release >"$OUT/build.log" 2>&1
  fi
  cmake --build "$BUILD" -j"$(nproc)" --target kiln_conv_bench kiln_cuda_tactics_test \
    >>"$OUT/build.log" 2>&1 ||
    { tail -30 "$OUT/build.log"; exit 1; }
fi

CUDNN_DIR=${KILN_CUDNN_LIB_DIR:-$(python3 -c "import os, nvidia.cudnn as c; print(os.path.join(list(c.__path__)[0], 'lib'))" 2>/dev/null)}
if [ -n "$CUDNN_DIR" ] && [ -e "$CUDNN_DIR/libcudnn.so.9" ]; then
  export LD_LIBRARY_PATH="$CUDNN_DIR${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH}"
  echo "cuDNN from $CUDNN_DIR" | tee -a "$OUT/env.txt"
fi

TEST=$BUILD/tests/cuda/kiln_cuda_tactics_test
if [ -x "$TEST" ]; then
  echo "== GPU unit tests (ctest label gpu)"
  "$TEST" --gtest_brief=1 >"$OUT/tests.log" 2>&1
  echo "tests rc $? ($(grep -cE '^\[  (FAILED|  OK) ' "$OUT/tests.log") results; log tests.log)"
  tail -4 "$OUT/tests.log"
fi

echo "== kiln_conv_bench $*"
"$BIN" --csv "$OUT/conv_bench.csv" "$@" 2>&1 | tee "$OUT/conv_bench.log"
bench_rc=${PIPESTATUS[0]}

echo "== PyTorch baseline"
PYTHONUNBUFFERED=1 timeout 420 python3 "$ROOT/bench/pytorch_resnet50.py" --json "$OUT/pytorch.json" \
  2>&1 | tee "$OUT/pytorch.log"
echo "== done (bench rc $bench_rc)"
exit "$bench_rc"
