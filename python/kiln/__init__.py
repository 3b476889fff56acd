"""kiln: an ONNX inference optimizer and runtime for NVIDIA GPUs, with a CPU reference backend.

    import kiln
    engine = kiln.build("model.onnx", fp16=True)        # or kiln.load("model.kiln")
    engine.save("model.kiln")
    ctx = engine.create_context()
    outputs = ctx.run({"input": x})                     # NumPy arrays, or PyTorch CUDA tensors

docs/python.md describes the package. `kiln serve` (the CLI's C++ server) serves engines over the
Open Inference Protocol; kiln.kserve is a predictor for KServe's ModelServer, and kiln.ray_serve
a Ray Serve deployment, both on kiln.Context.
"""
from kiln._kiln import (
    KilnError,
    KilnTypeError,
    KilnValueError,
    TensorInfo,
    __version__,
    backend_unavailable_reason,
    default_backend,
)
from kiln.context import Context
from kiln.engine import Engine, build, device_count, load, set_gpu_wait
from kiln.session import InferenceSession, NodeArg
from kiln.tools import bench, compare

__all__ = [
    "Context", "Engine", "InferenceSession", "KilnError", "KilnTypeError", "KilnValueError",
    "NodeArg", "TensorInfo", "__version__", "backend_unavailable_reason", "bench", "build",
    "compare", "default_backend", "device_count", "load", "set_gpu_wait",
]
