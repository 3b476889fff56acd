"""Engines: kiln.build (ONNX -> engine), kiln.load (engine file -> engine) and Engine."""
from __future__ import annotations

import json
import os
import sys
import tempfile
import time
from typing import Any, Callable, List, Mapping, Optional, Sequence, Union

import numpy as np

from kiln import _kiln
from kiln._kiln import KilnTypeError, KilnValueError, TensorInfo

ShapeArg = Optional[Mapping[str, Sequence[int]]]
Progress = Union[None, bool, Callable[[str], Any]]
IoFormats = Union[None, str, Sequence[str]]


class Engine:
    """An optimized, runnable model: what `kiln build` writes and `kiln run` loads.

    Make one with :func:`kiln.build` or :func:`kiln.load`; run it through
    :meth:`create_context` (one context per concurrent caller) or :class:`kiln.InferenceSession`.
    """

    def __init__(self, core: _kiln.Engine):
        self._core = core
        self._inspect: Optional[dict] = None
        self.build_options: dict = json.loads(core.build_options_json or "{}")
        #: Optimization profile per input: {name: {"min": [...], "opt": [...], "max": [...]}}.
        self.profile: dict = self.build_options.get("profile", {}) or {}

    @property
    def inputs(self) -> list[TensorInfo]:
        """The inputs: name, dtype (NumPy's name) and shape (ints, symbols of dynamic dims)."""
        return self._core.inputs

    @property
    def outputs(self) -> list[TensorInfo]:
        """The outputs, as :attr:`inputs`."""
        return self._core.outputs

    @property
    def backend(self) -> str:
        """'cpu' or 'cuda': where the engine runs."""
        return self._core.backend

    @property
    def target(self) -> str:
        """The machine the engine was built for (CPU, or GPU and library versions)."""
        return self._core.target

    @property
    def kiln_version(self) -> str:
        return self._core.kiln_version

    @property
    def device(self) -> Optional[int]:
        """The CUDA device the engine was loaded onto (:func:`load`'s `device`), None when it
        was not given (the current device) or for a cpu engine."""
        d = self._core.device
        return None if d < 0 else d

    def inspect(self) -> dict:
        """What `kiln inspect --json` prints for this engine, as Python objects."""
        if self._inspect is None:
            self._inspect = json.loads(self._core.inspect_json())
        return self._inspect

    @property
    def layers(self) -> list[dict]:
        """The layers as `kiln inspect --json` lists them: name, type, precision, inputs,
        outputs, the ONNX nodes each covers, and on cuda the tactic and its tuned time."""
        return self.inspect()["layers"]

    @property
    def device_memory(self) -> Optional[dict]:
        """Device memory of a cuda engine per profile point: {"weights": bytes, "min"|"opt"|"max":
        {"shapes", "activations", "workspace"}} ({"note": why} without a GPU); None on cpu."""
        return self.inspect().get("device_memory")

    def save(self, path: Union[str, os.PathLike]) -> None:
        """Writes the engine file (atomically: a temporary file, then a rename)."""
        self._core.save(os.fspath(path))

    def create_context(self):
        """A new execution context: it owns the activation memory of one inference at a time."""
        from kiln.context import Context

        return Context(self)

    def input(self, name: str) -> TensorInfo:
        for t in self.inputs:
            if t.name == name:
                return t
        raise KilnValueError(
            f"the engine has no input named '{name}' (its inputs: "
            f"{', '.join(t.name for t in self.inputs)})")

    def __repr__(self) -> str:
        ins = ", ".join(str(t) for t in self.inputs)
        outs = ", ".join(str(t) for t in self.outputs)
        return f"<kiln.Engine {self.backend} ({ins}) -> ({outs})>"


def load(path: Union[str, os.PathLike], device: Optional[int] = None) -> Engine:
    """Loads an engine file written by `kiln build` or :meth:`Engine.save`.

    `device`: the CUDA device (an index) whose memory holds the engine's weights and whose
    streams its contexts run on; default: the current device (device 0 unless the caller set
    another). Each load is an engine of its own: load a file once per device to serve from
    several GPUs. A cpu engine ignores it; a device that does not exist raises KilnValueError.

    A file from another kiln version or machine, or a damaged one, raises :class:`KilnError`
    saying what to rebuild."""
    if device is not None and (not isinstance(device, int) or isinstance(device, bool)
                               or device < 0):
        raise KilnValueError(f"device must be a CUDA device index (an int >= 0), not {device!r}")
    return Engine(_kiln.load(os.fspath(path), -1 if device is None else device))


