#!/usr/bin/env bash
# The Keras path's GPU rows (docs/keras.md): kiln's FP32, FP16 and INT8 cuda engines of the Keras
# Fashion-MNIST model as tf2onnx converted it, top-1 on the 10,000 test images (kiln compare
# --dataset), engine sizes and throughput at batch 1 and 32 (kiln bench, CUDA graphs), merged
# with the Keras and kiln cpu rows measured here into one table. The GPU machine has no
# TensorFlow: the model comes converted, with the rows measured here, in .deps/keras.
#   here:  KILN_WITH_TF=1 scripts/setup.sh && scripts/build.sh
#          python3 scripts/keras_fashion_mnist.py --out out/keras      # Keras and kiln cpu rows
#          KILN_DEPS_LEAN=1 KILN_DEPS_FMNIST=1 KILN_DEPS_KERAS=out/keras bench/prepare_deps.sh
#          (or KILN_DEPS_KERAS=docs/results/2026-11-25-keras-cpu: the model of docs/keras.md's
#          table and its rows, no TensorFlow needed)
#   there: bench/keras_gpu.sh   (carry .deps; $OUT/keras/table.md is the whole table)
#   here:  cp <files_at>/keras/kiln_cuda.json out/keras/ &&
#          python3 scripts/keras_fashion_mnist.py --mode table --out out/keras
# A few minutes: three builds (INT8 calibrates on 512 training images), top-1 of each engine on
# 10,000 images, two kiln bench batch sizes each.
set -uo pipefail
. "$(dirname "$0")/device_env.sh" "${OUT:-/tmp/kiln-keras-gpu}"  # (it probes for PyTorch's cuDNN: not under -e)
set -e
export FMNIST_DIR=${FMNIST_DIR:-$PWD/.deps/fashion-mnist}
NEED=(.deps/keras/model.onnx "$FMNIST_DIR/t10k-images-idx3-ubyte.gz")
# Calibration: the batches carried in .deps/keras/calib, else made from the training images.
[ -d .deps/keras/calib ] || NEED+=("$FMNIST_DIR/train-images-idx3-ubyte.gz")
for f in "${NEED[@]}"; do
  if [ ! -f "$f" ]; then
    echo "keras_gpu: $f is missing: run bench/prepare_deps.sh with KILN_DEPS_KERAS=out/keras KILN_DEPS_FMNIST=1"
    exit 1
  fi
done
python3 scripts/keras_fashion_mnist.py --mode kiln --backend cuda --model-dir .deps/keras \
  --out "$OUT/keras" --kiln "$KILN" 2>&1 | tee "$OUT/keras_gpu.log"
rm -rf "$OUT/keras/calib" "$OUT/keras/engines"  # remade from the dataset and the model; sizes are in the JSON
