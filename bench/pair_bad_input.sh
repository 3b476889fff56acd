#!/usr/bin/env bash
# Bad input against an INT8 engine with a kiln.FusedConvPair (one device call): a block shaped
# like ResNet's first bottleneck block of stage 1 (3x3 -> expand 64->256, + downsample 64->256,
# ReLU, then a mean), exported with PyTorch on the GPU machine, built --int8 on random
# calibration batches; then `kiln run` with the right input, a wrong shape, float64, a missing
# file, and a truncated engine. Each bad run must give a one-line error and exit status 1.
#   bench/prepare_deps.sh            # here (carry ".deps")
#   bench/pair_bad_input.sh          # on the GPU machine; logs in $OUT
set -uo pipefail
. "$(dirname "$0")/device_env.sh" /tmp/kiln-pair-bad-input
python3 - <<'PY'
import os, numpy as np, torch
class Block(torch.nn.Module):
    def __init__(s):
        super().__init__()
        s.c = torch.nn.Conv2d(64, 64, 3, 1, 1)
        s.e = torch.nn.Conv2d(64, 256, 1)
        s.d = torch.nn.Conv2d(64, 256, 1)
    def forward(s, x):
        return torch.relu(s.e(torch.relu(s.c(x))) + s.d(x)).mean((2, 3))
torch.onnx.export(Block().eval(), (torch.randn(2, 64, 56, 56),), "/tmp/pair.onnx",
                  input_names=["x"], output_names=["y"], dynamo=False)
r = np.random.default_rng(3)
os.makedirs("/tmp/pair_calib", exist_ok=True)
for i in range(4):
    np.save(f"/tmp/pair_calib/{i}.npy", r.random((2, 64, 56, 56), dtype=np.float32))
np.save("/tmp/pair_ok.npy", r.random((2, 64, 56, 56), dtype=np.float32))
np.save("/tmp/pair_shape.npy", r.random((2, 64, 28, 56), dtype=np.float32))
np.save("/tmp/pair_f64.npy", r.random((2, 64, 56, 56)))
PY
"$KILN" build --onnx /tmp/pair.onnx --int8 --fp16 --calib /tmp/pair_calib --save-engine /tmp/pair.kiln \
  >"$OUT/pair_build.log" 2>&1
echo "build rc $?; pair layers: $("$KILN" inspect /tmp/pair.kiln | grep -c 'kiln.FusedConvPair .*conv_int8.pair')"
"$KILN" run --engine /tmp/pair.kiln --input x=/tmp/pair_ok.npy >/dev/null 2>&1; echo "good input rc $?"
for f in shape f64 missing; do
  "$KILN" run --engine /tmp/pair.kiln --input x=/tmp/pair_$f.npy 2>&1 | tail -2; echo "$f rc ${PIPESTATUS[0]}"
done
head -c 20000 /tmp/pair.kiln >/tmp/pair_cut.kiln
"$KILN" run --engine /tmp/pair_cut.kiln --input x=/tmp/pair_ok.npy 2>&1 | tail -2; echo "truncated rc ${PIPESTATUS[0]}"