def device_count() -> int:
    """CUDA devices this process sees (0 without CUDA, a driver or a GPU)."""
    return int(_kiln.cuda_device_count())


def set_gpu_wait(mode: str) -> int:
    """How this process's threads wait for the GPUs (a CUDA context's scheduling flag): 'block'
    (cudaDeviceScheduleBlockingSync: the waiting thread sleeps until the GPU is done, as
    trtexec and `kiln serve` wait by default), 'spin' (it spins on its core: trtexec's
    --useSpinWait, `kiln serve --spin-wait`), 'yield' (spins, yielding) or 'auto' (CUDA's
    default: spin while the process has fewer CUDA contexts than the machine has cores). It
    must come before this process loads an engine or makes a context on a GPU (a KilnError says
    which device's context exists already, with another mode); an unknown mode is a
    KilnValueError. Returns the number of GPUs set: 0 without a GPU or CUDA, where it does
    nothing (the cpu backend never waits for a device)."""
    return int(_kiln.set_gpu_wait(mode))


def _shapes(arg: ShapeArg, what: str) -> dict[str, list[int]]:
    if arg is None:
        return {}
    if not isinstance(arg, Mapping):
        raise KilnTypeError(f"{what} must be a dict of input name -> shape, not {type(arg).__name__}")
    out = {}
    for name, dims in arg.items():
        if not isinstance(name, str):
            raise KilnTypeError(f"{what}: input names are strings, not {type(name).__name__}")
        try:
            out[name] = [int(d) for d in dims]
        except (TypeError, ValueError):
            raise KilnTypeError(f"{what}['{name}'] must be a sequence of ints, not {dims!r}") from None
        if any(d < 0 for d in out[name]) or len(out[name]) != len(list(dims)):
            raise KilnValueError(f"{what}['{name}']: dimensions must be whole numbers >= 0")
    return out


def _calib_folders(calib: Any, tmp: str) -> dict[str, str]:
    """--calib as the builder takes it (input name, "" for the only input -> folder); arrays
    given in Python are written to .npy files in `tmp` first."""
    if calib is None:
        return {}
    if isinstance(calib, (str, os.PathLike)):
        return {"": os.fspath(calib)}
    if isinstance(calib, Mapping):
        out = {}
        for i, (name, v) in enumerate(calib.items()):
            if isinstance(v, Mapping):
                raise KilnTypeError(f"calib['{name}']: a folder or a list of NumPy batches")
            out[name] = _calib_folders(v, os.path.join(tmp, f"input{i}"))[""]
        return out
    if isinstance(calib, np.ndarray):
        calib = [calib]
    try:
        batches = list(calib)
    except TypeError:
        raise KilnTypeError("calib: a folder, a list of NumPy batches, or a dict of input name -> "
                            f"either; not {type(calib).__name__}") from None
    os.makedirs(tmp, exist_ok=True)
    for i, b in enumerate(batches):
        if not isinstance(b, np.ndarray):
            raise KilnTypeError(f"calib: batch {i} is a {type(b).__name__}, not a NumPy array")
        np.save(os.path.join(tmp, f"{i:06d}.npy"), b)
    return {"": tmp}


def _progress_printer() -> Callable[[str], None]:
    """Progress lines on stderr; per-batch lines overwrite each other on a terminal."""
    tty = sys.stderr.isatty()
    state = {"pending": False}

    def show(line: str) -> None:
        if ": batch " in line and tty:
            sys.stderr.write("\r" + line + "\033[K")
            state["pending"] = True
        else:
            if state["pending"]:
                sys.stderr.write("\n")
            state["pending"] = False
            sys.stderr.write(line + "\n")
        sys.stderr.flush()

    return show


def _io_formats(value: IoFormats, what: str) -> List[str]:
    """One spec for every float tensor ("fp16") or a list of one per tensor."""
    if value is None:
        return []
    if isinstance(value, str):
        return [value]
    if isinstance(value, (list, tuple)) and all(isinstance(v, str) for v in value):
        return list(value)
    raise KilnTypeError(f"{what} must be a string such as 'fp16' or a list of them, not {value!r}")


