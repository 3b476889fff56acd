"""`kiln serve MODEL_REPOSITORY`: every engine in a folder behind KServe's ModelServer, speaking
the Open Inference Protocol (v2) over REST and gRPC, so Triton and KServe clients work unchanged.

A model repository holds engine files: NAME.kiln, or NAME/model.kiln (NAME is the model's name).
Each model keeps several execution contexts on each GPU (--devices: the engine is loaded once
per device) and joins concurrent requests into one inference (kiln.batching), padded to a few
batch sizes with --pad-batches. Counters per model on /metrics (Prometheus), beside KServe's
own: kiln_requests_total, kiln_inferences_total, kiln_batched_requests_total,
kiln_largest_batch, kiln_samples_total, kiln_padded_samples_total, and per batch size run and
per device kiln_batch_inferences_total{batch} and kiln_device_inferences_total{device}.

Inference requests for kiln models skip KServe's generic conversion: gRPC ModelInfer takes the
serialized message (no deserializer), reads the raw tensors out of it in place and parses only
the rest (split_grpc_request), decodes it itself (decode_grpc_request) and writes the serialized
response directly (encode_grpc_response_bytes), and REST POST /v2/models/NAME/infer is answered
in front of FastAPI (_LeanRest: read_rest_body, decode_rest_request, encode_rest_response); the
rest of the protocol is KServe's, but for Triton's system shared memory extension (kiln.shm:
regions registered once, then inputs read from and outputs written into them), which KServe
has not.

The process keeps freed blocks of up to 32 MB for reuse (tune_malloc): request tensors are
otherwise an mmap, page faults and a munmap each (bench/serve_cost.py measures the front end's
CPU per request), in one arena for every thread, which gives back what it keeps free past 32 MB
at its top, so RSS stays flat under a long load (KILN_SERVE_TRIM_S=SECONDS also gives back the
free pages within it that often: trim_memory). KILN_SERVE_MEMORY_LOG=SECONDS logs the
process's RSS and glibc's arenas (in use, free, per arena) that often, with
KILN_SERVE_TRACEMALLOC=FRAMES the Python allocation sites that grew most too (watch_memory).

`--workers N` runs N such servers as processes on the same ports, under the one started
(kiln.serve_workers); with `--batcher device` they are front ends that forward each request to
one batcher process per device, which joins every front end's requests.
"""
from __future__ import annotations

import argparse
import asyncio
import functools
import importlib.util
import logging
import os
import sys
from typing import Optional

import numpy as np

from kiln import shm
from kiln._kiln import KilnError
from kiln.batching import (V2_DATATYPES, Batcher, RequestError, batch_limit, check_request,
                           default_contexts, parse_devices, parse_pad_sizes, set_gpu_wait)
from kiln.engine import Engine, device_count, load

log = logging.getLogger("kiln.serve")


def find_models(repository: str) -> dict[str, str]:
    """Model name -> engine file, for NAME.kiln and NAME/model.kiln in `repository`."""
    if not os.path.isdir(repository):
        raise FileNotFoundError(f"model repository '{repository}' is not a folder")
    found = {}
    for entry in sorted(os.listdir(repository)):
        path = os.path.join(repository, entry)
        if entry.endswith(".kiln") and os.path.isfile(path):
            found[entry[: -len(".kiln")]] = path
        elif os.path.isfile(os.path.join(path, "model.kiln")):
            found[entry] = os.path.join(path, "model.kiln")
    return found


def tensor_metadata(infos) -> list[dict]:
    """Inputs or outputs as v2 model metadata lists them (-1 for a dynamic dimension)."""
    return [{"name": t.name, "datatype": V2_DATATYPES.get(t.dtype, t.dtype.upper()),
             "shape": [d if isinstance(d, int) else -1 for d in t.shape]} for t in infos]


def decode_request(payload, engine: Engine, batching: bool) -> dict[str, np.ndarray]:
    """The input arrays of a v2 request (kserve's InferRequest), checked against the engine;
    RequestError says what does not fit."""
    from kserve.protocol.infer_type import InferRequest

    if not isinstance(payload, InferRequest):
        raise RequestError("kiln models take Open Inference Protocol (v2) requests")
    feeds = {}
    for inp in payload.inputs:
        if not isinstance(inp.name, str) or not isinstance(inp.datatype, str):
            raise RequestError(f"input {inp.name!r}: the name and datatype must be strings")
        if inp.datatype not in V2_DATATYPES.values() or inp.datatype == "BF16":
            raise RequestError(f"input '{inp.name}': datatype {inp.datatype} is not one kiln takes")
        if inp.name in feeds:
            raise RequestError(f"input '{inp.name}' given twice")
        try:
            feeds[inp.name] = inp.as_numpy()
        except (ValueError, TypeError, ArithmeticError) as e:  # data unlike its shape or datatype
            raise RequestError(f"input '{inp.name}': {e}") from None
    check_request(engine, feeds, batching)
    return feeds


def encode_response(payload, out: dict[str, np.ndarray], model_name: str):
    """A v2 response (kserve's InferResponse) with the outputs the request asked for (all when
    it names none), binary when the request wants binary outputs."""
    from kserve.protocol.infer_type import InferOutput, InferResponse

    wanted = [o.name for o in payload.request_outputs] if payload.request_outputs else list(out)
    outputs = []
    for name in wanted:
        if name not in out:
            raise RequestError(f"unknown output '{name}' (the model's outputs: {', '.join(out)})")
        arr = np.ascontiguousarray(out[name])
        o = InferOutput(name=name, shape=list(arr.shape), datatype=V2_DATATYPES[arr.dtype.name])
        o.set_data_from_numpy(arr, binary_data=payload.use_binary_outputs)
        outputs.append(o)
    return InferResponse(response_id=payload.id or "", model_name=model_name,
                         infer_outputs=outputs, use_binary_outputs=payload.use_binary_outputs)


# What a worker of `kiln serve --workers` answers to the repository extension's load and unload,
# which would change that worker's models only.
REPOSITORY_FIXED = ("kiln serve --workers: models are not loaded or unloaded while serving "
                    "(each worker would do it alone); restart the server to change them")
# The gRPC method the lean path serves (_InferenceServicer.ModelInfer).
GRPC_MODEL_INFER = "/inference.GRPCInferenceService/ModelInfer"
# v2 datatype -> NumPy type, for the datatypes kiln takes (not BF16, BYTES)
_NP_OF_V2 = {v: np.dtype(k) for k, v in V2_DATATYPES.items() if v != "BF16"}
# NumPy type -> v2 datatype (dtype.name, a Python property of NumPy's, takes about 5 us)
_V2_OF_NP = {d: v for v, d in _NP_OF_V2.items()}


def _v2_datatype(dtype: np.dtype) -> str:
    """The v2 datatype of a NumPy type (KeyError for one the protocol has none of)."""
    v2 = _V2_OF_NP.get(dtype)
    return v2 if v2 is not None else V2_DATATYPES[dtype.name]


# v2 datatype -> the InferTensorContents field its values come in (FP16: raw contents only)
_CONTENTS_FIELD = {"BOOL": "bool_contents", "UINT8": "uint_contents", "UINT16": "uint_contents",
                   "UINT32": "uint_contents", "UINT64": "uint64_contents",
                   "INT8": "int_contents", "INT16": "int_contents", "INT32": "int_contents",
                   "INT64": "int64_contents", "FP32": "fp32_contents", "FP64": "fp64_contents"}


def _element_count(name: str, shape: list, itemsize: int) -> int:
    """The number of elements of a request's shape (sizes >= 0, checked by the caller);
    RequestError when NumPy could not hold it: it refuses a shape whose nonzero sizes times the
    element size pass int64, even with zero elements."""
    count, nonzero = 1, itemsize
    for d in shape:
        count *= d
        nonzero *= max(d, 1)
    if nonzero > _MAX_BYTES:
        raise RequestError(f"input '{name}': shape {shape} is too large")
    return count


_MAX_BYTES = int(np.iinfo(np.intp).max)


# ModelInferRequest's raw_input_contents (field 7, length-delimited) as a protobuf tag
_RAW_INPUT_TAG = (7 << 3) | 2


def _varint(body, pos: int, end: int) -> tuple[int, int]:
    value = shift = 0
    while True:
        if pos >= end:
            raise RequestError("malformed request: the protobuf message is truncated")
        b = body[pos]
        pos += 1
        value |= (b & 0x7F) << shift
        if b < 0x80:
            return value, pos
        shift += 7
        if shift > 63:
            raise RequestError("malformed request: a protobuf varint is over 10 bytes")


def split_grpc_request(body: bytes) -> tuple[object, list]:
    """A serialized ModelInferRequest as (the message without its raw_input_contents, parsed;
    each raw_input_contents as a memoryview of `body`, in order). protobuf would copy every raw
    tensor twice (into the parsed message, then into the bytes object that indexing
    raw_input_contents makes): 602 KB for a ResNet-50 sample, under the event loop's GIL.
    Here only the small fields are parsed, and the tensors stay where gRPC put them.
    RequestError when the message is not a well-formed ModelInferRequest."""
    view = memoryview(body)
    end = len(body)
    pos, rest, raw = 0, [], []
    while pos < end:
        start = pos
        key = body[pos]  # a one-byte varint read here (every field number below 16)
        if key < 0x80:
            pos += 1
        else:
            key, pos = _varint(body, pos, end)
        wire = key & 7
        if wire == 2:
            if pos < end and body[pos] < 0x80:
                size = body[pos]
                pos += 1
            else:
                size, pos = _varint(body, pos, end)
            if pos + size > end:
                raise RequestError("malformed request: the protobuf message is truncated")
            if key == _RAW_INPUT_TAG:
                raw.append(view[pos:pos + size])
                pos += size
                continue
            pos += size
        elif wire == 0:
            _, pos = _varint(body, pos, end)
        elif wire == 1:
            pos += 8
        elif wire == 5:
            pos += 4
        else:
            raise RequestError(f"malformed request: protobuf wire type {wire} is not one a "
                               "ModelInferRequest has")
        if pos > end:
            raise RequestError("malformed request: the protobuf message is truncated")
        if rest and rest[-1][1] == start:  # contiguous with the last: one slice
            rest[-1] = (rest[-1][0], pos)
        else:
            rest.append((start, pos))
    if len(rest) == 1:
        rest = body[rest[0][0]:rest[0][1]] if rest[0] != (0, end) else body
    else:
        rest = b"".join([view[a:b] for a, b in rest])
    pb, decode_error = _protobuf()
    try:
        request = pb.ModelInferRequest.FromString(rest)
    except decode_error as e:
        raise RequestError(f"malformed request: {e}") from None
    return request, raw


