#!/usr/bin/env bash
# GPU checks and benchmarks in one device call. Expects binaries built here (sm_90a) and the
# shared libraries they need in .deps/ (bench/prepare_deps.sh makes it; carry ".deps").
#   bench/device_check.sh [STAGE...]     stages: env tests models bench int8 rebuild conformance (default: all)
#                                        and perlayer (not in the default: localizes an accuracy failure)
#                                        and verify (not in the default: the first GPU run of gated
#                                        kernels, KILN_UNVERIFIED_TACTICS=1: their test-backend-ops
#                                        cases, then ResNet-50 INT8/FP16 speed and INT8 accuracy;
#                                        KILN_VERIFY_ROWS, KILN_VERIFY_ACCURACY, and KILN_VERIFY_OFF_ROWS:
#                                        rows benched again with the gate closed)
# Narrower runs: KILN_BACKEND_OPS_FILTER (gtest filter of test-backend-ops), KILN_CONFORMANCE_FILTER
# (regex on conformance test names), KILN_MODELS, KILN_PERLAYER="model:precision ..." (perlayer),
# KILN_INT8_PARTS (int8: some of speed accuracy budget compare fmnist).
# Logs and JSON go to $OUT (the device tool brings them back).
set -uo pipefail
. "$(dirname "$0")/device_env.sh" /tmp/kiln-device-check
STAGES=${*:-env tests models bench int8 rebuild conformance}
has() { [[ " $STAGES " == *" $1 "* ]]; }

if has env; then
  echo "== env"
  { date -u; nvidia-smi --query-gpu=name,driver_version,clocks.sm,clocks.max.sm,memory.total --format=csv
    nvcc --version | tail -1
    python3 -c "import torch, torchvision, onnx; print('torch', torch.__version__, 'torchvision', torchvision.__version__, 'onnx', onnx.__version__, 'cudnn(torch)', torch.backends.cudnn.version())"
    ldd "$KILN" | grep -E "cudnn|cublas|cudart"; } 2>&1 | tee "$OUT/env.txt"
fi

if has tests; then
  echo "== GPU unit tests (test-backend-ops and the conv tactic tests)"
  timeout ${KILN_TESTS_TIMEOUT:-420} .deps/kiln_backend_ops_test --gtest_brief=1 \
    ${KILN_BACKEND_OPS_FILTER:+--gtest_filter=$KILN_BACKEND_OPS_FILTER} >"$OUT/backend_ops.log" 2>&1
  echo "backend ops rc $? (skipped = tactic/mode pairs a case does not apply to):"
  grep -E "^\[  (PASSED|FAILED|SKIPPED) +\] [0-9]+ tests?|tests? from .* ran" "$OUT/backend_ops.log" | tail -5
  grep -E "^\[  FAILED  \]" "$OUT/backend_ops.log" | head -40
  [ -x .deps/kiln_cuda_tactics_test ] && .deps/kiln_cuda_tactics_test --gtest_brief=1 2>&1 | tail -2
  [ -x .deps/kiln_cuda_engine_test ] && timeout 120 .deps/kiln_cuda_engine_test --gtest_brief=1 2>&1 | tail -12
  [ -x .deps/kiln_cuda_compare_test ] && timeout 120 .deps/kiln_cuda_compare_test --gtest_brief=1 2>&1 | tail -12
  [ -x .deps/kiln_cuda_calib_test ] && timeout 120 .deps/kiln_cuda_calib_test --gtest_brief=1 2>&1 | tail -6
  [ -x .deps/kiln_cuda_int8_test ] && timeout 300 .deps/kiln_cuda_int8_test --gtest_brief=1 2>&1 | tail -12
fi

