"""kiln.InferenceSession: ONNX Runtime's high-level interface over a kiln engine."""
from __future__ import annotations

import os
import queue
import threading
from typing import Any, Mapping, Optional, Sequence, Union

from kiln._kiln import KilnTypeError, KilnValueError
from kiln.engine import Engine, build, load

# ONNX Runtime's type strings ("tensor(float)") per kiln element type.
_ORT_TYPES = {"float32": "float", "float64": "double"}


class NodeArg:
    """An input or output as ONNX Runtime's NodeArg describes it: name, type, shape."""

    def __init__(self, name: str, type: str, shape: list):
        self.name, self.type, self.shape = name, type, shape

    def __repr__(self) -> str:
        return f"NodeArg(name='{self.name}', type='{self.type}', shape={self.shape})"


class InferenceSession:
    """Runs a kiln engine with ONNX Runtime's interface::

        sess = kiln.InferenceSession("model.kiln")          # or a .onnx file, or an Engine
        (y,) = sess.run(None, {"input": x})

    A .onnx path (or the model's bytes) is built first, with `build_options` as
    :func:`kiln.build` takes them. ``run`` may be called from several threads at once: each
    call takes an execution context of its own (up to `max_contexts`, made as needed).
    """

    def __init__(self, path_or_engine: Union[str, os.PathLike, bytes, Engine],
                 sess_options: Any = None, providers: Optional[Sequence] = None,
                 provider_options: Optional[Sequence] = None, *, max_contexts: int = 8,
                 **build_options: Any):
        src = path_or_engine
        if isinstance(src, Engine):
            self.engine = src
        elif isinstance(src, (bytes, bytearray)) or str(os.fspath(src)).endswith(".onnx"):
            self.engine = build(src, **build_options)
        else:
            if build_options:
                raise KilnValueError("build options apply to an ONNX model; an engine file keeps "
                                     "the options it was built with")
            self.engine = load(src)
        if max_contexts < 1:
            raise KilnValueError("max_contexts must be at least 1")
        self._free: queue.LifoQueue = queue.LifoQueue()
        self._made = 0
        self._max = max_contexts
        self._lock = threading.Lock()

    @staticmethod
    def _args(infos) -> list[NodeArg]:
        return [NodeArg(t.name, f"tensor({_ORT_TYPES.get(t.dtype, t.dtype)})", list(t.shape))
                for t in infos]

    def get_inputs(self) -> list[NodeArg]:
        return self._args(self.engine.inputs)

    def get_outputs(self) -> list[NodeArg]:
        return self._args(self.engine.outputs)

    def get_providers(self) -> list[str]:
        """The backend the engine runs on, as a one-item list ('cuda' or 'cpu')."""
        return [self.engine.backend]

    def _take(self):
        try:
            return self._free.get_nowait()
        except queue.Empty:
            pass
        with self._lock:
            if self._made < self._max:
                self._made += 1
                try:
                    return self.engine.create_context()
                except BaseException:
                    self._made -= 1
                    raise
        return self._free.get()

    def run(self, output_names: Optional[Sequence[str]], input_feed: Mapping[str, Any],
            run_options: Any = None) -> list:
        """Runs the engine on `input_feed` (name -> array) and returns the outputs named in
        `output_names` (None: all), in that order."""
        names = [t.name for t in self.engine.outputs]
        if output_names is None:
            output_names = names
        elif isinstance(output_names, str):
            raise KilnTypeError("output_names is a list of names (or None), not one string")
        for n in output_names:
            if n not in names:
                raise KilnValueError(f"the engine has no output named '{n}' (its outputs: "
                                     f"{', '.join(names)})")
        ctx = self._take()
        try:
            out = ctx.run(input_feed)
        finally:
            self._free.put(ctx)
        return [out[n] for n in output_names]