@functools.lru_cache(maxsize=None)
def _protobuf():
    """(KServe's v2 protobuf module, protobuf's DecodeError), imported once: an import statement
    in a function costs the import machinery at every call (about 2% of the event loop's time
    per gRPC request)."""
    from google.protobuf.message import DecodeError
    from kserve.protocol.grpc import grpc_predict_v2_pb2 as pb

    return pb, DecodeError


@functools.lru_cache(maxsize=None)
def _orjson():
    import orjson

    return orjson


def decode_grpc_request(request, engine: Engine, batching: bool,
                        raw=None) -> dict[str, np.ndarray]:
    """The input arrays of a gRPC ModelInferRequest (the protobuf message itself, not KServe's
    InferRequest made of it), checked against the engine; RequestError says what does not fit.
    raw_input_contents (what Triton's clients send; `raw` when split_grpc_request took them
    out of the message) become arrays over the message's bytes (np.frombuffer, no copy); typed
    `contents` are converted once per input."""
    if raw is None:
        raw = request.raw_input_contents
    n_raw = len(raw)
    inputs = request.inputs
    # Inputs in shared memory (the system shared memory extension) take no raw_input_contents:
    # those are the other inputs', in order, as Triton reads them.
    regions = [shm.grpc_params(t.parameters) if t.parameters else None for t in inputs]
    n_shm = len(regions) - regions.count(None)
    if n_raw and n_raw != len(inputs) - n_shm:
        if n_shm and n_raw > len(inputs) - n_shm:
            first = next(t.name for t, r in zip(inputs, regions) if r is not None)
            raise RequestError(f"input '{first}': both raw_input_contents and "
                               f"{shm.REGION} given ({len(inputs)} inputs, {n_shm} in shared "
                               f"memory, and {n_raw} raw_input_contents)")
        raise RequestError(f"{len(inputs)} inputs and {n_raw} raw_input_contents: with "
                           "raw contents there must be one per input, in the inputs' order")
    feeds = {}
    next_raw = 0
    for i, t in enumerate(inputs):
        name, datatype = t.name, t.datatype
        dtype = _NP_OF_V2.get(datatype)
        if dtype is None:
            raise RequestError(f"input '{name}': datatype {datatype} is not one kiln takes")
        if name in feeds:
            raise RequestError(f"input '{name}' given twice")
        shape = list(t.shape)
        if shape and min(shape) < 0:  # (a generator here cost 1.5% of the event loop's time)
            raise RequestError(f"input '{name}': shape {shape} is not a list of sizes")
        count = _element_count(name, shape, dtype.itemsize)
        if regions[i] is not None:
            if t.HasField("contents"):
                raise RequestError(f"input '{name}': both contents and {shm.REGION} given")
            a = shm.registry().input_array(f"input '{name}'", regions[i], dtype, shape, count,
                                           datatype)
        elif n_raw:
            if t.HasField("contents"):
                raise RequestError(f"input '{name}': both contents and raw_input_contents given")
            data = raw[next_raw]
            next_raw += 1
            if len(data) != count * dtype.itemsize:
                raise RequestError(f"input '{name}': {len(data)} bytes of raw_input_contents, "
                                   f"shape {shape} of {datatype} takes {count * dtype.itemsize}")
            a = np.frombuffer(data, dtype).reshape(shape)
        else:
            field = _CONTENTS_FIELD.get(datatype)
            if field is None:
                raise RequestError(f"input '{name}': {datatype} data must come in "
                                   "raw_input_contents")
            values = getattr(t.contents, field)
            if len(values) != count:
                raise RequestError(f"input '{name}': {len(values)} values in contents.{field}, "
                                   f"shape {shape} takes {count}")
            try:
                a = np.array(values, dtype=dtype).reshape(shape)
            except (OverflowError, ValueError, TypeError) as e:  # out of the datatype's range
                raise RequestError(f"input '{name}': {e}") from None
        feeds[name] = a
    check_request(engine, feeds, batching)
    return feeds


def encode_grpc_response(request, out: dict[str, np.ndarray], model_name: str):
    """A ModelInferResponse with the outputs the request asked for (all when it names none),
    each in raw_output_contents, as Triton answers."""
    from kserve.protocol.grpc import grpc_predict_v2_pb2 as pb

    wanted = [o.name for o in request.outputs] or list(out)
    response = pb.ModelInferResponse(model_name=model_name, id=request.id)
    for name in wanted:
        if name not in out:
            raise RequestError(f"unknown output '{name}' (the model's outputs: {', '.join(out)})")
        arr = np.ascontiguousarray(out[name])
        t = response.outputs.add()
        t.name = name
        t.datatype = _v2_datatype(arr.dtype)
        t.shape.extend(arr.shape)
        response.raw_output_contents.append(arr.tobytes())
    return response


def _put_varint(n: int) -> bytes:
    """A protobuf varint (n >= 0; a negative int64 as its two's complement, 10 bytes)."""
    if n < 0:
        n += 1 << 64
    if n < 0x80:
        return _SMALL_VARINTS[n]
    out = bytearray()
    while n >= 0x80:
        out.append((n & 0x7F) | 0x80)
        n >>= 7
    out.append(n)
    return bytes(out)


_SMALL_VARINTS = [bytes([i]) for i in range(0x80)]


def _string_field(number: int, text: str) -> bytes:
    """A protobuf string field (proto3: nothing when empty)."""
    if not text:
        return b""
    data = text.encode()
    return _put_varint((number << 3) | 2) + _put_varint(len(data)) + data


# ModelInferResponse's fields, as protobuf tags
_RESPONSE_OUTPUT_TAG = bytes([(5 << 3) | 2])      # outputs (InferOutputTensor)
_RESPONSE_RAW_TAG = bytes([(6 << 3) | 2])         # raw_output_contents
# (output name, v2 datatype, shape) -> its serialized InferOutputTensor field in a response
_OUTPUT_FIELDS: dict = {}


def _output_field(name: str, datatype: str, shape: tuple) -> bytes:
    key = (name, datatype, shape)
    field = _OUTPUT_FIELDS.get(key)
    if field is None:
        dims = b"".join(_put_varint(d) for d in shape)
        tensor = (_string_field(1, name) + _string_field(2, datatype)
                  + (b"\x1a" + _put_varint(len(dims)) + dims if dims else b""))
        field = _RESPONSE_OUTPUT_TAG + _put_varint(len(tensor)) + tensor
        if len(_OUTPUT_FIELDS) >= 1024:  # shapes vary (batches, sequence lengths): bounded
            _OUTPUT_FIELDS.clear()
        _OUTPUT_FIELDS[key] = field
    return field


def grpc_output_regions(request) -> Optional[dict]:
    """{output name: (region, byte_size, offset)} for the outputs a ModelInferRequest asks to
    be written into shared memory, each checked to lie within its region (before the
    inference: a bad region costs none); None when none is."""
    found = None
    for o in request.outputs:
        params = shm.grpc_params(o.parameters) if o.parameters else None
        if params is not None:
            shm.registry().check_output(f"output '{o.name}'", params)
            if found is None:
                found = {}
            found[o.name] = params
    return found


def encode_grpc_response_bytes(request, out: dict[str, np.ndarray], model_name: str,
                               regions: Optional[dict] = None) -> bytes:
    """encode_grpc_response(...).SerializeToString(), the same bytes, written directly: each
    output's InferOutputTensor is serialized once per name, datatype and shape and kept, and
    each output's data is copied once, into the response (not into a bytes object first, then
    into protobuf's message, then into its serialization). The message ModelInfer returns.
    An output in `regions` (grpc_output_regions) is written into its shared memory region and
    answered with its name, datatype and shape and empty raw contents, as Triton answers (its
    clients index raw_output_contents by the output's place among the outputs)."""
    names = request.outputs
    wanted = [o.name for o in names] if names else list(out)
    parts = [_string_field(1, model_name), _string_field(3, request.id)]
    data = []
    for name in wanted:
        if name not in out:
            raise RequestError(f"unknown output '{name}' (the model's outputs: {', '.join(out)})")
        arr = np.ascontiguousarray(out[name])
        datatype = _v2_datatype(arr.dtype)
        parts.append(_output_field(name, datatype, arr.shape))
        data.append(_RESPONSE_RAW_TAG)
        if regions is not None and name in regions:
            shm.registry().write_output(f"output '{name}'", regions[name], arr, datatype)
            data.append(b"\x00")  # empty raw contents
            continue
        data.append(_put_varint(arr.nbytes))
        if arr.nbytes:
            data.append(arr.reshape(-1).view(np.uint8))  # bytes.join reads it in place
    return b"".join(parts + data)


