#!/usr/bin/env bash
# Where an INT8 engine's time goes, in one device call (issue 10's speed work):
#   1. test-backend-ops, INT8 family (the kernels must be right before their times mean anything);
#   2. kiln build --int8 --fp16 --verbose of ResNet-50 at batch KILN_PROFILE_BATCH (default 256),
#      calibrated on 256 random images (8 files of 32; calibration needs one engine batch): every
#      candidate's tuned time per layer and the format choice's moves ($OUT/int8_build.log);
#   3. kiln bench --dump-profile: each layer's time in the engine ($OUT/int8_profile.txt);
#   4. the FP16 engine of the same batch, built and benched in the same run (KILN_PROFILE_FP16=0:
#      skip), for the INT8 / FP16 ratio;
#   5. Nsight Compute (when `ncu` is on the machine; KILN_PROFILE_NCU=0: skip) over one inference:
#      each kernel's duration, DRAM and SM throughput (% of peak) and achieved occupancy
#      ($OUT/ncu.csv): memory-bound at the floor, or short of both? (About 150 s for ResNet-50.)
#   6. KILN_NCU_FULL=REGEX: Nsight Compute's full set over a few launches of the kernels matching
#      REGEX ($OUT/ncu_full.txt).
#   bench/prepare_deps.sh            # here (carry ".deps")
#   bench/int8_profile.sh            # on the GPU machine; logs in $OUT
set -uo pipefail
. "$(dirname "$0")/device_env.sh" /tmp/kiln-int8-profile
B=${KILN_PROFILE_BATCH:-256}
S=$(date +%s)
stamp() { echo "[$(( $(date +%s) - S ))s] $*"; }

if [ "${KILN_PROFILE_OPS:-1}" = 1 ]; then  # KILN_PROFILE_OPS=0: the kernels were checked already
  stamp "test-backend-ops int8.*"
  timeout ${KILN_PROFILE_OPS_TIMEOUT:-150} .deps/kiln_backend_ops_test --gtest_brief=1 \
    --gtest_filter="${KILN_BACKEND_OPS_FILTER:-int8.*}" >"$OUT/backend_ops_int8.log" 2>&1
  echo "backend ops rc $?"
  grep -E "^\[  (PASSED|FAILED|SKIPPED) +\] [0-9]+ tests?" "$OUT/backend_ops_int8.log" | tail -3
  grep -E "^\[  FAILED  \]" "$OUT/backend_ops_int8.log" | head -20
fi

M=models/resnet50.onnx
[ -f "$M" ] || python3 scripts/export_torchvision.py resnet50 "$M" >/dev/null 2>&1
python3 -c "
import numpy as np, os; os.makedirs('/tmp/p_calib', exist_ok=True); r = np.random.default_rng(7)
[np.save(f'/tmp/p_calib/b{i}.npy', r.standard_normal((32, 3, 224, 224)).astype(np.float32)) for i in range(8)]"
E=/tmp/r50_int8_b$B.kiln
stamp "build ResNet-50 INT8 b$B (verbose)"
timeout ${KILN_PROFILE_BUILD_TIMEOUT:-200} "$KILN" build --onnx "$M" --save-engine "$E" --int8 --fp16 \
  --calib /tmp/p_calib --shapes input:${B}x3x224x224 --timing-cache /tmp/p_int8.cache --verbose \
  >"$OUT/int8_build.log" 2>&1
echo "build rc $?"; tail -2 "$OUT/int8_build.log"
stamp "bench with the per-layer profile"
"$KILN" bench --engine "$E" --use-cuda-graph --no-data-transfers --iterations 100 --duration 0.5 \
  2>&1 | grep -E "median|throughput" | head -3
"$KILN" bench --engine "$E" --no-data-transfers --iterations 20 --duration 0 --dump-profile \
  >"$OUT/int8_profile.txt" 2>&1
# The FP16 engine of the same batch in the same run: issue 10's ratio (KILN_PROFILE_FP16=0: skip).
if [ "${KILN_PROFILE_FP16:-1}" = 1 ]; then
  stamp "build and bench ResNet-50 FP16 b$B"
  timeout ${KILN_PROFILE_BUILD_TIMEOUT:-200} "$KILN" build --onnx "$M" --save-engine /tmp/r50_fp16_b$B.kiln \
    --fp16 --shapes input:${B}x3x224x224 --timing-cache /tmp/p_int8.cache >"$OUT/fp16_build.log" 2>&1
  echo "fp16 build rc $?"
  for e in "$E" /tmp/r50_fp16_b$B.kiln; do
    echo "$e: $("$KILN" bench --engine "$e" --use-cuda-graph --no-data-transfers --iterations 200 \
      --duration 1 2>&1 | grep -E "^(compute|throughput)" | tr '\n' ' ')"
  done
fi
if [ "${KILN_PROFILE_NCU:-1}" = 1 ] && command -v ncu >/dev/null; then
  stamp "ncu over one inference"
  timeout ${KILN_PROFILE_NCU_TIMEOUT:-150} ncu --csv --metrics \
gpu__time_duration.sum,dram__throughput.avg.pct_of_peak_sustained_elapsed,sm__throughput.avg.pct_of_peak_sustained_elapsed,sm__warps_active.avg.pct_of_peak_sustained_active,launch__grid_size,launch__registers_per_thread \
    --launch-count ${KILN_NCU_COUNT:-300} \
    "$KILN" bench --engine "$E" --no-data-transfers --warmup 0 --iterations 1 --duration 0 \
    >"$OUT/ncu.csv" 2>"$OUT/ncu.err"
  echo "ncu rc $?"; tail -2 "$OUT/ncu.err"
fi
# KILN_NCU_FULL=REGEX: Nsight Compute's full set over the first KILN_NCU_FULL_COUNT (default 3)
# launches of the kernels matching REGEX (e.g. int8_pair), with the lines that say what bounds them.
NCU_BIN=$(command -v ncu || echo /usr/local/cuda/bin/ncu)
if [ -n "${KILN_NCU_FULL:-}" ] && [ -x "$NCU_BIN" ]; then
  stamp "ncu --set full -k regex:$KILN_NCU_FULL"
  timeout ${KILN_PROFILE_NCU_TIMEOUT:-150} "$NCU_BIN" --kernel-name-base mangled \
    -k "regex:$KILN_NCU_FULL" --launch-count ${KILN_NCU_FULL_COUNT:-3} --set full \
    "$KILN" bench --engine "$E" --no-data-transfers --warmup 0 --iterations 1 --duration 0 \
    >"$OUT/ncu_full.txt" 2>&1
  echo "ncu rc $?"
  grep -E "int8_|Duration|DRAM Throughput|Compute \(SM\) Throughput|Issue Slots Busy|Warp Cycles Per Issued|Achieved Occupancy|Block Limit|Registers Per|L1/TEX Hit|Executed Ipc A|Bank Conflicts|Stall" "$OUT/ncu_full.txt" | cut -c1-160 | head -90
fi
stamp done
