#!/usr/bin/env bash
# The transformer work that is written but gated (KILN_UNVERIFIED_TACTICS=1) until a GPU has run
# it, checked and measured on the GPU machine with the gate open and closed:
#   tests   the CUDA engine tests (tuning-point alternates, CUDA graphs replayed on the legacy
#           stream) and test-backend-ops' transformer cases with the gate open (mha.flash/short,
#           layernorm rows/prefetch)
#   on      kiln's FP16 engines with the gate open: static at batch 1 and 32, the dynamic engine
#           (batch 1-64 x sequence 1-512, tuned at batch 32 and batch 1) at both
#   off     the same with the gate closed (what a build does today)
#   python  bench/python_gpu.sh's host cost of ctx.run (ResNet-50 FP16), OUT/python
# bench/transformer_bench.py runs without PyTorch here (--no-torch): the ratios to torch.compile
# come from bench/transformers.sh once the gate is off.
#   here:      KILN_DEPS_PYTHON=1 bench/prepare_deps.sh
#   the call:  bench/transformers_gated.sh [PART...]   (default: tests on off), carrying .deps;
#              "tests on" and "off python" each fit one call
# KILN_TX_MODELS (default bert,gpt2,vit). Logs and JSON under $OUT, packed as OUT/gated.tgz at
# the end (the device tool brings back eight files at most); the table is printed last.
set -uo pipefail
. "$(dirname "$0")/device_env.sh" /tmp/kiln-gated >/dev/null
PARTS=${*:-tests on off}
has() { [[ " $PARTS " == *" $1 "* ]]; }
# Every step's timeout is capped by what is left of KILN_GATED_BUDGET (seconds, default 560), so
# the logs are packed before a device call's 600 s run out.
cap() { local left=$(( ${KILN_GATED_BUDGET:-560} - SECONDS )); echo $(( $1 < left ? $1 : (left > 1 ? left : 1) )); }
ROOT_OUT=$OUT
nvidia-smi --query-gpu=name,driver_version,clocks.sm,clocks.max.sm --format=csv,noheader | tee "$OUT/gpu.txt"

if has tests; then
  echo "== CUDA engine tests"
  timeout $(cap 180) .deps/kiln_cuda_engine_test --gtest_brief=1 >"$OUT/engine_test.log" 2>&1
  echo "exit status $?"; grep -E "^\[  (PASSED|FAILED) +\]|Failure" "$OUT/engine_test.log" | head -20
  echo "== test-backend-ops, transformer cases, gate open"
  KILN_UNVERIFIED_TACTICS=1 timeout $(cap 300) .deps/kiln_backend_ops_test --gtest_brief=1 \
    --gtest_filter="${KILN_TX_TEST_FILTER:-transformer.*}" >"$OUT/backend_ops.log" 2>&1
  echo "exit status $?"
  grep -E "^\[  (PASSED|FAILED|SKIPPED) +\] [0-9]+ tests?" "$OUT/backend_ops.log" | tail -3
  grep -E "^\[  FAILED  \]|Failure|relative L2" "$OUT/backend_ops.log" | head -30
fi

if has on || has off; then
  echo "== exports (TorchScript)"
  timeout $(cap 240) python3 bench/transformer_bench.py --kiln "$KILN" --out "$ROOT_OUT" --parts export \
    --models "${KILN_TX_MODELS:-bert,gpt2,vit}" --exporters torchscript 2>&1 | tail -3
fi
for side in on off; do
  has $side || continue
  echo "== FP16 engines, gate $side"
  mkdir -p "$ROOT_OUT/$side"
  ( [ $side = on ] && export KILN_UNVERIFIED_TACTICS=1
    timeout $(cap ${KILN_GATED_TIMEOUT:-270}) python3 bench/transformer_bench.py --kiln "$KILN" \
      --out "$ROOT_OUT/$side" --work "/tmp/kiln-gated-$side" --parts speed,dynamic \
      --models "${KILN_TX_MODELS:-bert,gpt2,vit}" --exporters torchscript --iters 200 --no-torch \
      >"$ROOT_OUT/$side/transformers.log" 2>&1
    echo "exit status $?" )
  grep -E "b(1|32):|dynamic engine|FAILED" "$ROOT_OUT/$side/transformers.log"
done

if has python; then
  echo "== Python host cost"
  mkdir -p "$ROOT_OUT/python"
  OUT=$ROOT_OUT/python KILN_PY_SKIP_TESTS=1 KILN_PY_NUMBERS_ARGS=--host-cost \
    timeout $(cap 240) bench/python_gpu.sh 2>&1 | tail -24
fi

cd "$ROOT_OUT" && tar czf /tmp/gated.tgz . && rm -rf "${ROOT_OUT:?}"/* && mv /tmp/gated.tgz "$ROOT_OUT/"