def decode_rest_request(header, body: bytes, start: int, engine: Engine,
                        batching: bool) -> dict[str, np.ndarray]:
    """The input arrays of a v2 REST request whose JSON part (`header`, parsed) is already read:
    each input's `data` (a flat or nested JSON list) or, with the binary-data extension, its
    parameters.binary_data_size bytes of `body` from `start` on, in the inputs' order (viewed,
    not copied). Checked against the engine; RequestError says what does not fit."""
    if not isinstance(header, dict) or not isinstance(header.get("inputs"), list):
        raise RequestError("malformed request: the body must be a JSON object with an 'inputs' "
                           "list")
    feeds = {}
    for t in header["inputs"]:
        if not isinstance(t, dict):
            raise RequestError("malformed request: each input must be a JSON object")
        name, datatype, shape = t.get("name"), t.get("datatype"), t.get("shape")
        if not isinstance(name, str) or not isinstance(datatype, str):
            raise RequestError(f"input {name!r}: the name and datatype must be strings")
        dtype = _NP_OF_V2.get(datatype)
        if dtype is None:
            raise RequestError(f"input '{name}': datatype {datatype} is not one kiln takes")
        if name in feeds:
            raise RequestError(f"input '{name}' given twice")
        if not isinstance(shape, list) or not all(type(d) is int and d >= 0 for d in shape):
            raise RequestError(f"input '{name}': shape {shape} is not a list of sizes")
        count = _element_count(name, shape, dtype.itemsize)
        params = t.get("parameters")
        size = params.get("binary_data_size") if isinstance(params, dict) else None
        data = t.get("data")
        region = shm.rest_params(params)
        if region is not None:
            if data is not None or size is not None:
                given = "data" if data is not None else "binary_data_size"
                raise RequestError(f"input '{name}': both {given} and {shm.REGION} given")
            a = shm.registry().input_array(f"input '{name}'", region, dtype, shape, count,
                                           datatype)
        elif data is not None:
            if size is not None:
                raise RequestError(f"input '{name}': both data and binary_data_size given")
            try:
                a = np.array(data, dtype=dtype)
            except (ValueError, TypeError, OverflowError, RecursionError) as e:
                raise RequestError(f"input '{name}': {e}") from None
            if a.size != count:
                raise RequestError(f"input '{name}': {a.size} values in data, shape {shape} "
                                   f"takes {count}")
            a = a.reshape(shape)
        elif size is not None:
            if type(size) is not int or size < 0 or start + size > len(body):
                raise RequestError(f"input '{name}': binary_data_size {size} is not within the "
                                   f"{len(body) - start} bytes left in the body")
            if size != count * dtype.itemsize:
                raise RequestError(f"input '{name}': binary_data_size {size}, shape {shape} of "
                                   f"{datatype} takes {count * dtype.itemsize}")
            a = np.frombuffer(body, dtype, count, start).reshape(shape)
            start += size
        else:
            raise RequestError(f"input '{name}' has neither 'data' nor binary_data_size")
        feeds[name] = a
    check_request(engine, feeds, batching)
    return feeds


def rest_output_regions(header) -> Optional[dict]:
    """{output name: (region, byte_size, offset)} for the outputs a REST request asks to be
    written into shared memory, each checked to lie within its region (before the inference);
    None when none is."""
    asked = header.get("outputs") if isinstance(header, dict) else None
    if not isinstance(asked, list):
        return None
    found = None
    for o in asked:
        params = shm.rest_params(o.get("parameters")) if isinstance(o, dict) else None
        if params is not None:
            name = o.get("name")
            if o["parameters"].get("binary_data") is True:
                raise RequestError(f"output '{name}': both binary_data and {shm.REGION} given")
            shm.registry().check_output(f"output '{name}'", params)
            if found is None:
                found = {}
            found[name] = params
    return found


def encode_rest_response(header, out: dict[str, np.ndarray], model_name: str,
                         regions: Optional[dict] = None) -> tuple[bytes, Optional[int]]:
    """A v2 REST response body with the outputs the request asked for (all when it names none):
    each binary (after the JSON part) when its parameters.binary_data says so, else as the
    request's parameters.binary_data_output says (default JSON data), as Triton answers; an
    output in `regions` (rest_output_regions) is written into its shared memory region and
    answered with its name, datatype and shape only.
    Returns (body, the JSON part's length when any output is binary, else None)."""
    params = header.get("parameters")
    binary_all = bool(params.get("binary_data_output", False)) if isinstance(params, dict) else False
    asked = header.get("outputs")
    if asked is None:
        asked = [{"name": n} for n in out]
    elif not isinstance(asked, list) or not all(isinstance(o, dict) for o in asked):
        raise RequestError("malformed request: 'outputs' must be a list of JSON objects")
    outputs, raw = [], []
    for o in asked:
        name = o.get("name")
        if not isinstance(name, str) or name not in out:
            raise RequestError(f"unknown output '{name}' (the model's outputs: {', '.join(out)})")
        p = o.get("parameters")
        binary = p.get("binary_data", binary_all) if isinstance(p, dict) else binary_all
        arr = np.ascontiguousarray(out[name])
        entry = {"name": name, "datatype": _v2_datatype(arr.dtype), "shape": list(arr.shape)}
        if regions is not None and name in regions:
            shm.registry().write_output(f"output '{name}'", regions[name], arr,
                                        entry["datatype"])
        elif binary:
            entry["parameters"] = {"binary_data_size": arr.nbytes}
            raw.append(arr.tobytes())
        else:
            entry["data"] = arr.ravel().tolist()
        outputs.append(entry)
    rid = header.get("id")
    response = {"model_name": model_name, "id": rid if isinstance(rid, str) else "",
                "outputs": outputs}
    text = _orjson().dumps(response)
    if not raw:
        return text, None
    return b"".join([text] + raw), len(text)


class _LeanRest:
    """ASGI app in front of KServe's FastAPI app: POST /v2/models/NAME/infer for a kiln model
    that is ready is read, decoded (decode_rest_request), run and answered (encode_rest_response)
    here; everything else (other paths, versions, unknown models, metadata, /metrics) goes to
    KServe's app as before. FastAPI's routing, KServe's middlewares, InferRequest and
    InferResponse took about 1.1 ms of the event loop per request on the GPU machine, and
    every request waits on that loop.
    Errors: 400 with {"error": what is wrong}, 413 for a body over `limit`, as before.
    `scrape` (a worker of `kiln serve --workers`: serve_workers.scrape) answers GET /metrics
    with the counters of every worker instead of KServe's, which has this process's only, and
    the repository extension's load and unload get a 400 (REPOSITORY_FIXED)."""

    PREFIX, SUFFIX = "/v2/models/", "/infer"

    def __init__(self, app, data_plane, limit: int, scrape=None):
        self.app, self.data_plane, self.limit, self.scrape = app, data_plane, limit, scrape

    async def __call__(self, scope, receive, send):
        if scope["type"] == "http" and scope.get("path", "").startswith(shm.REST_PREFIXES):
            return await self._shared_memory(scope, receive, send)
        if scope["type"] != "http" or scope.get("method") != "POST":
            if (self.scrape is not None and scope["type"] == "http"
                    and scope.get("method") == "GET" and scope.get("path") == "/metrics"):
                return await self._metrics(scope, send)
            return await self.app(scope, receive, send)
        path = scope.get("path", "")
        if (self.scrape is not None and path.startswith("/v2/repository/")
                and path.endswith(("/load", "/unload"))):
            await _drain(receive)
            return await _send_json(send, 400, {"error": REPOSITORY_FIXED})
        name = path[len(self.PREFIX):-len(self.SUFFIX)] if (
            path.startswith(self.PREFIX) and path.endswith(self.SUFFIX)) else ""
        model = self.data_plane.model_registry.get_model(name) if name and "/" not in name else None
        if model is None or not isinstance(model, _kserve_model_class()) or not model.ready:
            return await self.app(scope, receive, send)
        headers = dict(scope.get("headers") or [])
        length = headers.get(b"content-length")
        if length is not None and length.isdigit() and int(length) > self.limit:
            return await self.app(scope, receive, send)  # _BodyLimit answers 413
        chunks, seen = [], 0
        while True:
            message = await receive()
            if message.get("type") != "http.request":
                return  # the client went away
            chunk = message.get("body", b"")
            seen += len(chunk)
            if seen > self.limit:
                await _drain(receive)
                return await _refuse_too_large(send, seen, self.limit)
            chunks.append(chunk)
            if not message.get("more_body", False):
                break
        body = chunks[0] if len(chunks) == 1 else b"".join(chunks)
        try:
            out_body, json_length = await self._infer(model, body, headers)
        except RequestError as e:
            return await _send_json(send, 400, {"error": str(e)})
        except Exception as e:  # noqa: BLE001 - as KServe's generic handler: a 500 saying what
            log.exception("model %s: inference failed", model.name)
            return await _send_json(send, 500, {"error": f"{type(e).__name__} : {e}"})
        extra = [(b"content-type", b"application/json")]
        if json_length is not None:
            extra = [(b"content-type", b"application/octet-stream"),
                     (b"inference-header-content-length", str(json_length).encode())]
        await send({"type": "http.response.start", "status": 200,
                    "headers": extra + [(b"content-length", str(len(out_body)).encode())]})
        await send({"type": "http.response.body", "body": out_body})

    async def _shared_memory(self, scope, receive, send):
        """The system shared memory extension's endpoints (shm.rest_call)."""
        body, seen = await _read_body(receive, self.limit)
        if body is None:
            return await _refuse_too_large(send, seen, self.limit)
        status, out = shm.rest_call(scope.get("method", ""), scope.get("path", ""), body)
        await send({"type": "http.response.start", "status": status,
                    "headers": [(b"content-type", b"application/json"),
                                (b"content-length", str(len(out)).encode())]})
        await send({"type": "http.response.body", "body": out})

    async def _metrics(self, scope, send):
        accept = dict(scope.get("headers") or []).get(b"accept", b"").decode("latin-1")
        body, content_type = self.scrape(accept)
        await send({"type": "http.response.start", "status": 200,
                    "headers": [(b"content-type", content_type.encode()),
                                (b"content-length", str(len(body)).encode())]})
        await send({"type": "http.response.body", "body": body})

    @staticmethod
    async def _infer(model, body: bytes, headers: dict):
        header, start = read_rest_body(body, headers.get(b"inference-header-content-length"))
        feeds = decode_rest_request(header, body, start, model.engine, model.batcher.max_batch > 1)
        regions = rest_output_regions(header)
        out = await model.batcher.infer(feeds)
        return encode_rest_response(header, out, model.name, regions)


