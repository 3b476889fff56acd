#!/usr/bin/env bash
# The GPU checks of the attention work in one device call (issue 7): the test-backend-ops cases of
# the ONNX Attention layer, the 16-bit Softmax and kiln.Attention paths, then the attention and
# softmax node tests of the onnx wheel on the CPU and on the GPU (--no-tf32), compared.
#   KILN_BUILD_DIR=build-cuda bench/prepare_deps.sh        # here: pack the binaries into .deps
#   bench/gpu_attention.sh                                 # on the device (carry .deps)
# Logs and JSON go to $OUT.
set -uo pipefail
. "$(dirname "$0")/device_env.sh" /tmp/kiln-gpu-attention

echo "== test-backend-ops: attention family, kiln.Attention, Softmax"
timeout 300 .deps/kiln_backend_ops_test --gtest_brief=1 \
  --gtest_filter='attention.*:gemm_pool.attention*:reduce.*oftmax*' >"$OUT/backend_ops.log" 2>&1
echo "exit status $?"
grep -E "^\[  (PASSED|FAILED|SKIPPED) +\] [0-9]+ tests?" "$OUT/backend_ops.log" | tail -3
grep -E "^\[  FAILED  \]" "$OUT/backend_ops.log" | head -40

echo "== conformance: attention and softmax node tests, CPU vs GPU (--no-tf32), -O2 and -O0"
DATA=$(python3 -c "import os, onnx.backend.test as t; print(os.path.join(os.path.dirname(t.__file__), 'data'))")
for O in 2 0; do
  for B in cpu cuda; do
    args="--backend $B"
    [ "$B" = cuda ] && args="$args --no-tf32"
    KILN_BIN=$KILN KILN_BACKEND_ARGS="$args" timeout 250 python3 scripts/conformance.py \
      --kiln bench/kiln_backend.sh --data "$DATA" --suites node --opt-level $O \
      --filter 'attention|softmax|castlike' --json "$OUT/conformance_${B}_O$O.json" \
      >"$OUT/conformance_${B}_O$O.log" 2>&1
    echo "$B -O$O: $(tail -1 "$OUT/conformance_${B}_O$O.log")"
  done
  python3 scripts/compare_conformance.py "$OUT/conformance_cpu_O$O.json" \
    "$OUT/conformance_cuda_O$O.json" >"$OUT/conformance_compare_O$O.log" 2>&1
  echo "-O$O: $(grep -c regresses "$OUT/conformance_compare_O$O.log") tests pass on the CPU but not on the GPU"
  grep regresses "$OUT/conformance_compare_O$O.log" | head -20
done
