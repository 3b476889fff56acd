#!/usr/bin/env bash
# Configures and builds kiln into build/ (CUDA parts when nvcc is found).
set -euo pipefail
cd "$(dirname "$0")/.."
BUILD_DIR=${KILN_BUILD_DIR:-build}
JOBS=${KILN_JOBS:-$(nproc)}
cmake -S . -B "$BUILD_DIR" -G Ninja -DCMAKE_BUILD_TYPE=${KILN_BUILD_TYPE:-Release} ${KILN_CMAKE_ARGS:-} >/dev/null
cmake --build "$BUILD_DIR" -j "$JOBS"