def read_rest_body(body: bytes, header_length: Optional[bytes]) -> tuple[object, int]:
    """A REST body's JSON part, parsed, and the offset where its binary tensors start: with the
    binary-data extension (`header_length`, the Inference-Header-Content-Length header) the JSON
    is that many bytes, else the whole body. RequestError when it is not JSON or the length is
    not within the body."""
    orjson = _orjson()
    if header_length is not None:
        if not header_length.isdigit() or int(header_length) > len(body):
            raise RequestError("inference-header-content-length "
                               f"{header_length.decode('latin-1')[:40]} is not within the body "
                               f"of {len(body)} bytes")
        start = int(header_length)
    else:
        start = len(body)
    try:
        return orjson.loads(body[:start] if start < len(body) else body), start
    except orjson.JSONDecodeError as e:
        raise RequestError(f"malformed request: {e}") from None


async def _read_body(receive, limit: int) -> tuple:
    """(a request's whole body, its length), or (None, the length read) once it passes `limit`
    (the rest read and dropped: _drain)."""
    chunks, seen = [], 0
    while True:
        message = await receive()
        if message.get("type") != "http.request":
            return b"", seen  # the client went away
        chunk = message.get("body", b"")
        seen += len(chunk)
        if seen > limit:
            await _drain(receive)
            return None, seen
        chunks.append(chunk)
        if not message.get("more_body", False):
            return b"".join(chunks), seen


async def _send_json(send, status: int, obj) -> None:
    import json

    body = json.dumps(obj).encode()
    await send({"type": "http.response.start", "status": status,
                "headers": [(b"content-type", b"application/json"),
                            (b"content-length", str(len(body)).encode())]})
    await send({"type": "http.response.body", "body": body})


async def _refuse_too_large(send, size: int, limit: int) -> None:
    await _send_json(send, 413, {"error": f"request body of {size} bytes is over this server's "
                                          f"limit of {limit} bytes (kiln serve --max-request-bytes)"})


def load_batcher(name: str, engine_path: str, devices: list, contexts: int,
                 max_batch: Optional[int], delay_s: float, pad_batches: Optional[str],
                 warm: bool, stats=None) -> tuple:
    """A model's engine loaded once per GPU of `devices` (each holds its own weights and
    contexts) and its Batcher, warmed unless `warm` is False: (first engine, batcher, warm-up
    runs made)."""
    first = load(engine_path, device=devices[0] if devices else None)
    engines = [first]
    if first.backend == "cuda":
        engines += [load(engine_path, device=d) for d in devices[1:]]
    elif len(devices) > 1:
        log.info("model %s runs on the cpu backend: --devices does not apply", name)
    # The padded sizes run up to the model's batch limit.
    limit = batch_limit(first, max_batch)
    pad = parse_pad_sizes(pad_batches, limit) if pad_batches is not None else None
    batcher = Batcher(engines, contexts, max_batch, delay_s, pad_sizes=pad, stats=stats)
    if stats is not None:
        stats.declare_devices(batcher.devices)
    runs = batcher.warm() if warm else 0
    return first, batcher, runs


@functools.lru_cache(maxsize=None)
def _kserve_model_class():
    import kserve
    from kserve.errors import InvalidInput

    class KilnModel(kserve.Model):
        """One engine as a KServe model (v2 protocol)."""

        def __init__(self, name: str, engine_path: str, contexts: int, max_batch: Optional[int],
                     max_delay_s: float, devices: Optional[list[int]] = None,
                     pad_batches: Optional[str] = None, warm: bool = True, stats_factory=None,
                     remote=None):
            super().__init__(name)
            self.engine_path = engine_path
            self._args = (contexts, max_batch, max_delay_s)
            self.devices = devices or []
            self.pad_batches = pad_batches  # None: no padding; else parse_pad_sizes' text
            self.warm = warm
            # model name -> the batcher's Stats (a worker's: serve_workers.SharedStats)
            self.stats_factory = stats_factory
            # (engine metadata, serve_workers.RemoteBatcher): the model is served by batcher
            # processes (kiln serve --batcher device), this process decodes and forwards
            self.remote = remote
            self.engine: Optional[Engine] = None
            self.batcher: Optional[Batcher] = None

        def load(self) -> bool:
            if self.remote is not None:  # a front end of `kiln serve --batcher device`
                self.engine, self.batcher = self.remote
                self.ready = True
                return self.ready
            contexts, max_batch, delay = self._args
            stats = self.stats_factory(self.name) if self.stats_factory else None
            self.engine, self.batcher, runs = load_batcher(
                self.name, self.engine_path, self.devices, contexts, max_batch, delay,
                self.pad_batches, self.warm, stats)
            self.ready = True
            log.info("model %s: %s on %s, %d contexts each, batches up to %d%s%s", self.name,
                     self.engine_path, ", ".join(self.batcher.devices), contexts,
                     self.batcher.max_batch,
                     f", padded to {self.batcher.pad_sizes}" if self.batcher.pad_sizes else "",
                     f", {runs} warm-up runs" if runs else "")
            return self.ready

        def get_input_types(self):
            return tensor_metadata(self.engine.inputs)

        def get_output_types(self):
            return tensor_metadata(self.engine.outputs)

        async def predict(self, payload, headers=None, response_headers=None):
            try:
                feeds = decode_request(payload, self.engine, self.batcher.max_batch > 1)
            except RequestError as e:
                raise InvalidInput(str(e)) from None
            out = await self.batcher.infer(feeds)
            try:
                return encode_response(payload, out, self.name)
            except RequestError as e:
                raise InvalidInput(str(e)) from None

        def stop(self):
            if self.batcher:
                self.batcher.close()

    return KilnModel


class StatsCollector:
    """The batchers' counters on /metrics (Prometheus), read when scraped."""

    def __init__(self, models):
        self.models = models

    def collect(self):
        from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily

        families = [
            (CounterMetricFamily("kiln_requests", "Inference requests taken", labels=["model"]),
             "requests"),
            (CounterMetricFamily("kiln_inferences", "Engine inferences run", labels=["model"]),
             "inferences"),
            (CounterMetricFamily("kiln_batched_requests",
                                 "Requests that shared an inference with others", labels=["model"]),
             "batched_requests"),
            (GaugeMetricFamily("kiln_largest_batch", "Samples in the largest inference so far",
                               labels=["model"]), "largest_batch"),
            (CounterMetricFamily("kiln_samples", "Samples the requests brought",
                                 labels=["model"]), "samples"),
            (CounterMetricFamily("kiln_padded_samples", "Samples added by --pad-batches",
                                 labels=["model"]), "padded_samples"),
        ]
        for family, field in families:
            for m in self.models:
                family.add_metric([m.name], getattr(m.batcher.stats, field))
            yield family
        per_batch = CounterMetricFamily("kiln_batch_inferences",
                                        "Inferences run per batch size (padded)",
                                        labels=["model", "batch"])
        per_device = CounterMetricFamily("kiln_device_inferences", "Inferences run per device",
                                         labels=["model", "device"])
        for m in self.models:
            st = m.batcher.stats
            for b, n in sorted(dict(st.per_batch).items()):
                per_batch.add_metric([m.name, str(b)], n)
            for d in m.batcher.devices:
                per_device.add_metric([m.name, d], st.per_device.get(d, 0))
        yield per_batch
        yield per_device


class _BodyLimit:
    """ASGI middleware: a request body over `limit` bytes gets 413 without being kept (the rest
    of it is read and dropped: _drain)."""

    def __init__(self, app, limit: int):
        self.app, self.limit = app, limit

    async def __call__(self, scope, receive, send):
        if scope["type"] != "http":
            return await self.app(scope, receive, send)
        length = dict(scope.get("headers") or []).get(b"content-length")
        if length is not None and length.isdigit() and int(length) > self.limit:
            await _drain(receive)
            return await self._refuse(send, int(length))
        seen = 0

        async def limited():
            nonlocal seen
            message = await receive()
            seen += len(message.get("body", b""))
            if seen > self.limit:
                raise _TooLarge(seen)
            return message

        try:
            return await self.app(scope, limited, send)
        except _TooLarge as e:
            await _drain(receive)
            return await self._refuse(send, e.args[0])

    async def _refuse(self, send, size: int):
        await _refuse_too_large(send, size, self.limit)


class _TooLarge(Exception):
    pass


async def _drain(receive):
    """Reads the rest of a refused request's body and drops it, so that the client, which is
    still sending, reads the 413 instead of a reset connection (a broken pipe on its side)."""
    while True:
        message = await receive()
        if message.get("type") != "http.request" or not message.get("more_body", False):
            return