if has models; then
  echo "== real models: export, build fp32/tf32/fp16, compare with the CPU reference"
  for m in ${KILN_MODELS:-resnet18 resnet50 mobilenet_v2 efficientnet_b0 densenet121}; do
    python3 scripts/export_torchvision.py "$m" "models/$m.onnx" >/dev/null 2>"$OUT/export_$m.log" || { echo "export $m failed"; tail -3 "$OUT/export_$m.log"; continue; }
    python3 scripts/check_gpu_accuracy.py --kiln "$KILN" --onnx "models/$m.onnx" --batch 2 \
      --json "$OUT/accuracy_$m.json" 2>&1 | tee -a "$OUT/accuracy.log"
  done
  # One engine for all batches (a dynamic profile tuned at 32) run at batch 2: tactics at a shape
  # they were not timed at.
  [ -f models/resnet50.onnx ] && python3 scripts/check_gpu_accuracy.py --kiln "$KILN" \
    --onnx models/resnet50.onnx --batch 2 --profile 1,32,256 --precisions tf32,fp16 \
    --json "$OUT/accuracy_resnet50_profile.json" 2>&1 | tee -a "$OUT/accuracy.log"
fi

if has bench; then
  echo "== benchmarks: kiln next to PyTorch eager and torch.compile in the same run"
  python3 bench/bench_cnn.py --kiln "$KILN" --out "$OUT" ${KILN_BENCH_ARGS:-} 2>&1 | tee "$OUT/bench.log"
fi

if has verify; then
  echo "== verify: kernels not yet run on a GPU (KILN_UNVERIFIED_TACTICS=1; docs/architecture.md)"
  export KILN_UNVERIFIED_TACTICS=1
  timeout ${KILN_VERIFY_OPS_TIMEOUT:-150} .deps/kiln_backend_ops_test --gtest_brief=1 \
    --gtest_filter="${KILN_BACKEND_OPS_FILTER:-int8.*:conv.*}" >"$OUT/verify_backend_ops.log" 2>&1
  echo "backend ops rc $?"
  grep -E "^\[  (PASSED|FAILED|SKIPPED) +\] [0-9]+ tests?|tests? from .* ran" "$OUT/verify_backend_ops.log" | tail -4
  grep -E "^\[  FAILED  \]" "$OUT/verify_backend_ops.log" | head -30
  [ -f models/resnet50.onnx ] || python3 scripts/export_torchvision.py resnet50 models/resnet50.onnx >/dev/null 2>&1
  timeout ${KILN_VERIFY_BENCH_TIMEOUT:-330} python3 bench/bench_cnn.py --kiln "$KILN" --out /tmp/verify_bench --profile \
    --rows ${KILN_VERIFY_ROWS:-resnet50:int8:256,resnet50:fp16:256,resnet50:int8:32,resnet50:fp16:32} 2>&1 | tee "$OUT/verify_bench.log"
  cp /tmp/verify_bench/bench_cnn.json "$OUT/verify_bench.json" 2>/dev/null
  cp /tmp/verify_bench/profiles.txt "$OUT/verify_profiles.txt" 2>/dev/null
  cp /tmp/verify_bench/build_logs.txt "$OUT/verify_build_logs.txt" 2>/dev/null
  timeout 120 python3 scripts/check_gpu_accuracy.py --kiln "$KILN" --onnx models/resnet50.onnx --batch 2 \
    --precisions ${KILN_VERIFY_ACCURACY:-fp16,int8} --json "$OUT/verify_accuracy.json" 2>&1 | tee "$OUT/verify_accuracy.log"
  # The same rows with the gate closed (today's default engines), in the same run: does the gated
  # kernel make the engine faster?
  if [ -n "${KILN_VERIFY_OFF_ROWS:-}" ]; then
    unset KILN_UNVERIFIED_TACTICS
    timeout ${KILN_VERIFY_OFF_TIMEOUT:-200} python3 bench/bench_cnn.py --kiln "$KILN" --out /tmp/verify_off --profile \
      --rows $KILN_VERIFY_OFF_ROWS 2>&1 | sed 's/^/gate closed: /' | tee "$OUT/verify_bench_off.log"
    cp /tmp/verify_off/profiles.txt "$OUT/verify_profiles_off.txt" 2>/dev/null
  fi
fi

