#!/usr/bin/env bash
# The task benchmark in one device call: installs the carried diffusers wheel, then
# bench/tasks.py (exports, FP32/TF32 and FP16 engines, accuracy against ONNX Runtime, kiln
# against PyTorch eager and torch.compile). Logs, tasks.json and tasks.md go to $OUT.
#   KILN_DEPS_LEAN=1 bench/prepare_deps.sh && bench/tasks_wheels.sh   # here: .deps and .whl (carry both)
#   bench/tasks.sh                                                     # on the device
# KILN_TASKS_MODELS (a comma-separated list; default: what kiln builds today), KILN_TASKS_ARGS
# (more bench/tasks.py flags, e.g. "--batches 1,8 --iters 100 --no-compile"), KILN_TASKS_TIMEOUT
# (seconds, default 540: a device call's command has 600; no model starts in its last third, at most 200 s),
# KILN_TASKS_NO_INSTALL=1 (the diffusers wheel is installed already: bench/tasks_parallel.sh's groups).
# On a machine of several GPUs, bench/tasks_parallel.sh runs one of these per GPU.
# Each call exports its models afresh (the SD UNet: about 2-3 minutes of CPU), so a call holds a
# few models; suggested, one line per call:
#   KILN_TASKS_MODELS=sd15_unet KILN_TASKS_ARGS="--batches 1,8 --iters 30 --check-batch 1 --compile-batches 1"
#   KILN_TASKS_MODELS=sd15_text_encoder,sd15_vae_decoder,lraspp_mobilenet_v3_large KILN_TASKS_ARGS="--batches 1,8 --iters 30 --check-batch 1"
#   KILN_TASKS_MODELS=fcn_resnet50,deeplabv3_mobilenet_v3_large,r3d_18,s3d KILN_TASKS_ARGS="--batches 1,8 --iters 50"
# and, as kiln learns their ops: ssdlite320_mobilenet_v3_large,retinanet_resnet50_fpn,fcos_resnet50_fpn,
# fasterrcnn_mobilenet_v3_large_320_fpn,maskrcnn_resnet50_fpn,keypointrcnn_resnet50_fpn,yolo_like (batch 1: one
# image a call, but yolo_like), raft_small, lstm_classifier, gru_tagger.
set -uo pipefail
. "$(dirname "$0")/device_env.sh" /tmp/kiln-tasks-out
if [ -z "${KILN_TASKS_NO_INSTALL:-}" ] && ls .whl/diffusers-*.whl >/dev/null 2>&1; then  # (tasks_parallel.sh installs it once)
  python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target /tmp/site \
    .whl/diffusers-*.whl || exit 1
  export PYTHONPATH=/tmp/site${PYTHONPATH:+:$PYTHONPATH}
fi
nvidia-smi --query-gpu=name,driver_version,clocks.sm,clocks.max.sm --format=csv,noheader | tee "$OUT/gpu.txt"
python3 -c "import torch, torchvision, transformers, diffusers, onnxruntime as o; print('torch', torch.__version__, 'torchvision', torchvision.__version__, 'transformers', transformers.__version__, 'diffusers', diffusers.__version__, 'onnxruntime', o.__version__)" | tee -a "$OUT/gpu.txt"
MODELS=${KILN_TASKS_MODELS:-sd15_text_encoder,sd15_unet,sd15_vae_decoder,fcn_resnet50,deeplabv3_mobilenet_v3_large,lraspp_mobilenet_v3_large,r3d_18,s3d}
# No model starts in the last third of the time (at most 200 s): the one running can finish.
TIMEOUT=${KILN_TASKS_TIMEOUT:-540}
DEADLINE=$(( TIMEOUT - (TIMEOUT / 3 < 200 ? TIMEOUT / 3 : 200) ))
timeout "$TIMEOUT" python3 bench/tasks.py --kiln "$KILN" --out "$OUT" --work /tmp/kiln-tasks \
  --models "$MODELS" --deadline "$DEADLINE" ${KILN_TASKS_ARGS:-} 2>&1 | tee "$OUT/tasks.log"