def _refuse_malformed(decode):
    """KServe's decoding of a body with binary data (InferRequest.from_bytes) indexes its JSON
    header unchecked, so a malformed body raises KeyError, TypeError, ValueError... and gets a
    500. Any exception while decoding a body is the body's fault: InvalidInput, a 400 saying
    what is wrong (tests/fuzz/fuzz_serving.py found these)."""
    from kserve.errors import InvalidInput

    @functools.wraps(decode)
    def checked(*args, **kwargs):
        try:
            return decode(*args, **kwargs)
        except InvalidInput:
            raise
        except Exception as e:  # noqa: BLE001 - see above
            raise InvalidInput(f"malformed request: {type(e).__name__}: {e}") from None
    return checked


def _request_from_bytes(body: bytes, json_length: int, model_name: str):
    """A REST body with binary tensors (a JSON header, then the tensors' bytes) as kserve's
    InferRequest, each binary tensor kept as bytes. KServe 0.21's InferRequest.from_bytes turns
    every binary tensor into a Python list, an .item() per element: ResNet-50's 150,528 floats
    take 70-100 ms, on the event loop that every other request waits on (about 20 requests/s
    over HTTP at any number of clients, on the GPU machine as on the CPU)."""
    import orjson
    from kserve.errors import InvalidInput
    from kserve.protocol.infer_type import InferInput, InferRequest, RequestedOutput

    if not 0 <= json_length <= len(body):
        raise InvalidInput(f"inference-header-content-length {json_length} is not within the "
                           f"body of {len(body)} bytes")
    try:
        header = orjson.loads(body[:json_length])
    except orjson.JSONDecodeError as e:
        raise InvalidInput(f"Unrecognized request format: {e}") from None
    inputs, start = [], json_length
    for t in header["inputs"]:
        params = t.get("parameters")
        shape = t["shape"]
        # numpy's reshape would take a negative dimension as one to infer.
        if not isinstance(shape, list) or not all(type(d) is int and d >= 0 for d in shape):
            raise InvalidInput(f"input '{t['name']}': shape {shape} is not a list of sizes")
        inp = InferInput(name=t["name"], shape=shape, datatype=t["datatype"], parameters=params)
        if t.get("data") is not None:
            if inp.datatype == "FP16":
                raise InvalidInput(f"input '{inp.name}': FP16 data must be binary, not JSON")
            inp.data = t["data"]
        elif params and params.get("binary_data_size") is not None:
            size = params["binary_data_size"]
            if not isinstance(size, int) or size < 0 or start + size > len(body):
                raise InvalidInput(f"input '{inp.name}': binary_data_size {size} is not within "
                                   f"the {len(body) - start} bytes left in the body")
            inp._raw_data = body[start:start + size]
            start += size
        else:
            raise InvalidInput(f"input '{inp.name}' has neither 'data' nor binary_data_size")
        inputs.append(inp)
    outputs = header.get("outputs")
    if outputs is not None:
        outputs = [RequestedOutput(name=o["name"], parameters=o.get("parameters"))
                   for o in outputs]
    return InferRequest(model_name=model_name, request_id=header.get("id"),
                        parameters=header.get("parameters"), infer_inputs=inputs,
                        request_outputs=outputs)


def _keep_binary_tensors(decode):
    """The data plane's decode_inference_request with binary REST bodies decoded by
    _request_from_bytes; JSON bodies and gRPC requests as before."""

    @functools.wraps(decode)
    def decoded(body, headers, model_name):
        length = (headers or {}).get("inference-header-content-length")
        if isinstance(body, bytes) and length is not None:
            return _request_from_bytes(body, int(length), model_name)
        return decode(body, headers, model_name)
    return decoded


async def _malformed_request(request, exc):
    """A body that is not a v2 request (bad JSON, missing fields): 400 and what is wrong, in
    the protocol's {"error": ...} form."""
    from fastapi.responses import JSONResponse

    problems = []
    for e in exc.errors()[:3]:
        where = ".".join(str(p) for p in e.get("loc", ()) if p != "body")
        problems.append(f"{e.get('msg', 'invalid')}{' at ' + where if where else ''}")
    return JSONResponse(status_code=400,
                        content={"error": "malformed request: " + "; ".join(problems)})


class _CallDetails:
    """grpc.HandlerCallDetails of one call, for interceptors run by _intercepted."""
    __slots__ = ("method", "invocation_metadata")

    def __init__(self, method: str, invocation_metadata):
        self.method, self.invocation_metadata = method, invocation_metadata


async def _intercept_chain(interceptors: tuple, handler, details):
    """The method handler that grpc.aio's interceptor chain makes of `handler`: each of
    `interceptors` in order, its continuation the rest (as grpc.aio runs them)."""
    if not interceptors:
        return handler
    return await interceptors[0].intercept_service(
        functools.partial(_intercept_chain, interceptors[1:], handler), details)


def _intercepted(method: str, handler, interceptors: tuple):
    """A unary-unary method handler whose every call first runs `interceptors` (grpc.aio
    ServerInterceptors) as the server would, then the handler they return. The interceptors are
    given to the methods this way, each call, rather than to the server: a grpc.aio server runs
    its interceptors for every method, ModelInfer included, two coroutines and a continuation
    each per call (about an eighth of grpc.aio's CPU per request; bench/grpc_floor.py
    --interceptors 2 with uvloop)."""
    import grpc

    async def behaviour(request, context):
        details = _CallDetails(method, context.invocation_metadata())
        h = await _intercept_chain(interceptors, handler, details)
        if h is None:
            await context.abort(grpc.StatusCode.UNIMPLEMENTED, f"method {method} is not served")
        return await h.unary_unary(request, context)

    return grpc.unary_unary_rpc_method_handler(
        behaviour, request_deserializer=handler.request_deserializer,
        response_serializer=handler.response_serializer)


@functools.lru_cache(maxsize=None)
def _kserve_logger():
    from kserve.logging import logger

    return logger


@functools.lru_cache(maxsize=None)
def _inference_servicer():
    import grpc
    from grpc import aio
    from kserve.errors import InvalidInput
    from kserve.protocol.grpc import grpc_predict_v2_pb2 as pb
    from kserve.protocol.grpc.servicer import InferenceServicer

    class _InferenceServicer(InferenceServicer):
        """KServe's gRPC servicer, with ModelInfer for kiln models made lean: the protobuf
        request decoded straight into arrays (decode_grpc_request) and the response serialized
        directly (encode_grpc_response_bytes), instead of through KServe's InferRequest, InferInput,
        Model.__call__ and InferResponse (with its per-request logging and histograms), which
        bounded the server at about 1,300 requests/s whatever the GPU. Errors get the status
        KServe's ExceptionToStatusInterceptor gives them (INVALID_ARGUMENT for a bad request,
        NOT_FOUND for an unknown model, ...), with the message."""

        def __init__(self, data_plane, model_repository_extension, errors,
                     fixed_models: bool = False):
            super().__init__(data_plane, model_repository_extension)
            self._errors = errors  # KServe's ExceptionToStatusInterceptor
            self._fixed_models = fixed_models  # a worker of kiln serve --workers
            self.log_requests = False  # --log-requests: ModelInfer logged as KServe logs calls

        async def RepositoryModelLoad(self, request, context):
            if self._fixed_models:
                await context.abort(grpc.StatusCode.FAILED_PRECONDITION, REPOSITORY_FIXED)
            return await super().RepositoryModelLoad(request, context)

        async def RepositoryModelUnload(self, request, context):
            if self._fixed_models:
                await context.abort(grpc.StatusCode.FAILED_PRECONDITION, REPOSITORY_FIXED)
            return await super().RepositoryModelUnload(request, context)

        async def ModelInfer(self, body, context):
            """`body`: the serialized request (the method is registered without a
            deserializer: split_grpc_request); the response goes out serialized."""
            request = None
            if self.log_requests:  # as KServe's LoggingInterceptor, which the others go through
                _kserve_logger().info(f"grpc method: {GRPC_MODEL_INFER}")
            try:
                request, raw = split_grpc_request(body)
                model = self._data_plane.model_registry.get_model(request.model_name)
                if model is None or not model.ready:
                    model = await self._data_plane.get_model(request.model_name)
                if not isinstance(model, _kserve_model_class()):
                    request = pb.ModelInferRequest.FromString(body)
                    response = await super().ModelInfer(request, context)
                    return response.SerializeToString()
                feeds = decode_grpc_request(request, model.engine, model.batcher.max_batch > 1,
                                            raw)
                regions = grpc_output_regions(request) if request.outputs else None
                out = await model.batcher.infer(feeds)
                return encode_grpc_response_bytes(request, out, model.name, regions)
            except aio.AbortError:
                raise
            except RequestError as e:
                error = InvalidInput(str(e))
            except Exception as e:  # noqa: BLE001 - mapped to a status below
                error = e
            await self._errors.handle_exception(error, request, context, GRPC_MODEL_INFER)

        async def shared_memory(self, method, body, context):
            """The system shared memory extension's gRPC methods (shm.grpc_call); CUDA's are
            UNIMPLEMENTED."""
            if method in shm.CUDA_GRPC_METHODS:
                await context.abort(grpc.StatusCode.UNIMPLEMENTED, shm.CUDA_UNSUPPORTED)
            try:
                return shm.grpc_call(method, body)
            except shm.RegionError as e:
                await context.abort(getattr(grpc.StatusCode, e.grpc_code), str(e))

        def register(self, server, interceptors: tuple = ()) -> None:
            """Adds the service to a grpc.aio server, as the generated
            add_GRPCInferenceServiceServicer_to_server does, but ModelInfer without protobuf's
            (de)serialization (it takes and returns bytes) and every other method through
            `interceptors` (_intercepted; ModelInfer maps its own errors, and the server is made
            without interceptors)."""
            from kserve.protocol.grpc import grpc_predict_v2_pb2_grpc as pb_grpc

            handlers = {}

            class _Capture:
                def add_generic_rpc_handlers(self, generic):
                    pass

                def add_registered_method_handlers(self, service, methods):
                    handlers.update(methods)

            pb_grpc.add_GRPCInferenceServiceServicer_to_server(self, _Capture())
            service = "inference.GRPCInferenceService"
            # Triton's shared memory methods, which KServe's service has not: bytes in and out
            # (their messages are shm.grpc_messages', in a descriptor pool of their own).
            for method in shm.GRPC_METHODS + shm.CUDA_GRPC_METHODS:
                handlers[method] = grpc.unary_unary_rpc_method_handler(
                    functools.partial(self.shared_memory, method))
            if interceptors:
                for name, h in list(handlers.items()):
                    if h.unary_unary is not None:
                        handlers[name] = _intercepted(f"/{service}/{name}", h, interceptors)
            handlers["ModelInfer"] = grpc.unary_unary_rpc_method_handler(self.ModelInfer)
            server.add_generic_rpc_handlers(
                (grpc.method_handlers_generic_handler(service, handlers),))
            if hasattr(server, "add_registered_method_handlers"):
                server.add_registered_method_handlers(service, handlers)

    return _InferenceServicer


