"""kiln.bench and kiln.compare: what `kiln bench --export-json` and `kiln compare --export-json`
write, as Python objects. Both run the kiln CLI that ships with this package (the same library
build), so the numbers are the CLI's own."""
from __future__ import annotations

import json
import os
import shutil
import subprocess
import tempfile
from typing import Any, Mapping, Optional, Sequence, Union

import numpy as np

from kiln._kiln import KilnError, KilnTypeError, KilnValueError
from kiln.engine import Engine

PathLike = Union[str, os.PathLike]


def cli_path() -> str:
    """The kiln CLI: $KILN_CLI, else the one installed with this package, else `kiln` on PATH."""
    if os.environ.get("KILN_CLI"):
        return os.environ["KILN_CLI"]
    here = os.path.join(os.path.dirname(os.path.abspath(__file__)), "bin", "kiln")
    if os.path.exists(here):
        return here
    found = shutil.which("kiln")
    if not found:
        raise KilnError("the kiln CLI is not installed with this package (set KILN_CLI to it)")
    return found


def _run_cli(args: list[str], json_path: str, timeout: Optional[float]) -> Any:
    try:
        p = subprocess.run([cli_path(), *args, "--export-json", json_path], capture_output=True,
                           text=True, timeout=timeout)
    except subprocess.TimeoutExpired:
        raise KilnError(f"kiln {args[0]} did not finish within {timeout} s") from None
    if not os.path.exists(json_path):
        lines = [l for l in p.stderr.splitlines() if l.startswith("kiln: error: ")]
        msg = lines[-1][len("kiln: error: "):] if lines else (p.stderr.strip() or "no report")
        raise KilnError(msg)
    with open(json_path) as f:
        report = json.load(f)
    if p.returncode != 0 and args[0] != "compare":  # compare: 1 when --tolerance is exceeded
        raise KilnError(p.stderr.strip().splitlines()[-1] if p.stderr.strip() else "failed")
    return report


def _shape_flag(shapes: Optional[Mapping[str, Sequence[int]]]) -> list[str]:
    if not shapes:
        return []
    if not isinstance(shapes, Mapping):
        raise KilnTypeError("shapes must be a dict of input name -> shape")
    items = [f"{n}:{'x'.join(str(int(d)) for d in dims) or 'scalar'}" for n, dims in shapes.items()]
    return ["--shapes", ",".join(items)]


def _engine_file(engine: Union[Engine, PathLike], tmp: str, i: int = 0) -> str:
    if isinstance(engine, Engine):
        path = os.path.join(tmp, f"engine{i}.kiln")
        engine.save(path)
        return path
    if isinstance(engine, (str, os.PathLike)):
        return os.fspath(engine)
    raise KilnTypeError(f"an Engine or an engine file path, not {type(engine).__name__}")


def bench(engine: Union[Engine, PathLike], *, shapes: Optional[Mapping[str, Sequence[int]]] = None,
          batch: Optional[Sequence[int]] = None, warmup: int = 20, iterations: int = 200,
          duration: float = 2.0, use_cuda_graph: Optional[bool] = None,
          no_data_transfers: bool = False,
          dump_profile: bool = False, timeout: Optional[float] = None) -> dict:
    """Latency and throughput of an engine, as `kiln bench` measures them (CUDA events on the
    GPU: host-to-device copies, compute, device-to-host copies; wall clock on the CPU).

    `use_cuda_graph`: None, kiln's default (on the GPU, CUDA graphs replayed once an inference
    repeats); False, every layer launched at every inference (`--no-cuda-graph`).

    Returns what `kiln bench --export-json` writes (schema kiln.bench/1, docs/report.md): one
    record, or {"schema", "records": [...]} for a `batch` sweep."""
    with tempfile.TemporaryDirectory(prefix="kiln-bench-") as tmp:
        args = ["bench", "--engine", _engine_file(engine, tmp), *_shape_flag(shapes),
                "--warmup", str(int(warmup)), "--iterations", str(int(iterations)),
                "--duration", str(float(duration))]
        if batch:
            args += ["--batch", ",".join(str(int(b)) for b in batch)]
        if use_cuda_graph is not None:
            args.append("--use-cuda-graph" if use_cuda_graph else "--no-cuda-graph")
        args += ["--no-data-transfers"] * bool(no_data_transfers)
        args += ["--dump-profile"] * bool(dump_profile)
        return _run_cli(args, os.path.join(tmp, "bench.json"), timeout)


def compare(model: PathLike, *, engines: Sequence[Union[Engine, PathLike]] = (),
            precisions: Sequence[str] = (), inputs: Optional[Mapping[str, np.ndarray]] = None,
            shapes: Optional[Mapping[str, Sequence[int]]] = None, backend: Optional[str] = None,
            per_layer: bool = False, tolerance: Optional[float] = None, seed: int = 1,
            timing_cache: Optional[PathLike] = None, timeout: Optional[float] = None) -> dict:
    """Accuracy of engines (or of precisions built on the fly: 'fp32', 'tf32', 'fp16', 'int8')
    against the ONNX model run in float64 on the CPU, as `kiln compare` reports it: per output
    max abs error, relative L2, cosine and top-1 agreement; `per_layer` also localises the first
    layer where the error jumps. `inputs` (name -> array; the rest random from `seed`).

    Returns what `kiln compare --export-json` writes (schema kiln.compare/1); its "passed" is
    False when an output's relative L2 error exceeds `tolerance`."""
    if isinstance(precisions, str) or isinstance(engines, (str, os.PathLike, Engine)):
        raise KilnTypeError("engines and precisions are lists")
    with tempfile.TemporaryDirectory(prefix="kiln-compare-") as tmp:
        args = ["compare", os.fspath(model), *_shape_flag(shapes), "--seed", str(int(seed))]
        files = [_engine_file(e, tmp, i) for i, e in enumerate(engines)]
        if files:
            args += ["--engines", ",".join(files)]
        if precisions:
            args += ["--precisions", ",".join(precisions)]
        for name, arr in (inputs or {}).items():
            if not isinstance(arr, np.ndarray):
                raise KilnTypeError(f"inputs['{name}'] must be a NumPy array")
            path = os.path.join(tmp, f"input{len(args)}.npy")
            np.save(path, np.ascontiguousarray(arr))
            args += ["--input", f"{name}={path}"]
        if backend:
            args += ["--backend", backend]
        if per_layer:
            args += ["--per-layer"]
        if tolerance is not None:
            if tolerance < 0:
                raise KilnValueError("tolerance must be >= 0")
            args += ["--tolerance", repr(float(tolerance))]
        if timing_cache:
            args += ["--timing-cache", os.fspath(timing_cache)]
        return _run_cli(args, os.path.join(tmp, "compare.json"), timeout)
