"""Execution contexts: run an engine on NumPy arrays, PyTorch tensors or any DLPack tensor."""
from __future__ import annotations

import math
import threading
from typing import Any, Mapping, Optional

import numpy as np

from kiln import _kiln
from kiln._kiln import KilnTypeError, KilnValueError

_DL_CPU, _DL_CUDA, _DL_CUDA_HOST, _DL_CUDA_MANAGED = 1, 2, 3, 13
_CUDA_STREAM_LEGACY = 1  # cudaStreamLegacy: the default stream of the CUDA runtime
_READY_BYTES = 16 << 20  # outputs up to this size are allocated a call ahead (_Repeat)


def _is_torch(x: Any) -> bool:
    return type(x).__module__.startswith("torch") and hasattr(x, "data_ptr")


def _torch_dtype(name: str):
    import torch

    return getattr(torch, {"bool": "bool"}.get(name, name))


class Context:
    """An execution context (TensorRT's IExecutionContext): the memory of one inference.

    A context runs one call at a time; use one context per thread to run in parallel (kiln
    releases the GIL while it works). Two ways to run:

    * :meth:`run` takes a dict of inputs and returns a dict of outputs: NumPy arrays in, NumPy
      arrays out (any engine); PyTorch CUDA tensors or other DLPack device tensors in, device
      tensors out, without host copies (cuda engines).
    * the TensorRT-shaped device path: :meth:`set_input_shape`, :meth:`set_tensor_address` for
      every input and output, then :meth:`execute_async` on a CUDA stream.

    On the GPU an inference that repeats a recent call's shapes and addresses is replayed as a
    CUDA graph (see :meth:`set_use_cuda_graph`).
    """

    def __init__(self, engine):
        self.engine = engine
        self._core = _kiln.create_context(engine._core)
        self._lock = threading.Lock()
        self._inputs = {t.name: t for t in engine.inputs}
        self._out_names = [t.name for t in engine.outputs]
        self._out_dtypes = [t.dtype for t in engine.outputs]
        self._repeat: Optional[_Repeat] = None  # run()'s path for a repeat of the last call
        self._data_dependent: Optional[bool] = None  # output sizes decided by the data (cuda)

    # ---- the dict API -------------------------------------------------------------------------
    def run(self, feeds: Mapping[str, Any], stream: Optional[int] = None,
            outputs: Optional[Mapping[str, Any]] = None) -> dict[str, Any]:
        """Runs the engine on `feeds` (input name -> tensor) and returns output name -> tensor.

        NumPy arrays (any strides; the element type must be the input's, kiln never converts):
        outputs are NumPy arrays. PyTorch CUDA tensors or any DLPack CUDA tensor (cuda engines):
        the engine reads them in place and writes outputs on the device (PyTorch tensors for
        PyTorch inputs, else DLPack tensors), on `stream` (an int handle, e.g.
        ``torch.cuda.current_stream().cuda_stream``; default: PyTorch's current stream for
        PyTorch inputs, else the CUDA default stream, waited for). `outputs` may give the
        output tensors to write (device path). An engine whose output sizes the data decides
        (a detector's) returns them at their real shapes; on the device it takes PyTorch
        tensors, and its outputs come from PyTorch's allocator.
        """
        if self._repeat is not None and outputs is None:
            result = self._repeat.run(self, feeds, stream)
            if result is not None:
                return result
        if not isinstance(feeds, Mapping):
            raise KilnTypeError(f"run() takes a dict of input name -> tensor, not {type(feeds).__name__}")
        self._repeat = None
        host, device = {}, {}
        for name, value in feeds.items():
            if not isinstance(name, str):
                raise KilnTypeError(f"input names are strings, not {type(name).__name__}")
            kind = _where(value)
            if kind == "host":
                host[name] = value if isinstance(value, np.ndarray) else _to_numpy(value)
            elif kind == "device":
                device[name] = value
            else:
                raise KilnTypeError(
                    f"input '{name}': expected a NumPy array, a PyTorch tensor or a DLPack tensor, "
                    f"not {type(value).__name__}")
        if host and device:
            raise KilnTypeError("run(): the inputs mix host arrays and device tensors "
                                f"(host: {', '.join(host)}; device: {', '.join(device)})")
        if device or outputs is not None:
            return self._run_device(device, stream, outputs)
        if stream is not None:
            raise KilnValueError("stream= applies to device tensors; these inputs are host arrays")
        self.check_inputs({k: (v.shape, v.dtype) for k, v in host.items()})
        with self._lock:
            arrays = self._core.execute(list(host.items()))
        return dict(zip(self._out_names, arrays))

    def check_inputs(self, shapes: Mapping[str, tuple]) -> None:
        """Checks names, element types and shapes {name: (shape, numpy dtype or None)} against
        the engine, raising KilnValueError / KilnTypeError with what is wrong."""
        for name in shapes:
            if name not in self._inputs:
                raise KilnValueError(f"the engine has no input named '{name}' (its inputs: "
                                     f"{', '.join(self._inputs)})")
        symbols: dict[str, tuple[str, int]] = {}
        for name, info in self._inputs.items():
            if name not in shapes:
                raise KilnValueError(f"input '{name}' was not given")
            shape, dtype = shapes[name]
            got = dtype if dtype is None or isinstance(dtype, str) else _dtype_name(dtype)
            if got is not None and got != info.dtype:
                raise KilnTypeError(
                    f"input '{name}': the engine takes {info.dtype}, not {got} (kiln does not "
                    f"convert arrays; convert it first, e.g. x.astype('{info.dtype}'))")
            _check_shape(name, tuple(shape), info.shape, self.engine.profile.get(name), symbols)

    def _run_device(self, feeds, stream, outputs):
        if self.engine.backend != "cuda":
            raise KilnValueError("this engine runs on the cpu backend: pass NumPy arrays, not device "
                                 "tensors (build it with backend='cuda' to run on the GPU)")
        torch_in = any(_is_torch(v) for v in feeds.values())
        names, addresses, shapes, keep = [], [], [], []
        checked = {}
        for name, v in feeds.items():
            if _is_torch(v):
                if not v.is_contiguous():
                    v = v.contiguous()  # a copy on the device
                dtype = str(v.dtype).replace("torch.", "")
                info = (v.data_ptr(), tuple(v.shape), dtype, _DL_CUDA, v.device.index, True)
            else:
                info = _kiln.dlpack_info(v)
                if not info[5]:
                    raise KilnValueError(f"input '{name}': a non-contiguous device tensor (make it "
                                         "contiguous on the device first)")
            keep.append(v)
            checked[name] = (info[1], info[2])
            names.append(name)
            addresses.append(info[0])
            shapes.append(list(info[1]))
        self.check_inputs(checked)
        if self._data_dependent is None:
            self._data_dependent = "dynamic_region" in self.engine.inspect()
        if self._data_dependent:
            return self._run_dynamic(feeds, names, addresses, shapes, stream, outputs, torch_in)
        if stream is None:
            if torch_in:
                import torch

                device = next(v.device for v in feeds.values() if _is_torch(v))
                stream = torch.cuda.current_stream(device).cuda_stream
            else:
                stream = 0  # the context's own stream, waited for before returning
            synchronize = not torch_in
        else:
            synchronize = False
        if not isinstance(stream, int) or stream < 0:
            raise KilnTypeError(f"stream must be a CUDA stream handle (an int), not {stream!r}")
        handle = stream or _CUDA_STREAM_LEGACY
        with self._lock:
            out_shapes = self._core._set_inputs(names, addresses, shapes)
            result = self._device_outputs(out_shapes, outputs, feeds, torch_in)
            out_addresses = [a for _, a in result.values()]
            self._core._enqueue_outputs(out_addresses, handle if not synchronize else 0)
        if outputs is None and keep and all(_is_torch(v) and v is feeds[n] for n, v in zip(names, keep)):
            self._repeat = _Repeat(feeds, out_shapes, [_torch_dtype(d) for d in self._out_dtypes])
        del keep
        return {name: t for name, (t, _) in result.items()}

    def _run_dynamic(self, feeds, names, addresses, shapes, stream, outputs, torch_in):
        """run() on an engine whose output sizes the data decides (`kiln inspect` says so: a
        detector's boxes): each output in memory from PyTorch's allocator, asked for once its
        size is known (TensorRT's IOutputAllocator), returned at its real shape."""
        if outputs is not None:
            raise KilnValueError("this engine's output sizes depend on the data: run() allocates "
                                 "its outputs (outputs= cannot be given; set_output_allocator "
                                 "and execute_async take your own memory)")
        if not torch_in:
            raise KilnTypeError("this engine's output sizes depend on the data: on the device, "
                                "run() takes PyTorch CUDA tensors (whose allocator gives the "
                                "outputs their memory); pass NumPy arrays to run on the host")
        import torch

        device = next(v.device for v in feeds.values() if _is_torch(v))
        if stream is None:
            stream = torch.cuda.current_stream(device).cuda_stream
        elif not isinstance(stream, int) or stream < 0:
            raise KilnTypeError(f"stream must be a CUDA stream handle (an int), not {stream!r}")
        alloc = _TorchOutputs(device)
        with self._lock:
            out_shapes = self._core._run_dynamic(names, addresses, shapes,
                                                 stream or _CUDA_STREAM_LEGACY, alloc)
        result = {}
        for name, dtype, shape in zip(self._out_names, self._out_dtypes, out_shapes):
            t = _torch_dtype(dtype)
            n = math.prod(shape)
            buf = alloc.buffers.get(name)
            if buf is None or n == 0:
                result[name] = torch.empty(shape, dtype=t, device=device)
            else:
                nbytes = n * torch.empty((), dtype=t).element_size()
                result[name] = buf[:nbytes].view(t).view(shape)
        return result

    def set_output_allocator(self, name: str, allocator) -> None:
        """Gives output `name` of an engine whose output sizes the data decides its memory for
        :meth:`execute_async` (TensorRT's ``IExecutionContext.set_output_allocator``):
        `allocator` has ``reallocate_output(name, memory, size, alignment) -> int`` (a device
        address of at least `size` bytes; `memory` is what it returned for this output last
        time, 0 the first) and ``notify_shape(name, shape)`` (the output's shape in this
        inference). kiln calls them from inside the inference, with the GIL held; what they
        raise fails the inference. None removes it. An engine whose output sizes follow from its
        input shapes takes addresses instead (:meth:`set_tensor_address`)."""
        self._repeat = None
        self._core.set_output_allocator(name, allocator)

    def _device_outputs(self, out_shapes, given, feeds, torch_in):
        result = {}
        for name, dtype, shape in zip(self._out_names, self._out_dtypes, out_shapes):
            if given is not None and name in given:
                t = given[name]
                if _is_torch(t):
                    info = (t.data_ptr(), tuple(t.shape), str(t.dtype).replace("torch.", ""),
                            _DL_CUDA if t.is_cuda else _DL_CPU, 0, t.is_contiguous())
                else:
                    info = _kiln.dlpack_info(t)
                if info[3] not in (_DL_CUDA, _DL_CUDA_MANAGED) or not info[5]:
                    raise KilnValueError(f"output '{name}': must be a contiguous CUDA tensor")
                if list(info[1]) != list(shape) or info[2] != dtype:
                    raise KilnValueError(f"output '{name}': the engine writes {dtype}{list(shape)}, "
                                         f"the tensor given is {info[2]}{list(info[1])}")
                result[name] = (t, info[0])
            elif torch_in:
                import torch

                device = next(v.device for v in feeds.values() if _is_torch(v))
                t = torch.empty(shape, dtype=_torch_dtype(dtype), device=device)
                result[name] = (t, t.data_ptr())
            else:
                result[name] = _kiln.device_empty(shape, dtype)  # (array, address)
        if given is not None:
            for name in given:
                if name not in result:
                    raise KilnValueError(f"the engine has no output named '{name}' (its outputs: "
                                         f"{', '.join(self._out_names)})")
        return result

    # ---- TensorRT's device path -----------------------------------------------------------------
    def set_input_shape(self, name: str, shape) -> None:
        """Sets an input's shape for the next :meth:`execute_async`."""
        self._repeat = None
        self._core.set_input_shape(name, [int(d) for d in shape])

    def get_tensor_shape(self, name: str) -> list[int]:
        """An input's shape as set, or an output's shape for the inputs' current shapes (for an
        engine whose output sizes the data decides: the last inference's)."""
        return self._core.get_tensor_shape(name)

    def set_tensor_address(self, name: str, address: int) -> None:
        """Sets the device address of an input or output (e.g. ``tensor.data_ptr()``)."""
        self._core.set_tensor_address(name, int(address))

    def execute_async(self, stream: int) -> None:
        """Enqueues an inference on the CUDA stream `stream` (an int handle) and returns."""
        self._core.execute_async(int(stream) or _CUDA_STREAM_LEGACY)

    def set_use_cuda_graph(self, on: bool) -> None:
        """CUDA graphs, on by default (cuda engines): an inference whose shapes and addresses
        repeat one of the last few calls' is captured once and replayed, one launch instead of
        one per layer. Off: every layer is launched at every call."""
        self._core.set_use_cuda_graph(bool(on))

    @property
    def memory_info(self) -> dict:
        """Device memory this context uses: weights (shared), activations, workspace (bytes)."""
        w, a, ws = self._core.memory_info()
        return {"weights": w, "activations": a, "workspace": ws}