def make_server(host: str, http_port: int, grpc_port: int, max_request_bytes: int,
                enable_grpc: bool = True, log_requests: bool = False, worker=None,
                sched_batch: bool = False):
    """KServe's ModelServer listening on `host` (KServe's own listens on every address), its
    gRPC ModelInfer served by _InferenceServicer. Without `log_requests` no log line is written
    per request (KServe writes three or four per REST request, two per gRPC one).
    `worker` (a serve_workers.WorkerLink: this process is one of `kiln serve --workers`'):
    REST on the sockets set as server.rest_sockets (bound with SO_REUSEPORT), gRPC with
    SO_REUSEPORT, /metrics summed over the workers, and the supervisor told once both listen.
    `sched_batch`: the event loop's thread and the threads made after it (gRPC's) run under
    SCHED_BATCH (set_sched_batch)."""
    import kserve
    import kserve.model_server as ms
    from fastapi.exceptions import RequestValidationError
    from kserve.protocol.grpc.server import GRPCServer
    from kserve.protocol.rest.server import RESTServer

    class _GRPC(GRPCServer):
        started = False

        async def start(self, max_workers):
            from concurrent import futures

            from grpc import aio
            from kserve.protocol.grpc.interceptors import (ExceptionToStatusInterceptor,
                                                           LoggingInterceptor)

            # KServe's interceptors for every method but ModelInfer, which maps its own errors
            # (_InferenceServicer) and is logged only with --log-requests; given to the
            # methods, not the server (_intercepted).
            errors = ExceptionToStatusInterceptor()
            options = [("grpc.max_send_message_length", max_request_bytes),
                       ("grpc.max_receive_message_length", max_request_bytes)]
            if worker is not None:
                options.append(("grpc.so_reuseport", 1))
            self._server = aio.server(futures.ThreadPoolExecutor(max_workers=max_workers),
                                      options=options)
            servicer = _inference_servicer()(self._data_plane, self._model_repository_extension,
                                             errors, fixed_models=worker is not None)
            servicer.log_requests = log_requests
            servicer.register(self._server, (LoggingInterceptor(), errors))
            address = f"[{host}]:{self._port}" if ":" in host else f"{host}:{self._port}"
            self._server.add_insecure_port(address)
            log.info("gRPC (Open Inference Protocol v2) on %s (event loop: %s)", address,
                     type(asyncio.get_running_loop()).__module__.split(".")[0])
            await self._server.start()
            self.started = True
            await self._server.wait_for_termination()

    class _Server(kserve.ModelServer):
        rest_sockets = None  # a worker's: serve_workers.reuseport_sockets

        def start(self, models) -> None:
            self._register_and_check_atleast_one_model_is_ready(models)
            self._rest_server = RESTServer(
                ms.FASTAPI_APP_IMPORT_STRING, self.dataplane, self.model_repository_extension,
                self.http_port, grace_period=self.grace_period, event_loop=self.event_loop,
                timeout_keep_alive=self.timeout_keep_alive)
            self._rest_server.config.host = host
            self._rest_server.config.app = _LeanRest(ms.app, self.dataplane, max_request_bytes,
                                                     scrape=scrape)
            if not log_requests:
                # uvicorn makes its access line's arguments (the client's address, the quoted
                # path) for every response while the access logger has a handler, even one
                # that drops the line: none, as uvicorn's own access_log=False leaves it
                access = logging.getLogger("uvicorn.access")
                access.handlers, access.propagate = [], False
            log.info("REST (Open Inference Protocol v2) on %s:%d%s", host, self.http_port,
                     f" (worker {worker.index} of {worker.count}, pid {os.getpid()})"
                     if worker else "")
            if worker is None:
                self.servers.append(self._rest_server.start())
            else:
                self.servers.append(self._serve_rest())
            if self.enable_grpc:
                self._grpc_server = _GRPC(self.grpc_port, self.dataplane,
                                          self.model_repository_extension, kwargs={},
                                          grace_period=self.grace_period)
                self.servers.append(self._grpc_server.start(self.max_threads))
            if worker is not None:
                self.servers.append(self._announce_ready())
            self.servers.append(self._background())
            try:  # as asyncio's own policy does (uvloop's leaves get_event_loop to raise)
                asyncio.get_event_loop()
            except RuntimeError:
                asyncio.set_event_loop(asyncio.new_event_loop())
            self.setup_event_loop()
            self.register_signal_handler()
            if sched_batch and not set_sched_batch():
                log.warning("--sched-batch: SCHED_BATCH is not available here; ignored")
            asyncio.run(self._serve())

        async def _background(self):
            # tasks for the server's lifetime (asyncio.run cancels them when the servers end)
            self._tasks = [asyncio.get_running_loop().create_task(c) for c in background()]

        async def _serve_rest(self):
            self._rest_server.create_application()
            await self._rest_server._server.serve(sockets=self.rest_sockets)

        async def _announce_ready(self):
            rest = self._rest_server._server
            while not (rest.started and (self._grpc_server is None or self._grpc_server.started)):
                if rest.should_exit:
                    return
                await asyncio.sleep(0.01)
            worker.ready(asyncio.get_running_loop())

    scrape = None  # /metrics: KServe's, or a worker's summed over the workers
    if worker is not None:
        from kiln.serve_workers import scrape
    ms.app.add_middleware(_BodyLimit, limit=max_request_bytes)
    ms.app.add_exception_handler(RequestValidationError, _malformed_request)
    server = _Server(http_port=http_port, grpc_port=grpc_port, enable_grpc=enable_grpc,
                     grace_period=5, enable_docs_url=False, enable_latency_logging=log_requests)
    if not log_requests:
        # uvicorn's access log and KServe's per-request timings (timing_asgi's PrintTimings)
        for name in ("uvicorn.access", "kserve.trace"):
            logging.getLogger(name).setLevel(logging.WARNING)
    dp = server.dataplane
    dp.decode_inference_request = _refuse_malformed(
        _keep_binary_tensors(dp.decode_inference_request))
    dp.metadata = _with_shared_memory(dp.metadata)
    return server


def _with_shared_memory(metadata):
    """The data plane's server metadata with the system shared memory extension among its
    extensions (Triton's name for it: clients look for it there)."""

    @functools.wraps(metadata)
    def with_shm():
        meta = dict(metadata())
        meta["extensions"] = list(meta.get("extensions", [])) + ["system_shared_memory"]
        return meta
    return with_shm


# glibc's mallopt parameters
_M_TRIM_THRESHOLD, _M_MMAP_THRESHOLD, _M_ARENA_MAX = -1, -3, -8
_MMAP_THRESHOLD = 32 << 20  # glibc's largest (HEAP_MAX_SIZE / 2 on 64-bit)


def _libc():
    """glibc through ctypes, or None (another C library, or not Linux)."""
    if not sys.platform.startswith("linux"):
        return None
    import ctypes

    try:
        libc = ctypes.CDLL(None)
        libc.mallopt.argtypes, libc.mallopt.restype = [ctypes.c_int, ctypes.c_int], ctypes.c_int
        libc.malloc_trim.argtypes, libc.malloc_trim.restype = [ctypes.c_size_t], ctypes.c_int
    except (OSError, AttributeError):
        return None
    return libc


