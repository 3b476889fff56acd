#!/usr/bin/env bash
# Transformers on the GPU in one device call: the transformer layers' test-backend-ops cases
# (MultiHeadAttention, SkipLayerNorm, LayerNorm rows, GEMM epilogues), then bench/transformer_bench.py
# (exports, FP16 engines next to PyTorch eager and torch.compile, the dynamic-shape engine,
# accuracy against ONNX Runtime's CPU float32 reference).
#   bench/prepare_deps.sh                 # here: pack the binaries into .deps (carry .deps)
#   bench/transformers.sh                 # on the device; logs and JSON go to $OUT
# KILN_TX_PARTS (default "tests export speed dynamic accuracy"; also "floor"), KILN_TX_MODELS (bert,gpt2,vit),
# KILN_TX_ARGS (more bench/transformer_bench.py flags, e.g. "--batches 32 --iters 200").
set -uo pipefail
. "$(dirname "$0")/device_env.sh" /tmp/kiln-transformers
PARTS=${KILN_TX_PARTS:-tests export speed dynamic accuracy}
nvidia-smi --query-gpu=name,driver_version,clocks.sm,clocks.max.sm --format=csv,noheader | tee "$OUT/gpu.txt"
python3 -c "import torch, transformers; print('torch', torch.__version__, 'transformers', transformers.__version__, 'cuDNN', torch.backends.cudnn.version())" | tee -a "$OUT/gpu.txt"

if [[ " $PARTS " == *" tests "* ]]; then
  echo "== test-backend-ops: transformer layers"
  timeout 300 .deps/kiln_backend_ops_test --gtest_brief=1 --gtest_filter="${KILN_TX_TEST_FILTER:-transformer.*}" \
    >"$OUT/backend_ops.log" 2>&1
  echo "exit status $?"
  grep -E "^\[  (PASSED|FAILED|SKIPPED) +\] [0-9]+ tests?" "$OUT/backend_ops.log" | tail -3
  grep -E "^\[  FAILED  \]|Failure|relative L2|element" "$OUT/backend_ops.log" | head -40
fi

py_parts=""
for p in export speed dynamic floor accuracy; do [[ " $PARTS " == *" $p "* ]] && py_parts+="${py_parts:+,}$p"; done
if [ -n "$py_parts" ]; then
  echo "== bench/transformer_bench.py ($py_parts)"
  timeout ${KILN_TX_TIMEOUT:-540} python3 bench/transformer_bench.py --kiln "$KILN" --out "$OUT" --parts "$py_parts" \
    --models "${KILN_TX_MODELS:-bert,gpt2,vit}" ${KILN_TX_ARGS:-} 2>&1 | tee "$OUT/transformers.log"
fi
