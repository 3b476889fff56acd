#!/usr/bin/env bash
# `kiln` with a fixed backend appended, for scripts that call `kiln run --onnx ...` (the
# conformance runner): KILN_BACKEND_ARGS="--backend cuda --no-tf32" bench/kiln_backend.sh run ...
exec "${KILN_BIN:-$(dirname "$0")/../.deps/kiln}" "$@" ${KILN_BACKEND_ARGS:---backend cuda --no-tf32}
