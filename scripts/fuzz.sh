#!/usr/bin/env bash
# Sanitizer build, sanitized CPU unit tests and fuzzing (tests/fuzz/README.md).
#
#   scripts/fuzz.sh [--build-only] [--no-build] [--no-unit] [--no-fuzz] [--seconds N]
#
# Builds the host code and the CPU backend (KILN_CUDA=OFF, no Python extension) with Debian's
# clang, AddressSanitizer, UndefinedBehaviorSanitizer and libFuzzer's instrumentation into
# $KILN_FUZZ_BUILD_DIR (default build-fuzz): libkiln, the kiln CLI, the unit tests and the three
# libFuzzer harnesses, one tree for all. Then runs the CPU unit tests under the sanitizers, makes
# the seed corpora (tests/fuzz/make_corpus.py) and runs each harness for N seconds (default 60):
# fuzz_onnx_import, fuzz_engine_load, fuzz_build and fuzz_serve_requests (the C++ `kiln serve`'s
# REST and gRPC request decoding). Any crash, sanitizer report, leak, hang (-timeout) or finding fails the script;
# the input that caused it is in $KILN_FUZZ_BUILD_DIR/fuzz-artifacts/. scripts/test.sh calls it.
set -euo pipefail
cd "$(dirname "$0")/.."
B=${KILN_FUZZ_BUILD_DIR:-build-fuzz}
JOBS=${KILN_JOBS:-$(nproc)}
SECONDS_EACH=60
build=1 unit=1 fuzz=1
while [ $# -gt 0 ]; do
  case "$1" in
    --build-only) unit=0 fuzz=0 ;;
    --no-build) build=0 ;;
    --no-unit) unit=0 ;;
    --no-fuzz) fuzz=0 ;;
    --seconds) SECONDS_EACH=$2; shift ;;
    *) echo "fuzz.sh: unknown argument $1" >&2; exit 1 ;;
  esac
  shift
done

step_start=0
step() { step_start=$(date +%s); echo "== fuzz.sh: $* =="; }
took() { echo "fuzz.sh: $1 took $(( $(date +%s) - step_start )) s"; }

if [ $build = 1 ]; then
  step "sanitizer build (clang, ASan+UBSan+libFuzzer instrumentation) in $B"
  # -O0 by default: the instrumented tree builds about three times faster than at -O1 (the
  # sanitizers' usual level), which keeps scripts/test.sh within CI's time; the sanitizers find
  # the same errors, the harnesses run fewer inputs a second. KILN_FUZZ_OPT=-O1 for long runs.
  OPT=${KILN_FUZZ_OPT:--O0}
  cmake -S . -B "$B" -G Ninja -DCMAKE_C_COMPILER=clang -DCMAKE_CXX_COMPILER=clang++ \
    -DCMAKE_BUILD_TYPE=RelWithDebInfo "-DCMAKE_CXX_FLAGS_RELWITHDEBINFO=$OPT -gline-tables-only" \
    "-DCMAKE_C_FLAGS_RELWITHDEBINFO=$OPT -gline-tables-only" \
    -DKILN_CUDA=OFF -DKILN_PYTHON=OFF -DKILN_FUZZ=ON >/dev/null
  cmake --build "$B" -j "$JOBS"
  took "the sanitizer build"
fi

export ASAN_OPTIONS=${ASAN_OPTIONS:-detect_leaks=1:abort_on_error=1:strict_string_checks=1}
export UBSAN_OPTIONS=${UBSAN_OPTIONS:-print_stacktrace=1:halt_on_error=1}

if [ $unit = 1 ]; then
  step "CPU unit tests under AddressSanitizer and UndefinedBehaviorSanitizer"
  # Timing checks (Conv.ResNetSizedLayerIsFast: under 2 s at -O3) do not hold under ASan.
  ctest --test-dir "$B" -L unit -E 'IsFast$' --output-on-failure -j "$JOBS"
  took "the sanitized unit tests"
fi

if [ $fuzz = 1 ]; then
  step "seed corpora"
  python3 tests/fuzz/make_corpus.py --kiln "$B/kiln" --out "$B/fuzz-corpus"
  took "the corpora"
  mkdir -p "$B/fuzz-artifacts"
  for h in fuzz_onnx_import:onnx fuzz_engine_load:engine fuzz_build:onnx fuzz_serve_requests:serve; do
    name=${h%%:*} seeds=$B/fuzz-corpus/${h#*:}
    step "$name for $SECONDS_EACH s"
    mkdir -p "$B/fuzz-work/$name"
    # New inputs go to fuzz-work/NAME (kept between runs), the generated seeds are read only.
    log=$B/fuzz-work/$name.log
    if ! "$B/tests/fuzz/$name" -max_total_time="$SECONDS_EACH" -timeout=10 -rss_limit_mb=2048 \
        -print_final_stats=1 -artifact_prefix="$B/fuzz-artifacts/$name-" \
        "$B/fuzz-work/$name" "$seeds" >"$log" 2>&1; then
      grep -v '^#[0-9]' "$log" | tail -80
      echo "fuzz.sh: $name found a problem (above; the input is in $B/fuzz-artifacts/)" >&2
      exit 1
    fi
    grep -E '^stat::number_of_executed_units|^Done' "$log"
    took "$name"
  done
fi
