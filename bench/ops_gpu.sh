#!/usr/bin/env bash
# The GPU checks of the op families added for "every model family" in one device call: their
# test-backend-ops cases (KILN_OPS_FILTER, default the recurrent, sampling/detection and dynamic
# families; KILN_UNVERIFIED_TACTICS=1 is set so that kernels not yet run on a GPU take part), the
# model tests against ONNX Runtime built for the cuda backend (recurrent graphs, one-node sampling
# and detection models, control flow, FP32 and FP16), and the ONNX conformance tests of those ops
# on the cuda backend. Logs to $OUT; a summary line per part on stdout.
#   bench/prepare_deps.sh            # here: .deps with kiln_backend_ops_test (carry ".deps")
#   bench/ops_gpu.sh [PART...]       # on the device: parts ops models conformance (default all)
set -uo pipefail
. "$(dirname "$0")/device_env.sh" /tmp/kiln-ops-gpu
export KILN_UNVERIFIED_TACTICS=${KILN_UNVERIFIED_TACTICS:-1}
PARTS=${*:-ops models conformance}
has() { [[ " $PARTS " == *" $1 "* ]]; }
nvidia-smi --query-gpu=name,driver_version --format=csv,noheader | tee "$OUT/gpu.txt"

if has ops; then
  timeout "${KILN_OPS_TIMEOUT:-240}" .deps/kiln_backend_ops_test --gtest_brief=1 \
    --gtest_filter="${KILN_OPS_FILTER:-rnn.*:sampling.*:dynamic.*}" >"$OUT/backend_ops.log" 2>&1
  echo "test-backend-ops rc $?: $(grep -E '^\[  (PASSED|FAILED) +\]' "$OUT/backend_ops.log" | tr '\n' ' ')"
  grep -E "^\[  FAILED  \]" "$OUT/backend_ops.log" | head -30
fi

if has models; then
  for flags in "--backend cuda --no-tf32" "--backend cuda --fp16"; do
    tag=$(echo "$flags" | tr -d ' -' | sed 's/backendcuda//')
    tol=$([ "$tag" = fp16 ] && echo 1e-2 || echo 1e-4)
    python3 tests/models/run_rnn_tests.py --kiln "$KILN" --build-flags "$flags" --tol "$tol" \
      --filter "${KILN_RNN_FILTER:-bidirectional}" \
      >"$OUT/rnn_$tag.log" 2>&1
    echo "rnn models ($flags): $(tail -1 "$OUT/rnn_$tag.log")"
    python3 tests/models/run_control_flow_tests.py --kiln "$KILN" --build-flags "$flags" \
      >"$OUT/control_flow_$tag.log" 2>&1
    echo "control flow ($flags): $(tail -1 "$OUT/control_flow_$tag.log")"
  done
  python3 tests/models/run_sampling_ops_tests.py --kiln "$KILN" --backend cuda \
    --filter "${KILN_SAMPLING_FILTER:-gridsample20_.*_ac0_|gridsample16_|roialign16_}" \
    >"$OUT/sampling_models.log" 2>&1
  echo "sampling/detection one-node models (cuda): $(tail -1 "$OUT/sampling_models.log")"
fi

if has conformance; then
  python3 scripts/gen_onnx_node_tests.py /tmp/onnx-node-tests >/dev/null 2>&1
  KILN_BIN=$KILN KILN_BACKEND_ARGS="--backend cuda --no-tf32" python3 scripts/conformance.py \
    --kiln bench/kiln_backend.sh --data /tmp/onnx-node-tests --suites node \
    --filter "${KILN_CONFORMANCE_FILTER:-lstm|gru|rnn|gridsample|roialign|nonmaxsuppression|nonzero|test_if|loop|scan|range_.*_expanded}" \
    -v >"$OUT/conformance.log" 2>&1
  grep -E "^(FAIL|CRASH)" "$OUT/conformance.log" | head -20
  echo "conformance (cuda, --no-tf32): $(tail -1 "$OUT/conformance.log")"
fi
