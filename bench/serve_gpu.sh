#!/usr/bin/env bash
# `kiln serve` on the GPU machine under load, on one and two GPUs (issue 45, items 2 and 3), in
# one go (about 9 minutes on nvidia-h100-x2): exports ResNet-50 and BERT-base (random weights),
# builds FP16 engines with dynamic batch 1-64 (BERT also dynamic sequence) with the kiln CLI,
# builds kiln's Python extension for the machine's Python, then, each against a `kiln serve`
# started in the background (bounded by `timeout`, stopped after its part):
#   compare  ResNet-50 on GPU 0, 32 and 128 gRPC clients: CUDA graphs of one shape only
#            (KILN_GRAPH_SHAPES=1, kiln 0.2's executor), graphs of several shapes (the default),
#            and --pad-batches (padded to 1,2,4,...,64) with graphs; the faster of the last two
#            serves the tables below
#   tables   ResNet-50 and BERT-base (sequence 128) at 1, 8, 32, 128 clients over gRPC and HTTP,
#            --devices 0 and --devices 0,1, each row next to `kiln bench` at the batch the server
#            ran (bench/serve_load.py load)
#   soak     ResNet-50 on every GPU, 64 clients, 5% bad requests, KILN_SOAK_S seconds (default
#            120; the issue asks 600), answers checked against the engine run directly, RSS and
#            GPU memory sampled (bench/serve_load.py soak)
# Outputs under $OUT (at most 8 files come back): serve_gpu.log, tables.md, results.json (every
# row and the soak's summary and samples), soak.csv, soak.png, servers.log, builds.log, and
# mismatches.npz (the soak's answers over 2e-2, if any: serve_load.py save_mismatches).
#
# Here, before the call (once kiln is built, with libkiln.so: KILN_SHARED=ON, the default):
#   KILN_DEPS_LEAN=1 KILN_DEPS_PYTHON=1 bench/prepare_deps.sh      # .deps: CLI, libkiln.so, fmt
#   bench/serve_wheels.sh                                           # .whl: tritonclient, ...
# The call (kind nvidia-h100-x2; on one GPU the two-GPU parts are skipped):
#   run(command="bench/serve_gpu.sh", carry=[".deps", ".whl"], kind="nvidia-h100-x2")
# Knobs: KILN_SERVE_PARTS ("compare tables soak"; add "perf" for kiln perf's sweeps, the C++ load
# generator, KILN_PERF_CONCURRENCY (1:256:x2) clients per protocol; add "cost" for
# bench/serve_cost.py: the front end's CPU per request on a cpu-backend model of ResNet-50's input
# size, KILN_COST_CLIENTS (1,8,32,128) and KILN_COST_PROCS (8)),
# KILN_SERVE_MODELS ("resnet50 bert"), KILN_SOAK_S (120), KILN_LOAD_S (3, seconds measured per row), KILN_SERVE_BUDGET (540 s: parts
# that would not fit are skipped and say so), KILN_SERVE_CONTEXTS (kiln serve's default: 4 per GPU), KILN_SERVE_PAD
# (1: the tables and the soak with --pad-batches, 0: without; unset: as the comparison decides,
# without when it does not run), KILN_SERVE_DEVICES ("0 0,1": the tables' --devices),
# KILN_SERVE_PROTOCOLS (ResNet-50's tables: grpc,http; BERT's are gRPC only), KILN_SERVE_ARGS
# (extra `kiln serve` flags for every server, e.g. --spin-wait), KILN_SERVE_VARIANTS (server variants
# the tables run one after another on the same machine, ';'-separated LABEL=FLAGS, e.g.
# "block=;spin=--spin-wait": each table row set once per variant, labelled with it; default one
# variant with no extra flags), KILN_SERVE_CLIENTS (the tables' client counts, default
# serve_load.py's 1,8,32,128), KILN_SERVE_SHM (1: every table also runs its protocols through
# Triton's system shared memory extension, grpc-shm and http-shm rows beside grpc and http on the
# same server, and the soak's clients use all four; the protocol names can also be given in
# KILN_SERVE_PROTOCOLS). Batch delays against each other, for example:
# KILN_SERVE_VARIANTS="d1=--batch-delay-ms 1;d4=--batch-delay-ms 4".
set -uo pipefail
T0=$(date +%s)
. "$(dirname "$0")/device_env.sh" "${OUT:-/tmp/kiln-serve-gpu}"
exec > >(tee -a "$OUT/serve_gpu.log") 2>&1
W=/tmp/kiln-serve
mkdir -p "$W"
PARTS=${KILN_SERVE_PARTS:-compare tables soak}
MODELS=${KILN_SERVE_MODELS:-resnet50 bert}
SOAK_S=${KILN_SOAK_S:-120}
LOAD_S=${KILN_LOAD_S:-3}
BUDGET=${KILN_SERVE_BUDGET:-540}
CONTEXTS=${KILN_SERVE_CONTEXTS:-}  # empty: kiln serve's default (4 a GPU)
TABLE_DEVICES=${KILN_SERVE_DEVICES:-0 0,1}
PROTOCOLS=${KILN_SERVE_PROTOCOLS:-grpc,http}
SOAK_PROTOCOLS=grpc,http
with_shm() {  # with_shm PROTOCOLS: each protocol and, with KILN_SERVE_SHM=1, its -shm variant
  local out=$1 p
  if [ "${KILN_SERVE_SHM:-0}" = 1 ]; then
    for p in ${1//,/ }; do [[ $p == *-shm ]] || [[ ,$1, == *",$p-shm,"* ]] || out+=",$p-shm"; done
  fi
  echo "$out"
}
PROTOCOLS=$(with_shm "$PROTOCOLS")
SOAK_PROTOCOLS=$(with_shm "$SOAK_PROTOCOLS")
read -r -a EXTRA_ARGS <<<"${KILN_SERVE_ARGS:-}"
IFS=';' read -r -a VARIANTS <<<"${KILN_SERVE_VARIANTS:-=}"
HTTP=127.0.0.1:18080
GRPC=127.0.0.1:18081
SLOG=$OUT/servers.log
BLOG=$OUT/builds.log
JSONS=()
left() { echo $((BUDGET - ($(date +%s) - T0))); }
say() { echo "== [$(($(date +%s) - T0)) s] $*"; }
fits() {  # fits SECONDS WHAT: whether a part of about SECONDS still fits the budget
  if [ "$(left)" -lt "$1" ]; then say "skipped: $2 (needs ~$1 s, $(left) s left of $BUDGET)"; return 1; fi
}

nvidia-smi --query-gpu=index,name,memory.total,clocks.max.sm --format=csv,noheader
NGPU=$(nvidia-smi -L 2>/dev/null | grep -c '^GPU')
python3 --version
if [ ! -e .deps/libkiln.so ]; then
  echo "serve_gpu: .deps/libkiln.so is missing (KILN_DEPS_LEAN=1 KILN_DEPS_PYTHON=1 bench/prepare_deps.sh)"
  exit 1
fi
if ! ls .whl/tritonclient-*.whl >/dev/null 2>&1; then
  echo "serve_gpu: .whl has no tritonclient wheel (bench/serve_wheels.sh here, then carry .whl)"
  exit 1
fi

say "kiln's Python extension, and the ONNX exports beside it"
(cmake -S python -B /tmp/kiln-py -G Ninja -DCMAKE_BUILD_TYPE=Release \
   -DKILN_LIBRARY="$PWD/.deps/libkiln.so" -DKILN_INCLUDE_DIRS="$PWD/include;$PWD/.deps/include" \
   -DKILN_LINK_LIBRARIES="$PWD/.deps/libfmt.so.9" -DKILN_WITH_CUDA=ON \
   -Dnanobind_DIR="$(python3 -m nanobind --cmake_dir)" && cmake --build /tmp/kiln-py) \
  >"$W/extension_build.log" 2>&1 &
EXT=$!
JOBS=($EXT)
for m in $MODELS; do
  case $m in
    resnet50) [ -f models/resnet50.onnx ] || { python3 scripts/export_resnet50.py models/resnet50.onnx >>"$BLOG" 2>&1 & JOBS+=($!); } ;;
    bert) [ -f models/bert_base.onnx ] || { python3 scripts/export_bert.py models/bert_base.onnx >>"$BLOG" 2>&1 & JOBS+=($!); } ;;
  esac
