#!/usr/bin/env bash
# Installs everything kiln needs to build and test, from Debian packages and PyPI.
# Idempotent and non-interactive; safe to run on every build.
set -euo pipefail

APT_PACKAGES=(
  build-essential cmake ninja-build pkg-config
  libprotobuf-dev protobuf-compiler      # ONNX's protobuf schema
  libonnx-dev                            # onnx.proto
  libonnx-testdata                       # the ONNX backend test data (conformance suite)
  libgtest-dev libgmock-dev              # unit tests
  libcli11-dev nlohmann-json3-dev libfmt-dev
  libboost-dev                           # kiln serve: the HTTP/REST front end (Boost.Beast, src/serve)
  libgrpc++-dev protobuf-compiler-grpc   # kiln serve: the gRPC front end and its generated code
  libstb-dev                             # image inputs (stb_image, stb_image_resize, stb_image_write)
  zlib1g-dev                             # gzip-compressed IDX datasets (kiln compare --dataset)
  clang libclang-rt-dev                  # scripts/fuzz.sh: sanitizer build, libFuzzer harnesses
  python3 python3-pip python3-dev       # python3-dev: the Python package's extension
  dataset-fashion-mnist                  # INT8 accuracy on labelled data (scripts/train_fashion_mnist.py)
)
PIP_PACKAGES=(numpy onnx onnxruntime matplotlib)  # matplotlib: kiln report (brings Pillow)

SUDO=""
if [ "$(id -u)" -ne 0 ]; then SUDO="sudo"; fi

missing=()
for p in "${APT_PACKAGES[@]}"; do
  if ! dpkg-query -W -f='${Status}' "$p" 2>/dev/null | grep -q "install ok installed"; then
    missing+=("$p")
  fi
done
if [ ${#missing[@]} -gt 0 ]; then
  echo "setup: installing Debian packages: ${missing[*]}"
  $SUDO apt-get update -qq
  DEBIAN_FRONTEND=noninteractive $SUDO apt-get install -y -qq --no-install-recommends "${missing[@]}" >/dev/null
fi

PY=${PYTHON:-python3}
# Installs the pip requirements of "import_name[:requirement]" items whose import fails.
pip_install_missing() {
  local need=() p req
  for p in "$@"; do
    req=${p#*:}
    if ! "$PY" -c "import ${p%%:*}" 2>/dev/null; then need+=("${req:-${p%%:*}}"); fi
  done
  [ ${#need[@]} -gt 0 ] || return 0
  echo "setup: installing Python packages: ${need[*]}"
  "$PY" -m pip install --quiet --disable-pip-version-check "${need[@]}" 2>/dev/null \
    || "$PY" -m pip install --quiet --disable-pip-version-check --break-system-packages "${need[@]}"
}
pip_install_missing "${PIP_PACKAGES[@]}"

# The Python package (python/: nanobind, scikit-build-core) and its tests: pytest, Triton's
# clients (against kiln serve), KServe (kiln.kserve), Ray Serve (kiln.ray_serve), Polygraphy
# (kiln.polygraphy).
# import name:pip requirement
pip_install_missing nanobind:nanobind scikit_build_core:scikit-build-core pytest:pytest \
  kserve:kserve tritonclient.grpc:"tritonclient[http,grpc]" ray.serve:"ray[serve]" polygraphy:polygraphy

# Optional: PyTorch for the model export scripts (scripts/export_resnet50.py, export_bert.py).
# Large; only on request.
if [ "${KILN_WITH_TORCH:-0}" = "1" ] && ! "$PY" -c "import torch, torchvision, transformers" 2>/dev/null; then
  echo "setup: installing torch, torchvision and transformers (KILN_WITH_TORCH=1)"
  "$PY" -m pip install --quiet --disable-pip-version-check torch torchvision transformers onnxscript
fi
# Optional: TensorFlow and tf2onnx for the Keras path (scripts/keras_fashion_mnist.py,
# scripts/models/keras_models.py; docs/keras.md). Large; only on request. tensorflow-cpu: the
# Keras path trains on the CPU (the GPU machine runs only the kiln half, without TensorFlow).
# These versions sit beside the onnx/onnxruntime/numpy above without pinning them back:
# tf2onnx 1.17 asks only protobuf>=3.20 and onnx>=1.14 (1.16 pinned protobuf~=3.20, which onnx
# 1.23 refuses), TensorFlow 2.21 protobuf>=6.31.1,<8 and numpy>=1.26 (numpy 2 works). Installing
# them may move protobuf from 7.x to the newest 6.x (6.33 here), which onnx, onnxruntime and the
# gRPC packages above (KServe, Triton's client: protobuf<7) all accept.
if [ "${KILN_WITH_TF:-0}" = "1" ] && ! "$PY" -c "import tensorflow, tf2onnx" 2>/dev/null; then
  echo "setup: installing tensorflow-cpu 2.21 and tf2onnx 1.17 (KILN_WITH_TF=1)"
  "$PY" -m pip install --quiet --disable-pip-version-check "tensorflow-cpu==2.21.*" "tf2onnx==1.17.*" 2>/dev/null \
    || "$PY" -m pip install --quiet --disable-pip-version-check --break-system-packages \
      "tensorflow-cpu==2.21.*" "tf2onnx==1.17.*"
fi
# Optional: the CUTLASS headers (CUTLASS tactics) and cuDNN's frontend headers (mha.cudnn)
# (KILN_WITH_CUTLASS=1).
if [ "${KILN_WITH_CUTLASS:-0}" = "1" ]; then
  "$(dirname "$0")/setup-cuda-deps.sh"
fi
echo "setup: done"
