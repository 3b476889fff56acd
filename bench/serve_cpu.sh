#!/usr/bin/env bash
# `kiln serve`'s front end under load, on this machine (no GPU needed): a tiny model on the cpu
# backend (scripts/models/small_models.py's mlp, input [N,64], dynamic batch 1-64), whose
# inferences take microseconds, so that what bounds the request rate is the server's front end
# (receiving, decoding, batching, encoding), not the engine. Starts `kiln serve` on 127.0.0.1 only,
# drives it with bench/serve_load.py (Triton's clients, batch-1 requests, every client loop
# bounded in count and time) at 1, 8, 32 and 128 clients over gRPC and HTTP, and stops it.
#
#   PYTHONPATH=build/python bench/serve_cpu.sh [OUT_DIR]
#
# Knobs: KILN_SERVE_CLIENTS (1,8,32,128), KILN_SERVE_PROTOCOLS (grpc,http; grpc-shm and
# http-shm send the tensors through Triton's system shared memory extension, rows beside the
# plain ones: KILN_SERVE_PROTOCOLS=grpc,grpc-shm,http,http-shm), KILN_LOAD_S (4,
# seconds measured per row after 1 s of warm-up), KILN_LOAD_PROCS (1: client processes; on a
# 2-core machine the clients and the server share the cores), KILN_SERVE_ARGS (extra `kiln serve`
# flags, e.g. --contexts 4 --http-threads 2), KILN_LOAD_ARGS (extra serve_load.py flags, e.g.
# --grpc-shared-connection), KILN_SERVE_MODEL (mlp, small_cnn, or slice224: a
# ResNet-50-sized input, [N,3,224,224] FP32, of which one Slice keeps a pixel: made here).
# Outputs in OUT_DIR (default /tmp/kiln-serve-cpu): serve.log, load.json, load.md.
#
# KILN_SERVE_MODE=soak runs serve_load.py's soak instead (64 clients, 5% bad requests of the six
# kinds, the 100 MB bodies included; every answer checked against the engine run directly):
# KILN_SOAK_S seconds (300), settle 60 s, RSS per process sampled every 5 s; outputs soak.json,
# soak.csv, soak.png, mismatches.npz (if any), e.g.
#   KILN_SERVE_MODE=soak KILN_SERVE_MODEL=slice224 KILN_SERVE_ARGS=--pad-batches \
#     KILN_LOAD_PROCS=2 PYTHONPATH=build/python bench/serve_cpu.sh
set -euo pipefail
cd "$(dirname "$0")/.."
OUT=${1:-/tmp/kiln-serve-cpu}
mkdir -p "$OUT"
OUT=$(cd "$OUT" && pwd)
MODEL=${KILN_SERVE_MODEL:-mlp}
CLIENTS=${KILN_SERVE_CLIENTS:-1,8,32,128}
PROTOCOLS=${KILN_SERVE_PROTOCOLS:-grpc,http}
LOAD_S=${KILN_LOAD_S:-4}
PROCS=${KILN_LOAD_PROCS:-1}

python3 - "$OUT" "$MODEL" <<'PY'
import os, sys
sys.path.insert(0, "scripts/models")
import onnx
import kiln
import small_models

out, name = sys.argv[1], sys.argv[2]
os.makedirs(f"{out}/repo", exist_ok=True)
if name == "slice224":
    # ResNet-sized input (float32 [N,3,224,224], 602 KB a sample), negligible compute: a Slice
    # of its first pixel, [N,3,1,1] (about 30 us an inference on the cpu backend at any batch;
    # a GlobalAveragePool takes 300 us a sample there). What the server spends per request is
    # then all front end (receiving, decoding, batching, copying 602 KB, encoding).
    import numpy as np
    from onnx import TensorProto, helper, numpy_helper
    ints = lambda n, v: numpy_helper.from_array(np.array(v, np.int64), n)  # noqa: E731
    g = helper.make_graph(
        [helper.make_node("Slice", ["input", "starts", "ends", "axes"], ["output"])], name,
        [helper.make_tensor_value_info("input", TensorProto.FLOAT, ["N", 3, 224, 224])],
        [helper.make_tensor_value_info("output", TensorProto.FLOAT, ["N", 3, 1, 1])],
        initializer=[ints("starts", [0, 0]), ints("ends", [1, 1]), ints("axes", [2, 3])])
    onnx.save(helper.make_model(g, opset_imports=[helper.make_opsetid("", 13)]),
              f"{out}/{name}.onnx")
else:
    onnx.save(small_models.MODELS[name](), f"{out}/{name}.onnx")
inp = {"mlp": ("x", [64]), "small_cnn": ("input", [3, 32, 32]),
       "slice224": ("input", [3, 224, 224])}[name]
kiln.build(f"{out}/{name}.onnx", backend="cpu", min_shapes={inp[0]: [1] + inp[1]},
           opt_shapes={inp[0]: [8] + inp[1]}, max_shapes={inp[0]: [64] + inp[1]}
           ).save(f"{out}/repo/{name}.kiln")
PY

free_port() { python3 -c 'import socket; s=socket.socket(); s.bind(("127.0.0.1",0)); print(s.getsockname()[1])'; }
HTTP_PORT=$(free_port)
GRPC_PORT=$(free_port)
# shellcheck disable=SC2086
timeout 1800 python3 -m kiln.cli serve "$OUT/repo" --host 127.0.0.1 --http-port "$HTTP_PORT" \
  --grpc-port "$GRPC_PORT" ${KILN_SERVE_ARGS:-} >"$OUT/serve.log" 2>&1 &
SERVER=$!
trap 'kill "$SERVER" 2>/dev/null || true; wait "$SERVER" 2>/dev/null || true' EXIT
sleep 1
# timeout's child: kiln serve, whose CPU and memory serve_load.py samples
SERVER_PID=$(cat "/proc/$SERVER/task/$SERVER/children" 2>/dev/null | awk '{print $1}')
if [ "${KILN_SERVE_MODE:-load}" = soak ]; then
  # shellcheck disable=SC2086
  python3 bench/serve_load.py soak --model "$MODEL" --http "127.0.0.1:$HTTP_PORT" \
    --grpc "127.0.0.1:$GRPC_PORT" --protocols "$PROTOCOLS" --clients "${KILN_SERVE_CLIENTS:-64}" \
    --duration "${KILN_SOAK_S:-300}" --settle 60 --sample-every 5 --procs "$PROCS" \
    --engine "$OUT/repo/$MODEL.kiln" --reference-device -1 --server-pid "${SERVER_PID:-0}" \
    --label "cpu $MODEL" --json "$OUT/soak.json" --csv "$OUT/soak.csv" \
    --png "$OUT/soak.png" --mismatches "$OUT/mismatches.npz" ${KILN_LOAD_ARGS:-}
  exit $?
fi
rm -f "$OUT/load.md"
# shellcheck disable=SC2086
python3 bench/serve_load.py load --model "$MODEL" --http "127.0.0.1:$HTTP_PORT" \
  --grpc "127.0.0.1:$GRPC_PORT" --protocols "$PROTOCOLS" --clients "$CLIENTS" \
  --duration "$LOAD_S" --warmup 1 --procs "$PROCS" --max-requests 200000 --server-pid "${SERVER_PID:-0}" \
  --label "cpu $MODEL" --json "$OUT/load.json" --md "$OUT/load.md" ${KILN_LOAD_ARGS:-}
