#!/usr/bin/env bash
# Gathers what a device call needs into .deps/ (git-ignored; carry it): the CLI and the GPU test
# programs built here for sm_90a, and the shared libraries they use that the GPU machine lacks.
set -euo pipefail
cd "$(dirname "$0")/.."
BUILD=${KILN_BUILD_DIR:-build}
mkdir -p .deps
cp "$BUILD/kiln" .deps/
for t in kiln_backend_ops_test kiln_cuda_tactics_test kiln_cuda_engine_test; do
  [ -x "$BUILD/tests/cuda/$t" ] && cp "$BUILD/tests/cuda/$t" .deps/
done
for lib in libprotobuf.so.32 libfmt.so.9; do cp -L "/lib/x86_64-linux-gnu/$lib" .deps/; done
strip --strip-unneeded .deps/kiln .deps/kiln_*_test 2>/dev/null || true
du -sh .deps