if has int8; then
  echo "== INT8 (issue 10): ResNet-50 speed next to FP16 (per-layer profile), accuracy against FP32 and the CPU INT8 reference, --accuracy-budget, per-layer INT8 error, Fashion-MNIST"
  # KILN_INT8_PARTS picks parts (all by default; a 600 s call holds about two or three).
  PARTS=" ${KILN_INT8_PARTS:-speed accuracy budget compare fmnist} "
  [ -f models/resnet50.onnx ] || python3 scripts/export_torchvision.py resnet50 models/resnet50.onnx >/dev/null
  if [[ $PARTS == *" speed "* ]]; then
    python3 bench/bench_cnn.py --kiln "$KILN" --out /tmp/int8_bench --profile ${KILN_INT8_BENCH_ARGS:-} \
      --rows ${KILN_INT8_ROWS:-resnet50:int8:256,resnet50:fp16:256,resnet50:int8:32,resnet50:int8:1} 2>&1 | tee -a "$OUT/int8.log"
    cp /tmp/int8_bench/bench_cnn.json "$OUT/bench_int8.json" 2>/dev/null
    cp /tmp/int8_bench/profiles.txt "$OUT/int8_profiles.txt" 2>/dev/null
    cp /tmp/int8_bench/build_logs.txt "$OUT/int8_build_logs.txt" 2>/dev/null
  fi
  if [[ $PARTS == *" accuracy "* ]]; then
    python3 scripts/check_gpu_accuracy.py --kiln "$KILN" --onnx models/resnet50.onnx --batch 2 \
      --precisions int8 --json "$OUT/accuracy_resnet50_int8.json" 2>&1 | tee -a "$OUT/int8.log"
  fi
  if [[ $PARTS == *" budget "* || $PARTS == *" compare "* ]]; then
    python3 -c "import numpy as np, os; os.makedirs('/tmp/r50_calib', exist_ok=True); r = np.random.default_rng(7)
[np.save(f'/tmp/r50_calib/b{i:02d}.npy', r.standard_normal((32, 3, 224, 224)).astype(np.float32)) for i in range(10)]"
  fi
  # Point 5: --accuracy-budget on the GPU (KILN_BUDGET_MODEL, default ResNet-50, b32, random
  # calibration batches, of which the last fifth are held out; KILN_BUDGET: the budget, 0.01):
  # which layers move back to FP16 and what that costs in tuned time.
  if [[ $PARTS == *" budget "* ]]; then
    BM=${KILN_BUDGET_MODEL:-resnet50}
    [ -f "models/$BM.onnx" ] || python3 scripts/export_torchvision.py "$BM" "models/$BM.onnx" >/dev/null 2>&1
    timeout ${KILN_BUDGET_TIMEOUT:-300} "$KILN" build --onnx "models/$BM.onnx" --shapes input:32x3x224x224 \
      --int8 --fp16 --calib /tmp/r50_calib --accuracy-budget ${KILN_BUDGET:-0.01} \
      --timing-cache /tmp/${BM}_budget.cache --save-engine /tmp/${BM}_budget.kiln 2>&1 | tail -25 | tee "$OUT/int8_budget.log"
  fi
  # Where INT8 error arises, layer by layer (kiln compare against the float64 CPU reference).
  if [[ $PARTS == *" compare "* ]]; then
    timeout 300 "$KILN" compare models/resnet50.onnx --precisions fp16,int8 --shapes input:2x3x224x224 \
      --calib /tmp/r50_calib --per-layer --export-json "$OUT/compare_int8.json" \
      2>&1 | tail -40 > "$OUT/compare_int8.log"; head -8 "$OUT/compare_int8.log"
  fi
  # Fashion-MNIST top-1 per precision (the dataset carried in .deps: KILN_DEPS_FMNIST=1
  # bench/prepare_deps.sh, or FMNIST_DIR).
  [ -d .deps/fashion-mnist ] && export FMNIST_DIR=${FMNIST_DIR:-$PWD/.deps/fashion-mnist}
  if [[ $PARTS == *" fmnist "* ]] && [ -n "${FMNIST_DIR:-}" ]; then
    KILN=$KILN OUT=$OUT bench/fashion_mnist_int8.sh 2>&1 | tail -20
    rm -rf "$OUT/fashion_mnist"  # the model, calibration images and test set: large, regenerated
  fi
fi

