"""kiln engines in the Open Inference Protocol's (v2) terms, through KServe's own request and
response types (kserve.InferRequest, InferResponse): what kiln.kserve and kiln.ray_serve share.
No protocol code of kiln's: KServe decodes and encodes the messages, this module maps their
tensors to an engine's inputs and outputs and says in one line what does not fit."""
from __future__ import annotations

import os
import struct

import numpy as np

# Open Inference Protocol (v2) datatypes per kiln element type.
V2_DATATYPES = {
    "bool": "BOOL", "uint8": "UINT8", "uint16": "UINT16", "uint32": "UINT32", "uint64": "UINT64",
    "int8": "INT8", "int16": "INT16", "int32": "INT32", "int64": "INT64", "float16": "FP16",
    "float32": "FP32", "float64": "FP64", "bfloat16": "BF16",
}


class RequestError(ValueError):
    """A request the model cannot take (unknown input, wrong datatype or shape): a 400."""


def malformed_errors() -> tuple:
    """What KServe's own decoding of a REST body raises on a malformed one (a binary_data_size
    that is not a number or runs past the body, an input without a name, a shape of floats,
    ...), each the request's fault: a 400, where KServe alone answers 500."""
    from kserve.errors import InferenceError

    return (ValueError, TypeError, KeyError, AttributeError, IndexError, struct.error,
            InferenceError)


def malformed_message(e: Exception) -> str:
    """One line for a body KServe could not decode."""
    return f"malformed request: {type(e).__name__}: {' '.join(str(e).split())}"


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


def _input_specs(engine) -> dict:
    """{name: (dtype name, shape with -1 for dynamic dims, profile min, profile max)} of the
    engine's inputs, made once per engine (Engine.inputs builds its list anew on every call)."""
    specs = getattr(engine, "_v2_input_specs", None)
    if specs is None:
        specs = {}
        for t in engine.inputs:
            prof = engine.profile.get(t.name)
            specs[t.name] = (t.dtype, [d if isinstance(d, int) else -1 for d in t.shape],
                             list(prof["min"]) if prof else None,
                             list(prof["max"]) if prof else None)
        try:
            engine._v2_input_specs = specs
        except AttributeError:  # an engine-like object that takes no attributes
            pass
    return specs


def check_request(engine, feeds: dict[str, np.ndarray], batching: bool = False) -> int:
    """Checks a request's names, element types and shapes against the engine (with `batching`,
    also that every input has the same first dimension); returns its batch (first dim)."""
    want = _input_specs(engine)
    for name in feeds:
        if name not in want:
            raise RequestError(f"unknown input '{name}' (the model's inputs: {', '.join(want)})")
    batch = None
    for name, (dtype, shape, lo, hi) in want.items():
        a = feeds.get(name)
        if a is None:
            raise RequestError(f"input '{name}' is missing")
        if a.dtype.name != dtype:
            raise RequestError(f"input '{name}': datatype "
                               f"{V2_DATATYPES.get(a.dtype.name, a.dtype.name)}, the model takes "
                               f"{V2_DATATYPES.get(dtype, dtype)}")
        got = a.shape
        if len(got) != len(shape) or any(w >= 0 and g != w for g, w in zip(got, shape)):
            raise RequestError(f"input '{name}': shape {list(got)}, the model takes {shape}")
        if lo is not None and any(g < mn or g > mx for g, mn, mx in zip(got, lo, hi)):
            raise RequestError(f"input '{name}': shape {list(got)} is outside the model's range "
                               f"(min {lo}, max {hi})")
        if batching:
            if batch is not None and got[0] != batch:
                raise RequestError(f"input '{name}': batch {got[0]}, other inputs have {batch}")
            batch = got[0]
    return batch or 1


def decode_request(payload, engine, batching: bool = False) -> dict[str, np.ndarray]:
    """The input arrays of a v2 request (KServe's InferRequest), checked against the engine;
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
    """A v2 response (KServe's InferResponse) with the outputs the request asked for (all when
    it names none), each binary where the request wants it binary (its own `binary_data`
    parameter, else the request's `binary_data_output`)."""
    from kserve.protocol.infer_type import InferOutput, InferResponse, RequestedOutput

    binary = bool(payload.use_binary_outputs)
    requested = None
    if payload.request_outputs:
        requested = [RequestedOutput(o.name, {"binary_data": binary if o.binary_data is None
                                              else bool(o.binary_data)})
                     for o in payload.request_outputs]
    outputs = []
    for name in [o.name for o in requested] if requested else list(out):
        if name not in out:
            raise RequestError(f"unknown output '{name}' (the model's outputs: {', '.join(out)})")
        arr = np.ascontiguousarray(out[name])
        o = InferOutput(name=name, shape=list(arr.shape), datatype=V2_DATATYPES[arr.dtype.name])
        o.set_data_from_numpy(arr, binary_data=True)
        outputs.append(o)
    return InferResponse(response_id=payload.id or "", model_name=model_name,
                         infer_outputs=outputs, use_binary_outputs=binary,
                         requested_outputs=requested)
