"""A Polygraphy runner for kiln, so that Polygraphy's Comparator can run kiln beside ONNX
Runtime or TensorRT::

    from polygraphy.backend.onnxrt import OnnxrtRunner, SessionFromOnnx
    from polygraphy.comparator import Comparator
    from kiln.polygraphy import KilnRunner

    runners = [OnnxrtRunner(SessionFromOnnx("model.onnx")), KilnRunner("model.onnx")]
    results = Comparator.run(runners)
    assert bool(Comparator.compare_accuracy(results))
"""
from __future__ import annotations

import time
from collections import OrderedDict
from typing import Any, Callable, Union

from polygraphy.backend.base import BaseRunner
from polygraphy.common import TensorMetadata

import kiln
from kiln.engine import Engine


class KilnRunner(BaseRunner):
    """Runs a kiln engine: an Engine, an engine file (.kiln), an ONNX model (built when the
    runner is activated, with `build_options` as kiln.build takes them), or a callable that
    returns an Engine."""

    def __init__(self, model: Union[str, Engine, Callable[[], Engine]], name: str = None,
                 **build_options: Any):
        super().__init__(name=name, prefix="kiln-runner")
        self._model = model
        self._build_options = build_options

    def activate_impl(self):
        m = self._model
        if callable(m) and not isinstance(m, Engine):
            m = m()
        if isinstance(m, Engine):
            self.engine = m
        elif str(m).endswith(".onnx"):
            self.engine = kiln.build(m, **self._build_options)
        else:
            self.engine = kiln.load(m)
        self.context = self.engine.create_context()

    def get_input_metadata_impl(self):
        import numpy as np

        meta = TensorMetadata()
        for t in self.engine.inputs:
            meta.add(t.name, dtype=np.dtype(t.dtype),
                     shape=[d if isinstance(d, int) else -1 for d in t.shape])
        return meta

    def infer_impl(self, feed_dict):
        start = time.time()
        out = self.context.run(dict(feed_dict))
        self.inference_time = time.time() - start
        return OrderedDict((t.name, out[t.name]) for t in self.engine.outputs)

    def deactivate_impl(self):
        del self.context
        del self.engine
