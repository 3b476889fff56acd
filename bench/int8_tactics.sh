#!/usr/bin/env bash
# The INT8 convolution tactics with kiln's INT8 epilogue, in one device call: the tactic tests
# (tests/cuda/test_conv_tactics_int8.cpp: every tactic that supports a problem against the host
# reference, plus the exact power-of-two problems that isolate the float -> int8 rounding) and the
# kernel study's tactic tests (FP16/TF32/per-tensor INT8 unchanged).
#   KILN_BUILD_DIR=build-cuda bench/prepare_deps.sh        # here: pack the binaries into .deps
#   bench/int8_tactics.sh                                  # on the device (carry .deps)
# $OUT/int8_tactics.log: the full gtest log; $OUT/int8_tactics_summary.txt: per problem, which
# tactics ran (with their one-code differences) and why the others were refused.
set -uo pipefail
. "$(dirname "$0")/device_env.sh" /tmp/kiln-int8-tactics
nvidia-smi --query-gpu=name,driver_version --format=csv,noheader 2>&1 | tee "$OUT/env.txt"

echo "== tactic tests: INT8 epilogue (Int8*) and the kernel study's (ConvTactics.*)"
timeout ${KILN_INT8_TIMEOUT:-500} .deps/kiln_cuda_tactics_test \
  --gtest_filter="${KILN_INT8_FILTER:-Int8*:All/Int8*:ConvTactics.*}" >"$OUT/int8_tactics.log" 2>&1
echo "exit status $?"
grep -E "^\[  (PASSED|FAILED|SKIPPED) +\] [0-9]+ tests?" "$OUT/int8_tactics.log" | tail -3
grep -E "^\[  FAILED  \]" "$OUT/int8_tactics.log" | head -60
grep -E "^\[ int8 \]|^  " "$OUT/int8_tactics.log" >"$OUT/int8_tactics_summary.txt"
echo "tactic runs checked: $(grep -c 'one-code differences' "$OUT/int8_tactics_summary.txt")"
grep -E "Failure|out of tolerance|not round-half-even|codes one off|no tactic ran" \
  "$OUT/int8_tactics.log" | head -40
