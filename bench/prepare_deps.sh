#!/usr/bin/env bash
# Gathers what a device call needs into .deps/ (git-ignored; carry it): the CLI and the GPU test
# programs built here for sm_90a, libkiln.so (shared by default: the programs are small and the
# library holds kiln's GPU code once), and the shared libraries they use that the GPU machine
# lacks, packed as .deps/bundle.tar.xz (over the 64 MiB a call may carry unpacked);
# bench/device_env.sh unpacks it on the device and puts .deps on LD_LIBRARY_PATH.
set -euo pipefail
cd "$(dirname "$0")/.."
BUILD=${KILN_BUILD_DIR:-build}
# A build configured while CUTLASS or cuDNN's frontend was missing compiles their tactics out
# (KILN_HAVE_*=0) and still links: numbers measured with it are not kiln's. Refuse it unless
# KILN_DEPS_ALLOW_PARTIAL=1 says that is intended.
if [ "${KILN_DEPS_ALLOW_PARTIAL:-0}" != 1 ] && [ -f "$BUILD/build.ninja" ]; then
  for feature in KILN_HAVE_CUTLASS KILN_HAVE_CUDNN_FRONTEND; do
    if ! grep -q -- "-D$feature=1" "$BUILD/build.ninja"; then
      echo "prepare_deps: $BUILD was configured without $feature (run scripts/setup-cuda-deps.sh," \
           "then cmake $BUILD; KILN_DEPS_ALLOW_PARTIAL=1 to carry it anyway)" >&2
      exit 1
    fi
  done
fi
# A tree scripts/test.sh built without a GPU assembles the kernels at ptxas -O0: not for timing.
# KILN_DEPS_UNOPTIMIZED=1 carries it for a call that only checks correctness (tests, conformance).
if [ "${KILN_DEPS_UNOPTIMIZED:-0}" != 1 ] && grep -q '^KILN_CUDA_PTXAS_OPT:STRING=.' "$BUILD/CMakeCache.txt" 2>/dev/null; then
  echo "prepare_deps: $BUILD's kernels are assembled at ptxas -O$(grep '^KILN_CUDA_PTXAS_OPT:' \
       "$BUILD/CMakeCache.txt" | cut -d= -f2) (run scripts/build.sh with KILN_CMAKE_ARGS=-DKILN_CUDA_PTXAS_OPT=)" >&2
  exit 1
fi
STAGE=$(mktemp -d)
trap 'rm -rf "$STAGE"' EXIT
if [ "${KILN_DEPS_UNOPTIMIZED:-0}" = 1 ]; then  # bench/device_env.sh warns on the GPU machine
  echo "built with KILN_CUDA_PTXAS_OPT=$(grep '^KILN_CUDA_PTXAS_OPT:' "$BUILD/CMakeCache.txt" | cut -d= -f2)" >"$STAGE/UNOPTIMIZED"
fi
cp "$BUILD/kiln" "$STAGE/"
# KILN_DEPS_LEAN=1: the CLI alone (room in the 64 MiB for data a call carries beside it).
TESTS="kiln_backend_ops_test kiln_cuda_tactics_test kiln_cuda_engine_test kiln_cuda_compare_test kiln_cuda_calib_test kiln_timing_check"
TESTS="$TESTS kiln_cuda_int8_test kiln_int8_pw_bench kiln_gemm_f16_bench kiln_cuda_memory_test"  # kiln_cuda_host_test needs no GPU: it runs here (ctest)
[ "${KILN_DEPS_LEAN:-0}" = 1 ] && TESTS=""
for t in $TESTS; do
  for d in tests/cuda bench/kernels; do [ -x "$BUILD/$d/$t" ] && cp "$BUILD/$d/$t" "$STAGE/"; done