if has perlayer; then
  echo "== per-layer error against the float64 CPU reference, with the tactics the build chose"
  for mp in ${KILN_PERLAYER:-efficientnet_b0:tf32}; do
    m=${mp%%:*} prec=${mp#*:}
    [ -f "models/$m.onnx" ] || python3 scripts/export_torchvision.py "$m" "models/$m.onnx" >/dev/null
    "$KILN" compare "models/$m.onnx" --precisions "$prec" --shapes input:2x3x224x224 --per-layer \
      --export-json "$OUT/perlayer_${m}_$prec.json" 2>&1 | tee "$OUT/perlayer_${m}_$prec.log" | tail -25
    "$KILN" build --onnx "models/$m.onnx" --save-engine /tmp/pl.kiln --shapes input:2x3x224x224 \
      $([ "$prec" = fp16 ] && echo --fp16) $([ "$prec" = int8 ] && echo --int8 --fp16) --verbose \
      >"$OUT/perlayer_${m}_${prec}_build.log" 2>&1
    "$KILN" inspect /tmp/pl.kiln >"$OUT/perlayer_${m}_${prec}_inspect.log" 2>&1
  done
fi

if has rebuild; then
  echo "== build time with a warm timing cache, and determinism (same cache: byte-identical engines)"
  m=${KILN_REBUILD_MODEL:-resnet50}
  [ -f "models/$m.onnx" ] || python3 scripts/export_torchvision.py "$m" "models/$m.onnx" >/dev/null
  rm -f /tmp/rb.cache
  for i in 1 2 3; do
    t0=$EPOCHREALTIME
    "$KILN" build --onnx "models/$m.onnx" --save-engine /tmp/rb$i.kiln --fp16 --shapes input:256x3x224x224 \
      --timing-cache /tmp/rb.cache >/dev/null || echo "build $i failed"
    echo "$m fp16 b256 build $i ($([ $i = 1 ] && echo cold || echo warm) cache): $(awk "BEGIN{printf \"%.1f\", $EPOCHREALTIME - $t0}") s"
  done
  cmp /tmp/rb2.kiln /tmp/rb3.kiln && echo "warm-cache engines 2 and 3 are byte-identical"
fi

if has conformance; then
  echo "== ONNX conformance: the onnx wheel's node tests on the CPU and on the GPU (--no-tf32)"
  # The wheel ships the model suites as data and the node tests as code: generate those first
  # (scripts/gen_onnx_node_tests.py, as scripts/test.sh does) and run all three suites.
  DATA=/tmp/onnx-conformance
  WHEEL=$(python3 -c "import os, onnx.backend.test as t; print(os.path.join(os.path.dirname(t.__file__), 'data'))")
  mkdir -p $DATA && ln -sfn "$WHEEL/pytorch-converted" $DATA/ && ln -sfn "$WHEEL/pytorch-operator" $DATA/
  python3 scripts/gen_onnx_node_tests.py $DATA >"$OUT/gen_node_tests.log" 2>&1 || tail -3 "$OUT/gen_node_tests.log"
  # The CPU run (the baseline on this data) goes alongside the GPU run: the machine has cores to spare.
  # No test starts after DEADLINE seconds, so a slow run still reports what ran before the timeout.
  DEADLINE=${KILN_CONFORMANCE_DEADLINE:-300}
  KILN_BIN=$KILN KILN_BACKEND_ARGS="--backend cpu" timeout 400 python3 scripts/conformance.py \
    --kiln bench/kiln_backend.sh --data "$DATA" --filter "${KILN_CONFORMANCE_FILTER:-}" --deadline $DEADLINE --timeout 90 --json "$OUT/conformance_cpu.json" >"$OUT/conformance_cpu.log" 2>&1 &
  KILN_BIN=$KILN KILN_BACKEND_ARGS="--backend cuda --no-tf32" timeout 400 python3 scripts/conformance.py \
    --kiln bench/kiln_backend.sh --data "$DATA" --filter "${KILN_CONFORMANCE_FILTER:-}" --deadline $DEADLINE --timeout 90 --json "$OUT/conformance_cuda.json" >"$OUT/conformance_cuda.log" 2>&1
  wait
  tail -4 "$OUT/conformance_cpu.log"
  tail -4 "$OUT/conformance_cuda.log"
  python3 scripts/compare_conformance.py "$OUT/conformance_cpu.json" "$OUT/conformance_cuda.json" \
    >"$OUT/conformance_compare.log" 2>&1
  head -3 "$OUT/conformance_compare.log"
  grep -c regresses "$OUT/conformance_compare.log"
fi
