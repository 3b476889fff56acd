#!/usr/bin/env bash
# The task benchmark on a machine of several GPUs in one device call: one bench/tasks.sh per GPU,
# each pinned to its own share of the cores (taskset), its logs and tasks.json in $OUT/gN, and
# $OUT/tasks.md the table of them all (bench/tasks.py --table). A line of the groups file is
# "GPU MODELS ARGS...":
#   0 sd15_unet --batches 1 --iters 30 --check-batch 1 --compile-batches 1
# The whole task table on four GPUs is two calls: bench/tasks_groups_a.txt, then _b.
#   KILN_DEPS_LEAN=1 bench/prepare_deps.sh && bench/tasks_wheels.sh   # here (carry .deps, .whl)
#   bench/tasks_parallel.sh [GROUPS_FILE]                              # on the device
# KILN_TASKS_TIMEOUT as for bench/tasks.sh (per group; default 540). The groups share one host:
# host-bound models (the detectors' dynamic regions) run slower than alone on a machine of one
# GPU, PyTorch's timings beside them too (each group times both in one process).
set -uo pipefail
cd "$(dirname "$0")/.."
GROUPS_FILE=${1:-bench/tasks_groups_a.txt}
[ -f "$GROUPS_FILE" ] || { echo "tasks_parallel.sh: no groups file $GROUPS_FILE" >&2; exit 1; }
. bench/device_env.sh /tmp/kiln-tasks-out >/dev/null  # unpacks .deps once, before the groups start
ROOT=$OUT
if ls .whl/diffusers-*.whl >/dev/null 2>&1; then  # installed once here, not by each group
  python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target /tmp/site \
    .whl/diffusers-*.whl || exit 1
fi
export PYTHONPATH=/tmp/site${PYTHONPATH:+:$PYTHONPATH} KILN_TASKS_NO_INSTALL=1
GPUS=$(nvidia-smi -L | wc -l)
CORES=$(nproc)
PER=$(( CORES / (GPUS > 0 ? GPUS : 1) ))
status=0
pids=()
while read -r gpu models args; do
  [[ -z "${gpu:-}" || "$gpu" == \#* ]] && continue
  if (( gpu >= GPUS )); then echo "tasks_parallel.sh: GPU $gpu named, this machine has $GPUS" >&2; status=1; continue; fi
  mkdir -p "$ROOT/g$gpu"
  echo "GPU $gpu (cores $((gpu * PER))-$((gpu * PER + PER - 1))): $models $args"
  ( CUDA_VISIBLE_DEVICES=$gpu OMP_NUM_THREADS=$PER OUT=$ROOT/g$gpu KILN_TASKS_MODELS=$models KILN_TASKS_ARGS="$args" \
      taskset -c "$((gpu * PER))-$((gpu * PER + PER - 1))" bash bench/tasks.sh >"$ROOT/g$gpu/run.log" 2>&1 ) &
  pids+=($!)
done <"$GROUPS_FILE"
for p in "${pids[@]}"; do wait "$p" || status=1; done
python3 bench/tasks.py --table "$ROOT"/g*/tasks.json | tee "$ROOT/tasks.md"
exit $status