def tune_malloc() -> bool:
    """Keeps freed memory of up to 32 MB a block in the process for the next request instead of
    giving it back to the system (glibc: mallopt M_MMAP_THRESHOLD and M_TRIM_THRESHOLD). Every
    request's tensors (602 KB for a ResNet-50 sample: gRPC's message, the bytes made of it, the
    joined batch) are above glibc's default mmap threshold of 128 KB, so each was an mmap and a
    munmap, and each of its pages a page fault and a zeroing: about 40% of the server's CPU
    time per request on the cpu backend (bench/serve_cost.py). Off with KILN_SERVE_MALLOC=0;
    False where it does not apply (not glibc).

    The trim threshold (free memory at an arena's top kept rather than given back) is 32 MB,
    the mmap threshold. It was 128 MB, four times it, which is more than a thread's arena can
    ever hold (glibc's heaps of other threads than the main one are 64 MB): those arenas
    (gRPC's event-engine threads, the inference threads, the executor's) then never gave a
    page back, nor did the main arena its last 128 MB, and the free space that fragmentation
    leaves in them kept growing, so RSS rose for as long as the server ran (the soak of
    bench/serve_load.py: +200 MB over 10 minutes on 4 workers, about 12 MB/min at the end,
    the memory in use flat; KILN_SERVE_MEMORY_LOG shows both).

    And every thread allocates from one arena, the main one (M_ARENA_MAX 1; KILN_SERVE_ARENAS=N
    for N, 0 for glibc's default): with one per thread (up to 8 a core), each of the threads
    that allocate (gRPC's event engine, the inference threads, the executor's: 12 arenas in a
    worker on 2 cores) kept its own free space, which fragmentation made grow, with the 32 MB
    trim threshold too. The cpu-backend soak (2 workers, 64 clients, 5% bad requests with the
    100 MB bodies, slope of RSS over the last 3 of 7 minutes): 128 MB threshold, many arenas
    +6.6 MB/min (RSS 1,073 -> 1,141 MB from 1 to 7 min); the same without the 100 MB bodies
    +14.5; the 32 MB threshold +9.9; either with malloc_trim every 30 s +6.8 and +22; one
    arena -0.2 (and +2.0 with the trims), RSS 950-977 MB throughout. The huge bodies are not
    the cause: gRPC refuses them without holding them whole (the server's RSS rises under
    20 MB during one) and REST answers 413 from the Content-Length. glibc's per-thread caches
    (tcache) still serve small blocks without the arena's lock."""
    if os.environ.get("KILN_SERVE_MALLOC", "1") == "0":
        return False
    libc = _libc()
    if libc is None:
        return False
    raw = os.environ.get("KILN_SERVE_ARENAS", "1")
    try:
        arenas = int(raw or 0)
    except ValueError:  # one line and exit status 1, not a traceback
        raise SystemExit(f"kiln serve: KILN_SERVE_ARENAS={raw!r} is not a whole number") from None
    return bool(libc.mallopt(_M_MMAP_THRESHOLD, _MMAP_THRESHOLD)
                and libc.mallopt(_M_TRIM_THRESHOLD, _MMAP_THRESHOLD)
                and (arenas <= 0 or libc.mallopt(_M_ARENA_MAX, arenas)))


def set_sched_batch() -> bool:
    """This thread, and the threads it starts from now on, under Linux's SCHED_BATCH (nice
    unchanged): woken, they do not preempt the thread running on their core, but wait for it to
    block or its time slice to end. grpc.aio's completion-queue thread wakes the event loop's
    about 5 times a gRPC request, and where the cores are busy each wake-up preempted the loop
    (about 17,000 involuntary switches a second at 3,000 requests/s on the 2-core development
    machine: kiln serve --sched-batch cut them to 1,600 and the server's CPU per request by
    10-15%). The inference threads, made before (when the models load), keep the normal policy,
    so a finished GPU inference is picked up at once. Off by default: what it does to latency
    where the cores are shared with other work (the GPU machine's clients) is not measured.
    False where the policy does not exist (not Linux) or is refused."""
    if not hasattr(os, "sched_setscheduler") or not hasattr(os, "SCHED_BATCH"):
        return False
    try:
        os.sched_setscheduler(0, os.SCHED_BATCH, os.sched_param(0))
    except OSError:
        return False
    return True


def use_uvloop() -> bool:
    """Runs this process's event loops on uvloop (libuv, its loop, handles and transports in
    Cython) where it is installed, unless KILN_SERVE_UVLOOP=0: asyncio's own loop is Python
    (every callback a Handle, _run_once, selectors), and the front end's every request passes
    through it several times (grpc.aio's completion-queue callbacks, the RPC's tasks, the
    batcher's futures; uvicorn's protocol). On the cpu backend's MLP (bench/serve_cpu.sh, 2
    cores) uvloop cut grpc.aio's CPU per request by about a quarter. True when in use; call it
    before the loop is made (asyncio.run)."""
    if os.environ.get("KILN_SERVE_UVLOOP", "1") == "0":
        return False
    try:
        import uvloop
    except ImportError:
        return False
    asyncio.set_event_loop_policy(uvloop.EventLoopPolicy())
    return True


def rss_bytes() -> int:
    """This process's resident memory (bytes; 0 where /proc is not there)."""
    try:
        with open("/proc/self/statm") as f:
            return int(f.read().split()[1]) * os.sysconf("SC_PAGE_SIZE")
    except (OSError, ValueError, IndexError):
        return 0


def malloc_info() -> Optional[dict]:
    """glibc's mallinfo2 over every arena (bytes): in_use (malloc'd, not freed), free (freed,
    kept in the arenas), mmapped (blocks of their own mapping), arena (the arenas' size); None
    without glibc 2.33+."""
    import ctypes

    libc = _libc()
    if libc is None or not hasattr(libc, "mallinfo2"):
        return None

    class MallInfo2(ctypes.Structure):
        _fields_ = [(n, ctypes.c_size_t) for n in (
            "arena", "ordblks", "smblks", "hblks", "hblkhd", "usmblks", "fsmblks", "uordblks",
            "fordblks", "keepcost")]

    libc.mallinfo2.restype = MallInfo2
    m = libc.mallinfo2()
    return {"arena": m.arena, "in_use": m.uordblks, "free": m.fordblks, "mmapped": m.hblkhd,
            "mmaps": m.hblks, "arenas": _arena_sizes(libc)}


def _arena_sizes(libc) -> list:
    """The size of each of glibc's arenas (bytes; malloc_info's 'current' per heap), largest
    first, or [] where that cannot be read."""
    import ctypes
    import re
    import tempfile

    try:
        libc.fopen.restype = ctypes.c_void_p
        libc.fopen.argtypes = [ctypes.c_char_p, ctypes.c_char_p]
        libc.fclose.argtypes = [ctypes.c_void_p]
        libc.malloc_info.argtypes = [ctypes.c_int, ctypes.c_void_p]
        with tempfile.NamedTemporaryFile(prefix="kiln-malloc-", suffix=".xml") as tmp:
            f = libc.fopen(tmp.name.encode(), b"w")
            if not f:
                return []
            libc.malloc_info(0, f)
            libc.fclose(f)
            xml = open(tmp.name).read()
    except (OSError, AttributeError):
        return []
    sizes = []
    for heap in re.findall(r'<heap nr="\d+">(.*?)</heap>', xml, re.S):
        cur = re.search(r'<system type="current" size="(\d+)"', heap)
        if cur:
            sizes.append(int(cur.group(1)))
    return sorted(sizes, reverse=True)


def background() -> list:
    """The coroutines a server process (a worker, a batcher) runs beside its servers."""
    every = float(os.environ.get("KILN_SERVE_MEMORY_LOG", "0") or 0)
    tasks = [watch_memory(every)] if every > 0 else []
    trim = float(os.environ.get("KILN_SERVE_TRIM_S", "0") or 0)
    if trim > 0 and os.environ.get("KILN_SERVE_MALLOC", "1") != "0" and _libc() is not None:
        tasks.append(trim_memory(trim))
    if shm.registry().records is not None:  # a worker: regions unregistered by the others
        tasks.append(sweep_regions(shm.SWEEP_S))
    return tasks


async def sweep_regions(every: float) -> None:
    """Every `every` seconds, unmaps the shared memory regions that another worker of
    `kiln serve --workers` unregistered (shm.Registry.sweep)."""
    while True:
        await asyncio.sleep(every)
        try:
            shm.registry().sweep()
        except Exception:  # noqa: BLE001 - a region whose object went away: dropped at its use
            log.debug("shared memory sweep", exc_info=True)


async def trim_memory(every: float) -> None:
    """Every `every` seconds (KILN_SERVE_TRIM_S; off by default), glibc's malloc_trim(0) in a
    thread: the pages of the free blocks inside the arenas go back to the system (each trim
    gave back 20-40 MB of a worker under the cpu-backend soak, 10-300 ms on a loaded 2-core
    machine), to be faulted in again when used. It did not make RSS flat where the arenas were
    many (tune_malloc: one arena did), hence off; a debugging aid and a knob for a process
    whose load comes in bursts."""
    import time

    libc = _libc()
    loop = asyncio.get_running_loop()
    while True:
        await asyncio.sleep(every)
        t0 = time.perf_counter()
        before = rss_bytes()
        await loop.run_in_executor(None, libc.malloc_trim, 0)
        line = (f"malloc_trim (pid {os.getpid()}): rss {before / 2**20:.1f} -> "
                f"{rss_bytes() / 2**20:.1f} MB in {(time.perf_counter() - t0) * 1e3:.1f} ms")
        if os.environ.get("KILN_SERVE_MEMORY_LOG"):
            print("kiln serve: " + line, file=sys.stderr, flush=True)
        else:
            log.debug(line)


async def watch_memory(every: float) -> None:
    """KILN_SERVE_MEMORY_LOG=SECONDS (a debugging aid): one line every SECONDS on stderr with
    the process's RSS, glibc's arenas (in use / free / mmapped: RSS that grows with 'in use'
    flat is memory the allocator keeps, not a leak) and, with KILN_SERVE_TRACEMALLOC=FRAMES,
    the Python heap traced and the 5 allocation sites that grew most since the first line."""
    import tracemalloc

    frames = int(os.environ.get("KILN_SERVE_TRACEMALLOC", "0") or 0)
    if frames > 0:
        tracemalloc.start(frames)
    first = None
    mb = 1 << 20
    while True:
        await asyncio.sleep(every)
        line = f"memory (pid {os.getpid()}): rss {rss_bytes() / mb:.1f} MB"
        info = malloc_info()
        if info:
            line += (f", malloc in use {info['in_use'] / mb:.1f} MB, free in arenas "
                     f"{info['free'] / mb:.1f} MB, mmapped {info['mmapped'] / mb:.1f} MB "
                     f"({info['mmaps']}), arenas {info['arena'] / mb:.1f} MB: "
                     + " ".join(f"{a / mb:.0f}" for a in info["arenas"]))
        if frames > 0:
            snap = tracemalloc.take_snapshot()
            line += f", python traced {tracemalloc.get_traced_memory()[0] / mb:.1f} MB"
            if first is None:
                first = snap
            else:
                for d in snap.compare_to(first, "lineno")[:5]:
                    line += f"\n    {d.size_diff / 1024:+.0f} KB {d.count_diff:+d} {d.traceback}"
        print("kiln serve: " + line, file=sys.stderr, flush=True)


