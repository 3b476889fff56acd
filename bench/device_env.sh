# Sourced by the GPU-machine scripts (device_check.sh, run_suite.sh, gpu_int8.sh,
# int8_tactics.sh, gpu_attention.sh): from the repository root, unpacks the binaries
# bench/prepare_deps.sh packed into .deps, puts .deps (libkiln.so, which the programs load, and
# the libraries the GPU machine lacks) and PyTorch's cuDNN first on LD_LIBRARY_PATH (9.19 on the H100 machine, the system has 9.14: both sides of a comparison then
# run the same cuDNN; KILN_CUDNN_LIB_DIR=none keeps the system's), and sets OUT (default: the
# first argument) and KILN.
#   . "$(dirname "$0")/device_env.sh" /tmp/kiln-something
cd "$(dirname "${BASH_SOURCE[0]}")/.."
OUT=${OUT:-$1}
mkdir -p "$OUT" models
if [ -f .deps/bundle.tar.xz ] && [ ! -x .deps/kiln ]; then tar -C .deps -xJf .deps/bundle.tar.xz; fi
export LD_LIBRARY_PATH="$PWD/.deps${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH}"
export PYTHONUNBUFFERED=1
CUDNN_DIR=${KILN_CUDNN_LIB_DIR:-$(python3 -c "import os, nvidia.cudnn as c; print(os.path.join(list(c.__path__)[0], 'lib'))" 2>/dev/null)}
if [ "$CUDNN_DIR" != none ] && [ -e "$CUDNN_DIR/libcudnn.so.9" ]; then
  export LD_LIBRARY_PATH="$CUDNN_DIR:$LD_LIBRARY_PATH"
  echo "cuDNN from $CUDNN_DIR"
fi
KILN=${KILN:-$PWD/.deps/kiln}
if [ -f .deps/UNOPTIMIZED ]; then
  echo "warning: .deps holds kernels assembled without optimization (KILN_DEPS_UNOPTIMIZED=1): for correctness checks; its timings are not kiln's" >&2
fi