done
for lib in libprotobuf.so.32 libfmt.so.9 libstb.so.0; do cp -L "/lib/x86_64-linux-gnu/$lib" "$STAGE/"; done
# Every other system library the CLI loads (`kiln serve`'s grpc++ with abseil, re2, c-ares, upb
# and OpenSSL), but the C and C++ runtimes', which the GPU machine has; CUDA's resolve outside
# these folders and stay behind.
for lib in $(ldd "$BUILD/kiln" | awk '$3 ~ /^\/(usr\/)?lib\/x86_64-linux-gnu\// {print $3}'); do
  case $(basename "$lib") in
    libc.so*|libm.so*|libpthread.so*|libdl.so*|librt.so*|ld-linux*|libgcc_s.so*|libstdc++.so*) ;;
    *) cp -L "$lib" "$STAGE/$(basename "$lib")" ;;
  esac
done
# libkiln.so.X.Y (the SONAME the programs load) and its links; none when kiln is built static
# (KILN_SHARED=OFF), as each program then holds it.
if ls "$BUILD"/libkiln.so* >/dev/null 2>&1; then
  cp -P "$BUILD"/libkiln.so* "$STAGE/"
elif [ "${KILN_DEPS_PYTHON:-0}" = 1 ]; then
  echo "prepare_deps: $BUILD has no libkiln.so (built with KILN_SHARED=OFF): the Python" \
       "extension cannot be built on the GPU machine from this build" >&2
fi
# KILN_DEPS_PYTHON=1: what bench/python_gpu.sh builds kiln's Python extension against there
# (libkiln.so above, and the fmt headers kiln's public headers include).
if [ "${KILN_DEPS_PYTHON:-0}" = 1 ]; then
  mkdir -p "$STAGE/include" && cp -r /usr/include/fmt "$STAGE/include/"
  ln -sf libfmt.so.9 "$STAGE/libfmt.so"
fi
# The C++ examples built against the installed SDK (scripts/test.sh builds them into
# $BUILD/examples), for bench/examples_gpu.sh: .deps/examples/<name>/<name>.
for ex in classify batch_csv; do
  if [ -x "$BUILD/examples/$ex/$ex" ]; then
    mkdir -p "$STAGE/examples/$ex" && cp "$BUILD/examples/$ex/$ex" "$STAGE/examples/$ex/"
  fi
done
strip --strip-unneeded "$STAGE"/kiln "$STAGE"/kiln_*_test "$STAGE"/kiln_timing_check "$STAGE"/kiln_int8_pw_bench \
  "$STAGE"/libkiln.so.*.*.* 2>/dev/null || true
rm -rf .deps && mkdir -p .deps
# One xz stream with a large dictionary: with a static kiln (KILN_SHARED=OFF) the programs
# share most of their bytes (kiln's GPU code), and it finds each repeat (multi-threaded xz
# would cut it into blocks).
tar -C "$STAGE" -cf - . | xz -T1 --lzma2=preset=6,dict=192MiB > .deps/bundle.tar.xz
# KILN_DEPS_FMNIST=1: Debian's Fashion-MNIST beside the bundle (30 MB, for the int8 stage of
# bench/device_check.sh; the GPU machine has no such package).
if [ "${KILN_DEPS_FMNIST:-0}" = 1 ]; then
  mkdir -p .deps/fashion-mnist
  cp $(dpkg -L dataset-fashion-mnist | grep -E 'idx[13]-ubyte(\.gz)?$') .deps/fashion-mnist/
fi
# KILN_DEPS_KERAS=DIR: the converted Keras model and the rows measured here
# (scripts/keras_fashion_mnist.py --out DIR), for bench/keras_gpu.sh.
if [ -n "${KILN_DEPS_KERAS:-}" ]; then
  mkdir -p .deps/keras
  cp "$KILN_DEPS_KERAS/model.onnx" .deps/keras/
  for f in keras.json kiln_cpu.json; do
    if [ -f "$KILN_DEPS_KERAS/$f" ]; then cp "$KILN_DEPS_KERAS/$f" .deps/keras/; fi
  done
  # Its calibration batches (1.6 MB), when it has them: the same INT8 scales as here.
  if [ -d "$KILN_DEPS_KERAS/calib" ]; then cp -r "$KILN_DEPS_KERAS/calib" .deps/keras/; fi
fi
du -sh .deps