class _TorchOutputs:
    """run()'s output allocator for an engine whose output sizes the data decides: each output's
    bytes as a PyTorch uint8 tensor on the inputs' device, kept until run() views it at the
    output's type and shape."""

    def __init__(self, device):
        import torch

        self.device = device
        self.empty = torch.empty
        self.uint8 = torch.uint8
        self.buffers = {}

    def reallocate_output(self, name, memory, size, alignment):
        buf = self.empty(max(int(size), 1), dtype=self.uint8, device=self.device)
        self.buffers[name] = buf
        return buf.data_ptr()

    def notify_shape(self, name, shape):
        pass  # run() reads the shapes back from the context


class _Repeat:
    """Context.run's path for a call that repeats the last one's PyTorch inputs: the same names,
    shapes, element types and device, contiguous, on a context whose shapes are still those of
    that call. What the last call checked is not checked again: the addresses are set and the
    inference enqueued in one call into kiln, with outputs from PyTorch's allocator.

    Where the outputs are small (at most _READY_BYTES together), each call also allocates the
    next call's outputs after its own inference is enqueued, while the GPU works, so a call that
    is waited for does not wait for torch.empty (several microseconds, at batch 1 a few percent
    of a small engine's latency). They are new tensors like any others, handed out once, and
    only on the stream they were allocated for."""

    def __init__(self, feeds, out_shapes, out_dtypes):
        import torch

        self.names = list(feeds)
        # (type, shape, dtype, device index): get_device() is an int, cheaper than a
        # torch.device to make and compare on every call
        self.specs = [(type(v), v.shape, v.dtype, v.get_device()) for v in feeds.values()]
        self.device = next(iter(feeds.values())).device
        self.outs = [(tuple(s), d) for s, d in zip(out_shapes, out_dtypes)]
        nbytes = sum(math.prod(s) * d.itemsize for s, d in self.outs)
        self.prepare = nbytes <= _READY_BYTES
        self.ready = None  # (stream, outputs) allocated by the last call for this one
        raw = getattr(torch._C, "_cuda_getCurrentRawStream", None)
        index = self.device.index if self.device.index is not None else torch.cuda.current_device()
        self.stream = (lambda: raw(index)) if raw else (
            lambda: torch.cuda.current_stream(self.device).cuda_stream)
        self.empty = torch.empty

    def run(self, ctx, feeds, stream):
        """The outputs, or None when `feeds` is not such a repeat (the full path then runs)."""
        if type(feeds) is not dict or len(feeds) != len(self.names):
            return None
        values = []
        for name, (kind, shape, dtype, device) in zip(self.names, self.specs):
            v = feeds.get(name)
            if (type(v) is not kind or v.shape != shape or v.dtype != dtype
                    or v.get_device() != device or not v.is_contiguous()):
                return None
            values.append(v)
        if stream is None:
            stream = self.stream()
        elif not isinstance(stream, int) or stream < 0:
            return None
        with ctx._lock:
            if ctx._repeat is not self:
                return None
            ready, self.ready = self.ready, None
            outs = (ready[1] if ready is not None and ready[0] == stream else
                    [self.empty(s, dtype=d, device=self.device) for s, d in self.outs])
            ctx._core._run_addresses(self.names, [v.data_ptr() for v in values],
                                     [o.data_ptr() for o in outs], stream or _CUDA_STREAM_LEGACY)
        if self.prepare:
            self.ready = (stream, [self.empty(s, dtype=d, device=self.device)
                                   for s, d in self.outs])
        return dict(zip(ctx._out_names, outs))


