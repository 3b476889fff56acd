#!/usr/bin/env bash
# ResNet-50's stem alone (conv1 + BatchNorm + ReLU + max-pool, torchvision's layers with random
# weights) at batch KILN_STEM_BATCH (default 256), in one device call: kiln FP16 engines fused
# (kiln.FusedConvPool) and unfused (--opt-level 1: cuDNN's stem, then the max-pool), benched, and
# Nsight Compute over the fused kernel (KILN_STEM_NCU=0: skip). Logs in $OUT.
#   bench/prepare_deps.sh            # here (carry ".deps")
#   bench/stem_profile.sh            # on the GPU machine
set -uo pipefail
. "$(dirname "$0")/device_env.sh" /tmp/kiln-stem-profile
B=${KILN_STEM_BATCH:-256}
M=/tmp/resnet_stem.onnx
python3 - "$M" <<'EOF'
import sys, torch, torchvision
r = torchvision.models.resnet50()
stem = torch.nn.Sequential(r.conv1, r.bn1, r.relu, r.maxpool).eval()
torch.onnx.export(stem, (torch.randn(1, 3, 224, 224),), sys.argv[1], input_names=["input"],
                  output_names=["out"], dynamic_axes={"input": {0: "N"}, "out": {0: "N"}},
                  dynamo=False)
EOF
for mode in fused unfused; do
  extra=""; [ $mode = unfused ] && extra="--opt-level 1"
  "$KILN" build --onnx "$M" --shapes input:${B}x3x224x224 --fp16 $extra --verbose \
    --save-engine /tmp/stem_$mode.kiln >"$OUT/stem_build_$mode.log" 2>&1 || { echo "build $mode failed"; tail -3 "$OUT/stem_build_$mode.log"; continue; }
  "$KILN" bench --engine /tmp/stem_$mode.kiln --dump-profile 2>&1 | tee "$OUT/stem_bench_$mode.txt" | grep -E "median|ms .*%"
done
NCU=${NCU:-$(command -v ncu || echo /usr/local/cuda/bin/ncu)}
if [ "${KILN_STEM_NCU:-1}" = 1 ] && [ -x "$NCU" ]; then
  "$NCU" --kernel-name-base mangled -k regex:stem_s2d --launch-count 1 --set full \
    "$KILN" bench --engine /tmp/stem_fused.kiln --iterations 3 --warmup 1 >"$OUT/stem_ncu.txt" 2>&1
  grep -E "Duration|Throughput|Issue Slots|Warp Cycles Per Issued|Achieved Occupancy|Theoretical Occupancy|Block Limit|Registers|Shared Memory Config|Bank Conflicts|Stall|L1/TEX Hit|Executed Ipc" "$OUT/stem_ncu.txt" | head -60
fi
