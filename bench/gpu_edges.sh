#!/usr/bin/env bash
# The rough edges a new user met on the GPU, checked where they were met: ResNet-50 at batch 256
# built --fp16, --int8, --int8 --fp16 and --best (one calibration cache for all INT8 builds), the
# build summary of each, and their throughput; a build at shapes that cannot fit (fails within
# seconds, one line); a build on a GPU another process (PyTorch) has nearly filled (says out of
# memory); kiln_cuda_memory_test and the calibration tests. Logs under $OUT.
#   here:  bench/prepare_deps.sh      there: bench/gpu_edges.sh   (carry .deps)
set -uo pipefail
. "$(dirname "$0")/device_env.sh" "${OUT:-/tmp/kiln-edges}"
B=${KILN_EDGES_BATCH:-256}
since() { awk -v a="$1" -v b="$(date +%s.%N)" 'BEGIN { printf "%.1f", b - a }'; }

echo "== kiln_cuda_memory_test, kiln_cuda_calib_test"
for t in kiln_cuda_memory_test kiln_cuda_calib_test; do
  timeout 300 .deps/$t 2>&1 | tee "$OUT/$t.log" | grep -E "^\[  (PASSED|FAILED|SKIPPED) |Failure|error:" | head -20
done

M=models/resnet50.onnx
[ -f "$M" ] || python3 scripts/export_torchvision.py resnet50 "$M" >/dev/null 2>"$OUT/export.log" || { tail -3 "$OUT/export.log"; exit 1; }
IN=$(python3 -c "import onnx; print(onnx.load('$M').graph.input[0].name)")
python3 - <<'PY'
import os, numpy as np
os.makedirs("/tmp/edges_calib", exist_ok=True)
rng = np.random.default_rng(0)
for i in range(8):  # 256 samples: one batch of the engine
    np.save(f"/tmp/edges_calib/{i}.npy", rng.standard_normal((32, 3, 224, 224), dtype=np.float32))
PY
rm -f /tmp/edges.calib
echo "== ResNet-50 b$B: --fp16, --int8, --int8 --fp16, --best (one calibration cache)"
build() {  # NAME FLAGS...
  local name=$1; shift
  local t0=$(date +%s.%N)
  "$KILN" build --onnx "$M" --save-engine /tmp/r50_$name.kiln --shapes "$IN:${B}x3x224x224" \
    --timing-cache /tmp/edges.timing "$@" >"$OUT/build_$name.log" 2>&1
  local rc=$?
  printf "%-10s rc %d  %s s\n" "$name" $rc "$(since "$t0")"
  grep -E "^  (precision|int8|gpu|note) " "$OUT/build_$name.log" | sed 's/^/    /'
  [ $rc -eq 0 ] || tail -1 "$OUT/build_$name.log"
}
build fp16 --fp16
build int8 --int8 --calib /tmp/edges_calib --calib-cache /tmp/edges.calib
build int8fp16 --int8 --fp16 --calib-cache /tmp/edges.calib   # the cache alone: no --calib
build best --best --calib-cache /tmp/edges.calib
for p in fp16 int8 int8fp16 best; do
  [ -f /tmp/r50_$p.kiln ] || continue
  "$KILN" bench --engine /tmp/r50_$p.kiln --use-cuda-graph --no-data-transfers --export-json "$OUT/bench_$p.json" \
    >"$OUT/bench_$p.log" 2>&1
done
python3 - "$OUT" "$B" <<'PY'
import json, sys, os
out, b = sys.argv[1], int(sys.argv[2])
res = {}
for p in ("fp16", "int8", "int8fp16", "best"):
    f = f"{out}/bench_{p}.json"
    if os.path.exists(f):
        j = json.load(open(f))
        r = j["records"][0] if "records" in j else j
        res[p] = r
base = res.get("fp16")
print(f"{'engine':10} {'median ms':>10} {'images/s':>10} {'vs fp16':>8}")
for p, r in res.items():
    ms = r["latency_ms"]["median"] if "latency_ms" in r else r.get("median_ms")
    ips = b * 1000.0 / ms
    rel = (base["latency_ms"]["median"] / ms) if base and "latency_ms" in base else float("nan")
    print(f"{p:10} {ms:10.3f} {ips:10.0f} {rel:8.2f}x")
json.dump(res, open(f"{out}/edges_bench.json", "w"), indent=1)
PY

echo "== a build at shapes that cannot fit: ResNet-50 --shapes $IN:60000x3x224x224"
t0=$(date +%s.%N)
timeout 120 "$KILN" build --onnx "$M" --save-engine /tmp/huge.kiln --fp16 --shapes "$IN:60000x3x224x224" \
  >"$OUT/huge.out" 2>"$OUT/huge.err"
rc=$?
printf "rc %d in %s s, %d stderr line(s): %s\n" $rc "$(since "$t0")" \
  "$(wc -l <"$OUT/huge.err")" "$(tail -1 "$OUT/huge.err")"

# Leaving 512 MiB (the build's lower bound at batch 256 does not fit: refused before tuning) and
# 2 GiB (it fits; whatever runs out while tactics are timed must say out of GPU memory).
for spec in 512:$B 2048:64; do
  left=${spec%%:*}; batch=${spec##*:}
  echo "== a build at batch $batch on a GPU PyTorch has nearly filled (all but $left MiB held by another process)"
  python3 - "$left" <<'PY' &
import sys, time, torch
free, total = torch.cuda.mem_get_info()
hold = torch.empty(free - (int(sys.argv[1]) << 20), dtype=torch.uint8, device="cuda")
open("/tmp/edges_filled", "w").write(f"{free >> 20} {total >> 20}")
time.sleep(90)
PY
  FILLER=$!
  for i in $(seq 60); do [ -f /tmp/edges_filled ] && break; sleep 1; done
  t0=$(date +%s.%N)
  timeout 120 "$KILN" build --onnx "$M" --save-engine /tmp/full.kiln --fp16 --shapes "$IN:${batch}x3x224x224" \
    >"$OUT/full_$left.out" 2>"$OUT/full_$left.err"
  rc=$?
  printf "rc %d in %s s, %d stderr line(s): %s\n" $rc "$(since "$t0")" \
    "$(wc -l <"$OUT/full_$left.err")" "$(tail -1 "$OUT/full_$left.err")"
  kill $FILLER 2>/dev/null; wait $FILLER 2>/dev/null; rm -f /tmp/edges_filled
done
