#!/usr/bin/env bash
# One transformer's kernels under Nsight Compute, in one device call: the model is exported
# (bench/transformer_bench.py's export part), then `kiln build` runs under ncu, whose filter
# catches the tuner's runs of the matching kernels at the engine's shape (every candidate of a
# layer is timed there, so a tactic the tuner does not pick is profiled too). Logs in $OUT.
#   bench/prepare_deps.sh                                   # here (carry ".deps")
#   KILN_PROF_MODEL=bert KILN_PROF_SHAPE=32x128 \
#     KILN_PROF_KERNELS='mha_flash|sdpa' bench/transformer_profile.sh   # on the GPU machine
# KILN_PROF_COUNT: kernels profiled (default 6); KILN_PROF_SECTIONS: ncu --section names.
set -uo pipefail
. "$(dirname "$0")/device_env.sh" /tmp/kiln-transformer-profile
MODEL=${KILN_PROF_MODEL:-bert}
SHAPE=${KILN_PROF_SHAPE:-32x128}
if [ "$MODEL" = vit ]; then SHAPES="pixel_values:${SHAPE}"; else SHAPES="input_ids:$SHAPE,attention_mask:$SHAPE"; fi
python3 bench/transformer_bench.py --kiln "$KILN" --out "$OUT" --parts export --models "$MODEL" \
  --exporters torchscript >"$OUT/export.log" 2>&1 || { echo "export failed"; tail -5 "$OUT/export.log"; exit 1; }
NCU=${NCU:-$(command -v ncu || echo /usr/local/cuda/bin/ncu)}
sections=""
for s in ${KILN_PROF_SECTIONS:-SpeedOfLight Occupancy LaunchStats WarpStateStats MemoryWorkloadAnalysis SchedulerStats}; do
  sections+=" --section $s"
done
"$NCU" --clock-control none --kernel-name-base demangled --kernel-id "::regex:${KILN_PROF_KERNELS:-mha_flash|sdpa}:${KILN_PROF_INVOCATION:-3}" \
  --launch-count "${KILN_PROF_COUNT:-6}" $sections \
  "$KILN" build --onnx "models/${MODEL}_torchscript.onnx" --fp16 --shapes "$SHAPES" --verbose \
  --save-engine /tmp/profile.kiln >"$OUT/ncu.txt" 2>&1
echo "ncu exit status $?"
grep -E "^  [a-zA-Z_].*\(|Duration|Registers Per|Achieved Occupancy|Theoretical Occupancy|Block Limit|Warp Cycles Per Issued|Stall|Memory Throughput|Compute \(SM\) Throughput|Grid Size|Block Size|Waves Per SM|Dynamic Shared" "$OUT/ncu.txt" | head -${KILN_PROF_LINES:-150}