done
# The jobs by id: a bare `wait` (bash 5.1+) also waits for the `tee` of the log's process
# substitution above, which never ends; the first GPU run hung here for its whole budget.
wait "${JOBS[@]}"
if ! ls /tmp/kiln-py/kiln/_kiln*.so >/dev/null 2>&1; then
  tail -30 "$W/extension_build.log"; echo "serve_gpu: the extension did not build"; exit 1
fi
python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade \
  --target /tmp/site .whl/*.whl || { echo "serve_gpu: the wheels did not install"; exit 1; }
export PYTHONPATH=/tmp/kiln-py:/tmp/site KILN_CLI=$KILN
python3 -c "import kiln, tritonclient.grpc, tritonclient.http, tritonclient.utils.shared_memory; print('kiln', kiln.__version__, 'GPUs', kiln.device_count())" || exit 1

say "engines (kiln build, FP16, timing cache models/timing.cache)"
declare -A ENGINE MODEL_NAME
for m in $MODELS; do
  case $m in
    resnet50) ENGINE[$m]=$W/repo_resnet50/resnet50.kiln; MODEL_NAME[$m]=resnet50
      SH="--min-shapes input:1x3x224x224 --opt-shapes input:32x3x224x224 --max-shapes input:64x3x224x224"
      ONNX=models/resnet50.onnx ;;
    bert) ENGINE[$m]=$W/repo_bert/bert.kiln; MODEL_NAME[$m]=bert
      SH="--min-shapes input_ids:1x1,attention_mask:1x1 --opt-shapes input_ids:32x128,attention_mask:32x128"
      SH="$SH --max-shapes input_ids:64x256,attention_mask:64x256"
      ONNX=models/bert_base.onnx ;;
    *) echo "serve_gpu: unknown model $m"; exit 1 ;;
  esac
  mkdir -p "$(dirname "${ENGINE[$m]}")"
  s=$(date +%s)
  # shellcheck disable=SC2086
  "$KILN" build --onnx "$ONNX" --fp16 --save-engine "${ENGINE[$m]}" $SH \
    --timing-cache models/timing.cache >>"$BLOG" 2>&1 || { tail -20 "$BLOG"; exit 1; }
  say "$m built in $(($(date +%s) - s)) s"
done

SPID=""
WATCH=""
ready() { python3 -c "import urllib.request as u; u.urlopen('http://$HTTP/v2/health/ready', timeout=2)" 2>/dev/null; }
start_server() {  # start_server MODEL LABEL [kiln serve options...]: sets SPID (the server's PID)
  local m=$1 label=$2
  shift 2
  echo "=== $label: kiln serve $(dirname "${ENGINE[$m]}") $* (${SERVER_ENV:-})" >>"$SLOG"
  # The server itself in the background (its PID for the soak's RSS samples and the rows'
  # CPU use), bounded by a watchdog: at most 800 s, and stopped by
  # stop_server after its part.
  (exec env ${SERVER_ENV:-} python3 -m kiln.cli serve "$(dirname "${ENGINE[$m]}")" \
    --host 127.0.0.1 --http-port "${HTTP##*:}" --grpc-port "${GRPC##*:}" ${CONTEXTS:+--contexts "$CONTEXTS"} \
    "${EXTRA_ARGS[@]}" "$@" >>"$SLOG" 2>&1) &
  SPID=$!
  # (its sleep ends with it: a sleep left behind kept the script's output open for 800 s)
  (trap 'kill "$S" 2>/dev/null; exit' TERM; sleep 800 & S=$!; wait "$S"; kill -TERM "$SPID" 2>/dev/null) &
  WATCH=$!
  for _ in $(seq 1 240); do
    if ready; then return 0; fi
    if ! kill -0 "$SPID" 2>/dev/null; then break; fi
    sleep 0.5
  done
  echo "serve_gpu: kiln serve did not start ($label)"; tail -20 "$SLOG"; stop_server; return 1
}
stop_server() {
  [ -n "$SPID" ] || return 0
  kill -TERM "$SPID" 2>/dev/null
  # up to 40 s: the server drains the requests it has taken
  for _ in $(seq 1 80); do kill -0 "$SPID" 2>/dev/null || break; sleep 0.5; done
  kill -KILL "$SPID" 2>/dev/null
  wait "$SPID" 2>/dev/null
  [ -n "$WATCH" ] && kill "$WATCH" 2>/dev/null
  SPID=""; WATCH=""
}
trap stop_server EXIT

load() {  # load MODEL LABEL JSON [serve_load.py options...]
  local m=$1 label=$2 json=$3
  shift 3
  python3 bench/serve_load.py load --http "$HTTP" --grpc "$GRPC" --model "${MODEL_NAME[$m]}" \
    --engine "${ENGINE[$m]}" --kiln "$KILN" --label "$label" --duration "$LOAD_S" --warmup 1 \
    --procs 8 --server-pid "${SPID:-0}" --json "$json" --md "$W/tables.md" "$@"
  JSONS+=("$json")
}

say "graphs of several shapes: batches alternating through one context agree with layer-by-layer runs"
for m in $MODELS; do
  python3 - "${ENGINE[$m]}" "$W/graphcheck_$m.json" <<'PY'
import json, sys
import numpy as np
import kiln
e = kiln.load(sys.argv[1], device=0)
def zero_sample(e):  # a batch-1 request of zeros at the profile's opt shape
    feeds = {}
    for t in e.inputs:
        prof = e.profile.get(t.name)
        shape = [d if isinstance(d, int) else int(prof["opt"][i]) for i, d in enumerate(t.shape)]
        if not isinstance(t.shape[0], int):
            shape[0] = 1
        feeds[t.name] = np.zeros(shape, dtype=np.dtype(t.dtype))
    return feeds
plain, graphs = e.create_context(), e.create_context()
plain.set_use_cuda_graph(False)
rng = np.random.default_rng(0)
base = {n: (rng.standard_normal(a.shape).astype(a.dtype) if a.dtype.kind == "f" else
            (np.ones_like(a) if "mask" in n else rng.integers(0, 1000, a.shape).astype(a.dtype)))
        for n, a in zero_sample(e).items()}
worst, calls = 0.0, 0
for b in [64, 8, 1, 8, 3, 64, 1, 3] * 4:
    feeds = {n: (np.repeat(a, b, axis=0) + a.dtype.type(b / 64) if a.dtype.kind == "f" else np.repeat(a, b, axis=0))
             for n, a in base.items()}
    want, got = plain.run(feeds), graphs.run(feeds)
    for n in want:
        w, g = want[n].astype(np.float64), got[n].astype(np.float64)
        worst = max(worst, float(np.linalg.norm(g - w) / max(np.linalg.norm(w), 1e-30)))
    calls += 1
res = {"engine": sys.argv[1], "calls": calls, "max_rel_l2_graphs_vs_layers": worst, "passed": worst < 1e-5}
print(json.dumps(res))
json.dump(res, open(sys.argv[2], "w"))
PY
  JSONS+=("$W/graphcheck_$m.json")
done

if [[ " $PARTS " == *" cost "* ]]; then
  # The front end alone: bench/serve_cost.py's model (ResNet-50's input, one Slice, cpu
  # backend), so the rows say what this machine's cores spend per request, GPU aside.
  if python3 -c "import onnx" 2>/dev/null; then
    if fits $((40 + 4 * (LOAD_S + 6))) "front-end cost"; then
      say "front end's CPU per request (bench/serve_cost.py, cpu backend)"
      { echo "### front end's CPU per request (bench/serve_cost.py)"; echo '```'
        python3 bench/serve_cost.py --clients "${KILN_COST_CLIENTS:-1,8,32,128}" \
          --duration "$LOAD_S" --procs "${KILN_COST_PROCS:-8}" --json "$W/cost.json"
        echo '```'; } | tee -a "$W/tables.md"
      JSONS+=("$W/cost.json")
    fi
  else
    say "skipped: front-end cost (no onnx package here)"
  fi
fi

PAD_FLAG=()   # what the tables run with: decided by the comparison (default: no padding)
[ "${KILN_SERVE_PAD:-}" = 1 ] && PAD_FLAG=(--pad-batches)
if [[ " $PARTS " == *" compare "* ]] && [[ " $MODELS " == *" resnet50 "* ]] && fits 100 "graphs-vs-padding comparison"; then
  say "CUDA graphs under dynamic batching: one shape's graphs, several shapes', padding"
  echo "### Graphs under dynamic batching (ResNet-50 FP16, GPU 0, gRPC)" >>"$W/tables.md"
  for mode in one_shape graphs pad_graphs; do
    case $mode in
      one_shape) SERVER_ENV="KILN_GRAPH_SHAPES=1"; FLAGS=() ;;
      graphs) SERVER_ENV=""; FLAGS=() ;;
      pad_graphs) SERVER_ENV=""; FLAGS=(--pad-batches) ;;
    esac
    start_server resnet50 "compare $mode" --devices 0 "${FLAGS[@]}" || continue
    load resnet50 "$mode" "$W/compare_$mode.json" --protocols grpc --clients 32,128
    stop_server
  done
  SERVER_ENV=""
  best=$(python3 - "$W" <<'EOF'
import json, sys
rows = {}
for mode in ("graphs", "pad_graphs"):
    try:
        r = json.load(open(f"{sys.argv[1]}/compare_{mode}.json"))["rows"]
        rows[mode] = next(x["throughput_per_s"] for x in r if x["clients"] == 128) or 0
    except (OSError, StopIteration, KeyError):
        rows[mode] = 0
print("pad_graphs" if rows["pad_graphs"] > rows["graphs"] else "graphs")
EOF
)
  say "faster at 128 clients: $best (the tables run with it)"
  if [ -z "${KILN_SERVE_PAD:-}" ] && [ "$best" = pad_graphs ]; then PAD_FLAG=(--pad-batches); fi
fi

if [[ " $PARTS " == *" tables "* ]]; then
  for m in $MODELS; do
    protos=$PROTOCOLS
    [ "$m" = bert ] && protos=$(with_shm grpc)
    for devs in $TABLE_DEVICES; do
      if [ "$devs" = 0,1 ] && [ "$NGPU" -lt 2 ]; then say "one GPU: no two-GPU table"; continue; fi
      for variant in "${VARIANTS[@]}"; do
        vlabel=${variant%%=*}
        read -r -a VFLAGS <<<"${variant#*=}"
        nprot=$(( $(tr -cd , <<<"$protos" | wc -c) + 1 ))
        need=$(( 30 + 4 * nprot * (LOAD_S + 2) ))
        fits "$need" "$m table on GPUs $devs ${vlabel}" || continue
        say "$m, --devices $devs ${PAD_FLAG[*]} ${VFLAGS[*]}"
        echo "### $m, --devices $devs ${PAD_FLAG[*]} ${EXTRA_ARGS[*]} ${VFLAGS[*]}" >>"$W/tables.md"
        start_server "$m" "$m devices $devs $vlabel" --devices "$devs" "${PAD_FLAG[@]}" \
          "${VFLAGS[@]}" || continue
        load "$m" "GPUs $devs${PAD_FLAG:+ padded}${vlabel:+, $vlabel}" \
          "$W/load_${m}_${devs/,/_}${vlabel:+_$vlabel}.json" --protocols "$protos" \
          ${KILN_SERVE_CLIENTS:+--clients "$KILN_SERVE_CLIENTS"}
        stop_server
      done
    done
  done
fi

if [[ " $PARTS " == *" perf "* ]]; then
  # kiln perf (the C++ load generator, src/perf) in place of serve_load.py's Python clients:
  # batch-1 requests at KILN_PERF_CONCURRENCY (default 1:256:x2) clients, LOAD_S seconds a
  # level, per protocol of the tables (grpc-shm, http-shm: --shared-memory system); BERT at
  # sequence 128, its attention mask all ones (perf_analyzer's JSON input data). Rows in
  # tables.md, CSV and JSON per run in $W (the JSON joins results.json).
  python3 -c "import json; json.dump({'data': [{'input_ids': {'content': [101] + [2000] * 126 + [102], 'shape': [128]},
    'attention_mask': {'content': [1] * 128, 'shape': [128]}}]}, open('$W/bert_input.json', 'w'))"
  # How many concurrency levels the range names (START:END[:STEP], STEP a number or xFACTOR).
  LEVELS=$(python3 - "${KILN_PERF_CONCURRENCY:-1:256:x2}" <<'PY'
import sys
p = sys.argv[1].split(":") + ["1"]
a, b, step = float(p[0]), float(p[1]), p[2]
n = 0
while a <= b and n < 1000:
    n += 1
    a = a * float(step[1:]) if step.startswith("x") else a + float(step)
print(max(n, 1))
PY
)
  for m in $MODELS; do
    protos=$PROTOCOLS
    data=()
    # (BERT's output, [1, 128, 768] of FP32, is open in the metadata: its shared memory size given)
    [ "$m" = bert ] && protos=$(with_shm grpc) &&
      data=(--input-data "$W/bert_input.json" --output-shared-memory-size $((128 * 768 * 4)))
    for devs in $TABLE_DEVICES; do
      if [ "$devs" = 0,1 ] && [ "$NGPU" -lt 2 ]; then say "one GPU: no two-GPU kiln perf run"; continue; fi
      nprot=$(( $(tr -cd , <<<"$protos" | wc -c) + 1 ))
      fits $(( 25 + LEVELS * nprot * (LOAD_S + 1) )) "kiln perf, $m on GPUs $devs" || continue
      start_server "$m" "$m perf devices $devs" --devices "$devs" "${PAD_FLAG[@]}" || continue
      for proto in ${protos//,/ }; do
        i=${proto%-shm}; shm=none; [[ $proto == *-shm ]] && shm=system
        url=$HTTP; [ "$i" = grpc ] && url=$GRPC
        out="$W/perf_${m}_${devs/,/_}_$proto"
        say "kiln perf: $m, --devices $devs, $proto"
        echo "### kiln perf: $m, --devices $devs ${PAD_FLAG[*]}, $proto" >>"$W/tables.md"
        { echo '```'
          "$KILN" perf -m "${MODEL_NAME[$m]}" -i "$i" -u "$url" --metrics-url "$HTTP" \
            --shared-memory "$shm" --concurrency-range "${KILN_PERF_CONCURRENCY:-1:256:x2}" \
            -p $((LOAD_S * 1000)) --time-limit $((10 * (LOAD_S + 1))) "${data[@]}" \
            --json "$out.json" -f "$out.csv" 2>&1
          echo '```'; } | tee -a "$W/tables.md"
        JSONS+=("$out.json")
      done
      stop_server
    done
  done
fi

if [[ " $PARTS " == *" soak "* ]] && [[ " $MODELS " == *" resnet50 "* ]] && fits $((SOAK_S + 30)) "soak"; then
  say "soak: ResNet-50 on every GPU, 64 clients, 5% bad requests, $SOAK_S s"
  # An FP32 engine of the same model at batch 1: each reference input's allowed rel L2 is
  # max(2e-2, 3 x the FP16 engine's own error on it against this one) (serve_load.py).
  FP32=$W/resnet50_fp32.kiln
  [ -f "$FP32" ] || "$KILN" build --onnx models/resnet50.onnx --save-engine "$FP32" \
    --min-shapes input:1x3x224x224 --opt-shapes input:1x3x224x224 --max-shapes input:1x3x224x224 \
    --timing-cache models/timing.cache >>"$BLOG" 2>&1 || { say "no FP32 reference engine"; FP32=""; }
  # The server logs its RSS and glibc's heap every 30 s into servers.log.
  SERVER_ENV="KILN_SERVE_MEMORY_LOG=30 ${SERVER_ENV:-}"
  if start_server resnet50 "soak" "${PAD_FLAG[@]}"; then
    python3 bench/serve_load.py soak --http "$HTTP" --grpc "$GRPC" --model resnet50 \
      --engine "${ENGINE[resnet50]}" --label "every GPU${PAD_FLAG:+, padded}" --clients 64 \
      --protocols "$SOAK_PROTOCOLS" \
      --duration "$SOAK_S" --bad-rate 0.05 --server-pid "$SPID" --sample-every 5 --procs 8 \
      --settle "$((SOAK_S < 120 ? SOAK_S / 2 : 60))" ${FP32:+--reference-engine "$FP32"} \
      --mismatches "$OUT/mismatches.npz" \
      --json "$W/soak.json" --csv "$OUT/soak.csv" --png "$OUT/soak.png"
    echo "soak exit status $?"
    JSONS+=("$W/soak.json")
    stop_server
  fi
  SERVER_ENV=""
fi

python3 - "$OUT/results.json" "${JSONS[@]}" <<'EOF'
import json, sys
out = {"runs": []}
for p in sys.argv[2:]:
    try:
        out["runs"].append(json.load(open(p)))
    except (OSError, ValueError) as e:
        out["runs"].append({"file": p, "error": str(e)})
json.dump(out, open(sys.argv[1], "w"), indent=1)
EOF
[ -f "$W/tables.md" ] && cp "$W/tables.md" "$OUT/tables.md" && cat "$OUT/tables.md"
say "done"