def parse_args(argv):
    p = argparse.ArgumentParser(
        prog="kiln serve",
        description="Serve every engine in MODEL_REPOSITORY (NAME.kiln or NAME/model.kiln) over "
                    "the Open Inference Protocol (v2), REST and gRPC, through KServe's ModelServer.")
    p.add_argument("model_repository")
    p.add_argument("--http-port", type=int, default=8080)
    p.add_argument("--grpc-port", type=int, default=8081)
    p.add_argument("--host", default="0.0.0.0", help="Address to listen on (default: every one)")
    p.add_argument("--contexts", type=int, default=default_contexts(),
                   help="Execution contexts per model: requests run concurrently (default 2)")
    p.add_argument("--max-batch-size", type=int, default=None,
                   help="Join concurrent requests up to this many samples (default: the engine "
                        "profile's maximum batch, else 32)")
    p.add_argument("--batch-delay-ms", type=float, default=2.0,
                   help="How long a request waits for others to join its batch (default 2)")
    p.add_argument("--max-request-bytes", type=int, default=64 << 20,
                   help="Largest request body, REST and gRPC (default 64 MiB)")
    p.add_argument("--no-grpc", action="store_true", help="REST only")
    p.add_argument("--devices", default=None,
                   help="GPUs to serve from, e.g. 0,1: each loads every engine and keeps "
                        "--contexts contexts of it, and each batch goes to the first free "
                        "context (default: every visible GPU; cpu engines ignore it)")
    p.add_argument("--pad-batches", nargs="?", const="pow2", default=None, metavar="SIZES",
                   help="Pad each joined batch to the smallest of these batch sizes that holds "
                        "it (e.g. 1,2,4,8,16,32,64; alone: powers of two up to the maximum "
                        "batch), so the engine sees few shapes and replays each as a CUDA graph")
    p.add_argument("--log-requests", action="store_true",
                   help="Log every request (KServe's access and latency lines; off by default: "
                        "they cost the front end more than a small model's inference)")
    p.add_argument("--no-warmup", action="store_true",
                   help="Take requests without first running each context at the maximum batch "
                        "(and, with --pad-batches, at each padded size)")
    p.add_argument("--sched-batch", action="store_true",
                   help="Run the front end's threads (the event loop, gRPC's) under Linux's "
                        "SCHED_BATCH, so that waking they do not preempt a busy core's thread: "
                        "fewer context switches where the cores are shared (the inference "
                        "threads keep the normal policy)")
    p.add_argument("--spin-wait", action="store_true",
                   help="Threads waiting for the GPU spin on their core (CUDA's default while a "
                        "process has fewer contexts than there are cores) instead of sleeping "
                        "until the inference is done (the default here, as trtexec's; its "
                        "--useSpinWait); cpu engines ignore it")
    p.add_argument("--workers", default="1", metavar="N",
                   help="Serve from N processes, each with the whole front end (gRPC and REST on "
                        "the same ports, SO_REUSEPORT: the kernel spreads the connections), its "
                        "own contexts and batcher, under this one, which restarts a worker that "
                        "dies; 'auto': half the cores, at most 8, a multiple of the devices "
                        "(default 1: one process)")
    p.add_argument("--batcher", choices=["worker", "device"], default="worker",
                   help="Where requests are joined into batches: 'worker' (default): each "
                        "worker process batches its own clients' requests on its own contexts; "
                        "'device': one batcher process per device (or one for cpu engines) "
                        "holds the contexts and joins every worker's requests, which the "
                        "workers decode and hand over through shared memory")
    p.add_argument("--worker-devices", choices=["split", "all"], default="split",
                   help="With --workers and several devices: 'split' (default) gives worker i "
                        "device i mod D; 'all' gives every worker contexts on every device")
    return p.parse_args(argv)


def main(argv=None) -> int:
    argv = list(sys.argv[1:] if argv is None else argv)
    a = parse_args(argv)
    # KServe parses sys.argv when it is imported; it has no options of kiln serve's.
    sys.argv = sys.argv[:1]
    from kiln.serve_workers import (WorkerLink, parse_workers, port_problem, reuseport_sockets,
                                    supervise, worker_devices)

    # Set when this process is a worker of `kiln serve --workers` (serve_workers.Supervisor).
    worker = WorkerLink.from_env()
    tune_malloc()
    use_uvloop()

    def fail(message: str) -> int:
        if worker is not None:
            worker.error(message)  # the supervisor says it, once for every worker
        else:
            print(f"kiln: error: {message}", file=sys.stderr)
        return 1

    # Before anything makes a CUDA context: how the inference threads wait for the GPU.
    try:
        set_gpu_wait("spin" if a.spin_wait else "block")
    except KilnError as e:
        return fail(str(e))
    try:
        models = find_models(a.model_repository)
    except FileNotFoundError as e:
        return fail(str(e))
    if not models:
        return fail(f"no engines (NAME.kiln or NAME/model.kiln) in '{a.model_repository}'")
    try:
        devices = worker.devices if worker else parse_devices(a.devices, device_count())
        if a.pad_batches is not None:
            parse_pad_sizes(a.pad_batches, 1 << 30)  # the text; the sizes per model at load
        workers = 1 if worker else parse_workers(a.workers, len(devices))
    except ValueError as e:
        return fail(str(e))
    if worker is not None and worker.role == "batcher":
        from kiln.serve_workers import run_batcher

        return run_batcher(a, worker, models)
    if worker is None and a.batcher == "device":
        if importlib.util.find_spec("kserve") is None:
            return fail("kiln serve needs KServe (No module named 'kserve'; "
                        "pip install 'kiln[serve]')")
        # One batcher per GPU (one for cpu engines); the workers are front ends only.
        return supervise(argv, a.host, a.http_port, None if a.no_grpc else a.grpc_port,
                         [[] for _ in range(workers)],
                         batcher_devices=[[d] for d in devices] or [[]])
    if workers > 1:
        if importlib.util.find_spec("kserve") is None:
            return fail("kiln serve needs KServe (No module named 'kserve'; "
                        "pip install 'kiln[serve]')")
        return supervise(argv, a.host, a.http_port, None if a.no_grpc else a.grpc_port,
                         [worker_devices(devices, workers, i, a.worker_devices)
                          for i in range(workers)])
    if worker is None:  # a taken port: one line now, not a traceback after the models load
        for port, what in ((a.http_port, "REST"), (None if a.no_grpc else a.grpc_port, "gRPC")):
            problem = port_problem(a.host, port, what) if port else None
            if problem:
                return fail(problem)
    try:
        KilnModel = _kserve_model_class()
    except ImportError as e:
        return fail(f"kiln serve needs KServe ({e}; pip install 'kiln[serve]')")
    server = make_server(a.host, a.http_port, a.grpc_port, a.max_request_bytes, not a.no_grpc,
                         log_requests=a.log_requests, worker=worker, sched_batch=a.sched_batch)
    stats_factory = None
    if worker is not None:
        from kiln.serve_workers import SharedStats

        stats_factory = functools.partial(SharedStats, worker=worker.index)
    remote = {}  # a front end of --batcher device: model name -> (EngineInfo, RemoteBatcher)
    if worker is not None and worker.batchers:
        from kiln.serve_workers import (EngineInfo, RemoteBatcher, SharedStats,
                                        connect_batchers)

        try:
            links = connect_batchers(worker.batchers, worker.index)
        except (OSError, ConnectionError, EOFError) as e:
            return fail(f"worker {worker.index}: cannot reach the batcher processes: {e}")
        models = {}
        for link in links:
            for name, meta in link.models.items():
                if name not in remote:
                    having = [x for x in links if name in x.models]
                    remote[name] = (EngineInfo(meta), RemoteBatcher(
                        name, having, meta, SharedStats(name, worker=worker.index)))
                    models[name] = ""
    loaded, errors = [], []
    for name, path in models.items():
        m = KilnModel(name, path, a.contexts, a.max_batch_size, a.batch_delay_ms / 1000.0,
                      devices=devices, pad_batches=a.pad_batches, warm=not a.no_warmup,
                      stats_factory=stats_factory, remote=remote.get(name))
        try:
            m.load()
        except Exception as e:  # noqa: BLE001 - one model that fails to load is reported, not fatal
            errors.append(f"model {name}: {e}")
            if worker is None:
                print(f"kiln: error: model {name}: {e}", file=sys.stderr)
            continue
        loaded.append(m)
    if not loaded:
        return fail("no model could be loaded" + (f" ({'; '.join(errors)})" if worker else ""))
    if worker is None:
        from prometheus_client import REGISTRY

        REGISTRY.register(StatsCollector(loaded))
    else:
        if worker.index == 0:  # the models the others could not load either
            for e in errors:
                print(f"kiln: error: {e}", file=sys.stderr)
        if not worker.loaded():  # every worker's models loaded; or the supervisor is gone
            return 1
        try:
            server.rest_sockets = reuseport_sockets(a.host, a.http_port)
        except OSError as e:
            return fail(f"cannot listen on {a.host}:{a.http_port} (REST): {e.strerror or e}")
    server.start(loaded)
    return 0


if __name__ == "__main__":
    sys.exit(main())
