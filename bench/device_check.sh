#!/usr/bin/env bash
# Checks on the GPU machine that need PyTorch/torchvision or a GPU, in one call:
# the GPU unit tests, and the optimizer's goals on real exports (ResNet-50: layer count and
# -O0 vs -O2 agreement; BERT-base: recognised LayerNorm/GELU/attention).
# Expects the binaries built on the development machine in .deps/ (kiln, kiln_cuda_tactics_test
# and the shared libraries they need): docs/perf.md shows the commands that prepare them.
set -uo pipefail
cd "$(dirname "$0")/.."
OUT=${OUT:-/tmp/kiln-device-check}
mkdir -p "$OUT" models
export LD_LIBRARY_PATH="$PWD/.deps${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH}"
KILN=.deps/kiln

echo "== GPU unit tests"
.deps/kiln_cuda_tactics_test --gtest_brief=1 2>&1 | tee "$OUT/gpu_tests.log" | tail -3

echo "== ResNet-50 (torchvision, opset 17, dynamic batch)"
python3 scripts/export_resnet50.py models/resnet50.onnx 2>&1 | tail -2
for lvl in 0 2; do
  $KILN build --onnx models/resnet50.onnx --save-engine "$OUT/r50_O$lvl.kiln" --opt-level $lvl \
    --shapes input:1x3x224x224 >/dev/null || exit 1
  $KILN inspect "$OUT/r50_O$lvl.kiln" --json >"$OUT/r50_O$lvl.json"
  python3 -c "import json,collections,sys; j=json.load(open(sys.argv[1])); c=collections.Counter(l['type'] for l in j['layers']); print('-O$lvl', len(j['layers']), 'layers:', dict(c))" "$OUT/r50_O$lvl.json"
done
python3 scripts/compare_opt_levels.py --kiln $KILN --onnx models/resnet50.onnx --shapes input:2x3x224x224 --dynamic 2>&1 | tail -2

echo "== BERT-base (transformers, opset 17, dynamic batch and sequence)"
python3 scripts/export_bert.py models/bert_base.onnx 2>&1 | tail -2
$KILN build --onnx models/bert_base.onnx --save-engine "$OUT/bert.kiln" >/dev/null || exit 1
$KILN inspect "$OUT/bert.kiln" --json >"$OUT/bert.json"
python3 -c "import json,collections,sys; j=json.load(open(sys.argv[1])); c=collections.Counter(l['type'] for l in j['layers']); print(len(j['layers']), 'layers; attention', c['kiln.Attention'], 'layernorm', c['LayerNormalization'], 'gelu (as FusedGemm activation or Gelu)', sum(1 for l in j['layers'] if l['type']=='Gelu' or ('Erf' in ' '.join(l['onnx_nodes']))))" "$OUT/bert.json"