def build(onnx_path_or_bytes: Union[str, os.PathLike, bytes, Any], *, fp16: bool = False,
          int8: bool = False, best: bool = False, shapes: ShapeArg = None,
          min_shapes: ShapeArg = None, opt_shapes: ShapeArg = None, max_shapes: ShapeArg = None,
          calib: Any = None, calib_cache: Optional[str] = None,
          timing_cache: Optional[str] = None, opt_level: int = 2, backend: Optional[str] = None,
          tf32: bool = True, calib_algo: Optional[str] = None, calib_batches: int = 0,
          accuracy_budget: float = 0.0, layer_precisions: Optional[Mapping[str, str]] = None,
          input_io_formats: IoFormats = None, output_io_formats: IoFormats = None,
          progress: Progress = None) -> Engine:
    """Builds an engine from an ONNX model, as `kiln build` does (trtexec's option names).

    Args:
      onnx_path_or_bytes: a .onnx file, the model's bytes, or an ``onnx.ModelProto``.
      fp16, int8: allow FP16 / INT8 kernels (cuda backend; the cpu backend's int8 is the INT8
        reference). best: every precision allowed (trtexec's ``--best``).
      shapes: fixed input shapes {name: [dims]}; min_shapes/opt_shapes/max_shapes: an
        optimization profile for dynamic inputs (tactics are timed at opt_shapes).
      calib: INT8 calibration data: a folder of .npy files or images, a list of NumPy batches,
        or a dict input name -> either. calib_cache: reused when it matches, written after.
      timing_cache: read and update tactic timings in this file.
      opt_level: 0 = import as is, 1 = fold and clean up, 2 = also fuse.
      backend: 'cpu' or 'cuda' (default: cuda when a GPU is usable).
      input_io_formats, output_io_formats: the engine's input / output types (trtexec's
        ``--inputIOFormats`` / ``--outputIOFormats``): ``"fp16"`` or ``"fp32"`` for every float
        tensor, or a list with one per tensor in order (``["fp16", "int64"]``); default: the
        model's. An FP16 engine with ``output_io_formats="fp16"`` returns its last layers'
        float16 results without converting them to float32.
      progress: a callable taking each progress line, or True for lines on stderr.

    Raises KilnError (KilnValueError, KilnTypeError for bad arguments) with kiln's message.
    """
    if best:
        # trtexec's --best: every precision allowed.
        fp16 = int8 = True
    if not isinstance(opt_level, int) or isinstance(opt_level, bool):
        raise KilnTypeError(f"opt_level must be an int (0, 1 or 2), not {opt_level!r}")
    if backend is not None and not isinstance(backend, str):
        raise KilnTypeError(f"backend must be 'cpu', 'cuda' or None, not {backend!r}")
    say = _progress_printer() if progress is True else (progress or None)
    if say is not None and not callable(say):
        raise KilnTypeError("progress must be a callable, True or None")
    with tempfile.TemporaryDirectory(prefix="kiln-build-") as tmp:
        model = onnx_path_or_bytes
        if hasattr(model, "SerializeToString"):  # onnx.ModelProto
            model = model.SerializeToString()
        if isinstance(model, (bytes, bytearray, memoryview)):
            path = os.path.join(tmp, "model.onnx")
            with open(path, "wb") as f:
                f.write(model)
        elif isinstance(model, (str, os.PathLike)):
            path = os.fspath(model)
        else:
            raise KilnTypeError("build() takes a .onnx path, the model's bytes or an onnx.ModelProto, "
                                f"not {type(model).__name__}")
        precisions = "+".join(p for p, on in (("fp16", fp16), ("int8", int8)) if on) or "fp32"
        start = time.perf_counter()
        if say:
            say(f"building {os.path.basename(path)} ({backend or _kiln.default_backend()} backend, "
                f"{precisions})")
        core = _kiln.build(
            path, fp16=bool(fp16), int8=bool(int8), tf32=bool(tf32), opt_level=opt_level,
            backend=backend or "", shapes=_shapes(shapes, "shapes"),
            min_shapes=_shapes(min_shapes, "min_shapes"), opt_shapes=_shapes(opt_shapes, "opt_shapes"),
            max_shapes=_shapes(max_shapes, "max_shapes"),
            calib=_calib_folders(calib, os.path.join(tmp, "calib")), calib_algo=calib_algo or "",
            calib_cache=os.fspath(calib_cache) if calib_cache else "", calib_batches=int(calib_batches),
            accuracy_budget=float(accuracy_budget),
            timing_cache=os.fspath(timing_cache) if timing_cache else "",
            layer_precisions=dict(layer_precisions or {}),
            input_io_formats=_io_formats(input_io_formats, "input_io_formats"),
            output_io_formats=_io_formats(output_io_formats, "output_io_formats"), progress=say)
        if say:
            say(f"built in {time.perf_counter() - start:.2f} s")
    return Engine(core)
