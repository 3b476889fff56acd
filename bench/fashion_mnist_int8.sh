#!/usr/bin/env bash
# Issue 10, point 4 on the GPU machine: train the Fashion-MNIST ResNet (PyTorch, GPU), then top-1
# on the 10k test images per precision with kiln's cuda engines, and the INT8 reference (cpu
# backend: the arithmetic GPU INT8 kernels must reproduce) on the first 2000 test images.
# Needs PyTorch and kiln ($KILN, default .deps/kiln); the dataset from Debian's dataset-fashion-mnist or a copy
# of its files in $FMNIST_DIR. Results under $OUT.
set -euo pipefail
. "$(dirname "$0")/device_env.sh" out   # OUT (default out), KILN (default .deps/kiln)
D="$OUT/fashion_mnist"
python3 scripts/train_fashion_mnist.py --out "$D" --epochs "${EPOCHS:-8}" 2>&1 | tee "$OUT/fmnist_train.log"
python3 scripts/fashion_mnist_accuracy.py --data "$D" --kiln "$KILN" --backend cuda \
  --json "$OUT/fmnist_accuracy_cuda.json" 2>&1 | tee "$OUT/fmnist_accuracy_cuda.log" || true
python3 scripts/fashion_mnist_accuracy.py --data "$D" --kiln "$KILN" --backend cpu --limit 2000 \
  --json "$OUT/fmnist_accuracy_cpu_int8_reference.json" 2>&1 | tee "$OUT/fmnist_accuracy_cpu.log" || true
rm -rf "$D/calib" "$D/test_images.npy"  # large; the model, labels and caches stay