def _dtype_name(dtype) -> str:
    """NumPy's name of an element type; a byte-swapped or structured one keeps its full form."""
    d = np.dtype(dtype)
    return d.name if d.isnative and d.fields is None else d.str


def _where(value: Any) -> str:
    """'host', 'device' or '' (not a tensor kiln takes)."""
    if isinstance(value, np.ndarray):
        return "host"
    if _is_torch(value):
        return "device" if value.is_cuda else "host"
    dev = getattr(value, "__dlpack_device__", None)
    if dev is None:
        return ""
    kind = dev()[0]
    if kind in (_DL_CUDA, _DL_CUDA_MANAGED):
        return "device"
    return "host" if kind in (_DL_CPU, _DL_CUDA_HOST) else ""


def _to_numpy(value: Any) -> np.ndarray:
    if _is_torch(value):
        return value.detach().numpy()  # shares the tensor's memory
    return np.from_dlpack(value)


def _check_shape(name, shape, declared, profile, symbols):
    def fmt(dims):
        return "[" + ",".join("?" if d is None else str(d) for d in dims) + "]"

    if len(shape) != len(declared):
        raise KilnValueError(f"input '{name}': shape {fmt(shape)} has rank {len(shape)}, the engine "
                             f"takes {fmt(declared)}")
    for i, (got, want) in enumerate(zip(shape, declared)):
        if isinstance(want, int) and got != want:
            raise KilnValueError(f"input '{name}': shape {fmt(shape)} does not fit the engine's "
                                 f"{fmt(declared)} (dimension {i} must be {want})")
        if isinstance(want, str):
            seen = symbols.setdefault(want, (name, got))
            if seen[1] != got:
                raise KilnValueError(f"input '{name}': dimension {i} ('{want}') is {got} but input "
                                     f"'{seen[0]}' gives '{want}' = {seen[1]}")
    if profile:
        lo, hi = profile["min"], profile["max"]
        if any(g < a or g > b for g, a, b in zip(shape, lo, hi)):
            raise KilnValueError(f"input '{name}': shape {fmt(shape)} is outside the engine's "
                                 f"profile (min {fmt(lo)}, max {fmt(hi)})")
