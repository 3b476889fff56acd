#!/usr/bin/env bash
# The GPU checks of INT8 on the CUDA backend in one device call (branch int8-gpu):
#   1. test-backend-ops, INT8 family: every INT8 tactic (conv_int8, conv_int8.dp4a, gemm_int8,
#      gemm_int8.dp4a) against the CPU INT8 reference, int8 outputs within one code (the share
#      off by one is printed per case), float outputs 1e-5 (int8) / 1e-3 (int8fp16);
#   2. kiln_cuda_int8_test: a calibrated --int8 cuda engine vs the CPU INT8 engine; the C = 3
#      stem falls back to float (kiln_cuda_host_test's INT8 lowering tests need no GPU: ctest here);
#   3. ResNet-50 b32: --fp16 vs --int8 --fp16 (calibrated on random batches: a speed check, not
#      an accuracy one), the INT8 layers kiln inspect reports, kiln bench of both.
#   KILN_BUILD_DIR=build-cuda bench/prepare_deps.sh        # here: pack the binaries into .deps
#   bench/gpu_int8.sh                                      # on the device (carry .deps)
# Logs go to $OUT.
set -uo pipefail
. "$(dirname "$0")/device_env.sh" /tmp/kiln-gpu-int8

echo "== test-backend-ops: INT8 family"
timeout 300 .deps/kiln_backend_ops_test --gtest_brief=1 --gtest_filter='int8.*' \
  >"$OUT/backend_ops_int8.log" 2>&1
echo "exit status $?"
grep -E "^\[  (PASSED|FAILED|SKIPPED) +\] [0-9]+ tests?" "$OUT/backend_ops_int8.log" | tail -3
grep -E "^\[  FAILED  \]" "$OUT/backend_ops_int8.log" | head -40
echo "largest shares of int8 codes off by one:"
grep -E "^\[ int8" "$OUT/backend_ops_int8.log" | sort -t: -k2 -g -r | head -5

echo "== INT8 engine and lowering tests"
timeout 300 .deps/kiln_cuda_int8_test 2>&1 | tee "$OUT/int8_engine.log" | grep -E "^\[ int8|OK|FAILED|PASSED|Failure|error" | head -30

echo "== ResNet-50 b32: fp16 vs int8+fp16"
M=models/resnet50.onnx
[ -f "$M" ] || python3 scripts/export_torchvision.py resnet50 "$M" >/dev/null 2>"$OUT/export.log" || { tail -3 "$OUT/export.log"; exit 1; }
python3 - <<'EOF'
import os, numpy as np
os.makedirs("/tmp/int8_calib", exist_ok=True)
rng = np.random.default_rng(0)
for i in range(4):
    np.save(f"/tmp/int8_calib/{i}.npy", rng.standard_normal((32, 3, 224, 224), dtype=np.float32))
EOF
IN=$(python3 -c "import onnx; print(onnx.load('$M').graph.input[0].name)")
"$KILN" build --onnx "$M" --save-engine /tmp/r50_fp16.kiln --fp16 --shapes "$IN:32x3x224x224" \
  --timing-cache /tmp/int8.cache 2>&1 | tee "$OUT/build_fp16.log" | tail -2
"$KILN" build --onnx "$M" --save-engine /tmp/r50_int8.kiln --int8 --fp16 --calib /tmp/int8_calib \
  --shapes "$IN:32x3x224x224" --timing-cache /tmp/int8.cache --verbose >"$OUT/build_int8.log" 2>&1
echo "int8 build rc $?"; grep -E "^  (int8|gpu) " "$OUT/build_int8.log"
"$KILN" inspect /tmp/r50_int8.kiln >"$OUT/inspect_int8.txt" 2>&1
echo "layers by precision (kiln inspect):"
grep -E "^  #" "$OUT/inspect_int8.txt" | awk '{print $4}' | sort | uniq -c
for p in fp16 int8; do
  "$KILN" bench --engine /tmp/r50_$p.kiln --use-cuda-graph --export-json "$OUT/bench_$p.json" \
    2>&1 | tee "$OUT/bench_$p.log" | grep -iE "throughput|latency|median" | head -3
done
