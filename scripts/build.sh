#!/usr/bin/env bash
# Configures and builds kiln into build/ (CUDA parts when nvcc is found).
# The compiler's output goes to $BUILD_DIR/build.log; the terminal shows one progress line
# (ninja's [n/N], rewritten in place on a terminal, a line every 10% otherwise), then a summary
# with the number of warnings. On failure it prints the log's path and its last lines.
# KILN_BUILD_VERBOSE=1 shows the full output instead.
set -euo pipefail
cd "$(dirname "$0")/.."
BUILD_DIR=${KILN_BUILD_DIR:-build}
JOBS=${KILN_JOBS:-$(nproc)}
mkdir -p "$BUILD_DIR"
LOG="$(cd "$BUILD_DIR" && pwd)/build.log"
# The python3 on PATH, which the scripts and tests run, builds the Python extension (also after
# `pip install .` reused this tree from a virtual environment: scripts/test.sh).
PY_EXE=$(command -v "${PYTHON:-python3}" || true)

# The failure: from ninja's first FAILED line (the error, not the other jobs' output after it),
# else the last lines.
fail() {
  local first
  first=$(grep -n -m1 '^FAILED: ' "$LOG" | cut -d: -f1 || true)
  echo >&2
  if [ -n "$first" ]; then
    echo "build: $1; from the first failure in the log ($LOG):" >&2
    tail -n "+$first" "$LOG" | head -n "${KILN_BUILD_LOG_TAIL:-60}" >&2
  else
    echo "build: $1; the last lines of the log ($LOG):" >&2
    tail -n "${KILN_BUILD_LOG_TAIL:-60}" "$LOG" >&2
  fi
  echo "build: $1; full log: $LOG" >&2
  exit 1
}

if [ "${KILN_BUILD_VERBOSE:-0}" = "1" ]; then
  cmake -S . -B "$BUILD_DIR" -G Ninja -DCMAKE_BUILD_TYPE=${KILN_BUILD_TYPE:-Release} \
    ${PY_EXE:+-DPython_EXECUTABLE="$PY_EXE"} ${KILN_CMAKE_ARGS:-} >/dev/null
  exec cmake --build "$BUILD_DIR" -j "$JOBS"
fi

start=$SECONDS
{
  echo "== cmake configure ($(date -u '+%Y-%m-%d %H:%M:%S UTC'))"
  cmake -S . -B "$BUILD_DIR" -G Ninja -DCMAKE_BUILD_TYPE=${KILN_BUILD_TYPE:-Release} \
    ${PY_EXE:+-DPython_EXECUTABLE="$PY_EXE"} ${KILN_CMAKE_ARGS:-}
} >"$LOG" 2>&1 || fail "cmake configure failed"

tty=0
if [ -t 1 ]; then tty=1; fi
cols=$( (tput cols 2>/dev/null || echo 100) | tail -n 1)
echo "== build: $BUILD_DIR, $JOBS jobs, full log in $LOG" >>"$LOG"
echo "build: $BUILD_DIR with $JOBS jobs (compiler output in $LOG)"
set +e
cmake --build "$BUILD_DIR" -j "$JOBS" 2>&1 | {
  next=10 last=""
  while IFS= read -r line; do
    printf '%s\n' "$line" >>"$LOG"
    if [[ $line =~ ^\[([0-9]+)/([0-9]+)\]\ (.*)$ ]]; then
      n=${BASH_REMATCH[1]} total=${BASH_REMATCH[2]} what=${BASH_REMATCH[3]}
      pct=$((100 * n / total))
      last="[$n/$total] $pct%"
      if [ $tty = 1 ]; then
        msg="build: $last  $what"
        printf '\r\033[K%s' "${msg:0:$((cols - 1))}"
      elif [ "$pct" -ge "$next" ]; then
        echo "build: $last ($((SECONDS - start)) s)"
        while [ "$next" -le "$pct" ]; do next=$((next + 10)); done
      fi
    fi
  done
  if [ $tty = 1 ] && [ -n "$last" ]; then printf '\r\033[K'; fi
}
status=${PIPESTATUS[0]}
set -e
[ "$status" -eq 0 ] || fail "the build failed"
warnings=$(grep -c 'warning:' "$LOG" || true)
steps=$(grep -cE '^\[[0-9]+/[0-9]+\] ' "$LOG" || true)
echo "build: done in $((SECONDS - start)) s ($steps steps, $warnings compiler warnings; log: $LOG)"
