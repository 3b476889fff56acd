#!/usr/bin/env bash
# The main job, end to end: install what is needed, build kiln, make a small CNN as ONNX,
# build an engine from it, and run the engine on an input (on the GPU when one is usable,
# else on the CPU backend), printing the outputs and the time.
set -euo pipefail
cd "$(dirname "$0")/.."
scripts/setup.sh
scripts/build.sh
BUILD_DIR=${KILN_BUILD_DIR:-build}
KILN="$BUILD_DIR/kiln"
WORK=${KILN_QUICKSTART_DIR:-$BUILD_DIR/quickstart}
mkdir -p "$WORK"

echo
echo "== 1. a small CNN as ONNX (Conv/BatchNorm/ReLU, a residual block, pooling, classifier) =="
python3 scripts/models/small_models.py "$WORK" | grep small_cnn
python3 - "$WORK" <<'PY'
import sys, numpy as np
rng = np.random.default_rng(0)
np.save(f"{sys.argv[1]}/input.npy", rng.standard_normal((1, 3, 32, 32)).astype(np.float32))
PY

echo
echo "== 2. build an engine (the default backend: cuda when it is usable here, else cpu) =="
"$KILN" build --onnx "$WORK/small_cnn.onnx" --save-engine "$WORK/small_cnn.kiln" \
  --min-shapes input:1x3x32x32 --opt-shapes input:8x3x32x32 --max-shapes input:32x3x32x32
"$KILN" inspect "$WORK/small_cnn.kiln"

echo
echo "== 3. run it on an input =="
"$KILN" run --engine "$WORK/small_cnn.kiln" --input "input=$WORK/input.npy" \
  --save-outputs "$WORK/outputs" --warmup 3 --iterations 20
echo
echo "outputs saved in $WORK/outputs/ (one .npy per output)"

if "$KILN" inspect "$WORK/small_cnn.kiln" --json | grep -q '"backend": "cuda"'; then
  echo
  echo "== 4. benchmark it on the GPU (CUDA graph, batch 8: the profile's opt shape) =="
  "$KILN" bench --engine "$WORK/small_cnn.kiln" --use-cuda-graph --duration 1
fi
