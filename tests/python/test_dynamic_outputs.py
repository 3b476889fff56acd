"""Engines whose output sizes the data decides (a detector's boxes) from Python: run() on PyTorch
CUDA tensors returns outputs at their real shapes in memory from PyTorch's allocator, and
TensorRT's IOutputAllocator shape (set_output_allocator, execute_async, get_tensor_shape); bad
allocators give one-line errors. The GPU tests skip without a usable GPU."""
import numpy as np
import pytest
from conftest import gpu_reason

import kiln


def _positives_model():
    """x float[N] -> (idx int64[1, K]: where x > 0, vals float[K]: those values); K decided by x."""
    import onnx
    from onnx import TensorProto, helper

    g = helper.make_graph(
        [helper.make_node("Greater", ["x", "zero"], ["pos"]),
         helper.make_node("NonZero", ["pos"], ["idx"]),
         helper.make_node("Squeeze", ["idx", "axis0"], ["flat"]),
         helper.make_node("Gather", ["x", "flat"], ["vals"])],
        "positives",
        [helper.make_tensor_value_info("x", TensorProto.FLOAT, ["N"])],
        [helper.make_tensor_value_info("idx", TensorProto.INT64, [1, "K"]),
         helper.make_tensor_value_info("vals", TensorProto.FLOAT, ["K"])],
        [helper.make_tensor("zero", TensorProto.FLOAT, [], [0.0]),
         helper.make_tensor("axis0", TensorProto.INT64, [1], [0])])
    return helper.make_model(g, opset_imports=[helper.make_opsetid("", 17)])


def _build(backend):
    return kiln.build(_positives_model().SerializeToString(), backend=backend,
                      min_shapes={"x": [1]}, opt_shapes={"x": [64]}, max_shapes={"x": [256]})


def test_output_allocator_needs_both_methods_and_a_cuda_engine():
    ctx = _build("cpu").create_context()

    class Half:
        def reallocate_output(self, name, memory, size, alignment):
            return 0

    with pytest.raises(kiln.KilnTypeError, match="notify_shape"):
        ctx.set_output_allocator("vals", Half())
    with pytest.raises(kiln.KilnError, match="cuda backend"):
        ctx.set_output_allocator("vals", _Recorder(None))
    x = np.array([1.0, -2.0, 3.0], dtype=np.float32)  # the host path is unchanged
    out = ctx.run({"x": x})
    np.testing.assert_array_equal(out["idx"], [[0, 2]])
    np.testing.assert_array_equal(out["vals"], [1.0, 3.0])


class _Recorder:
    """A TensorRT-style IOutputAllocator on PyTorch tensors, recording the shapes it is told."""

    def __init__(self, torch):
        self.torch, self.bufs, self.shapes, self.calls = torch, {}, {}, 0

    def reallocate_output(self, name, memory, size, alignment):
        self.calls += 1
        buf = self.bufs.get(name)
        if buf is None or buf.numel() < size:
            buf = self.torch.empty(max(size, 1), dtype=self.torch.uint8, device="cuda")
            self.bufs[name] = buf
        return buf.data_ptr()

    def notify_shape(self, name, shape):
        self.shapes[name] = tuple(shape)


@pytest.mark.skipif(bool(gpu_reason()), reason=f"no usable GPU: {gpu_reason()}")
def test_run_on_torch_tensors_returns_the_real_shapes():
    torch = pytest.importorskip("torch")
    engine = _build("cuda")
    assert "dynamic_region" in engine.inspect()
    ctx = engine.create_context()
    for n in (5, 64, 256, 1):
        x = torch.randn(n, device="cuda")
        out = ctx.run({"x": x})
        want = x[x > 0]
        assert out["vals"].is_cuda and out["vals"].dtype == torch.float32
        assert tuple(out["idx"].shape) == (1, want.numel())
        torch.testing.assert_close(out["vals"], want)
        torch.testing.assert_close(out["idx"][0], torch.nonzero(x > 0).flatten())
        host = ctx.run({"x": x.cpu().numpy()})  # the host path agrees
        np.testing.assert_array_equal(host["vals"], want.cpu().numpy())
    empty = ctx.run({"x": -torch.ones(8, device="cuda")})  # nothing over 0: K = 0
    assert tuple(empty["vals"].shape) == (0,) and tuple(empty["idx"].shape) == (1, 0)
    with pytest.raises(kiln.KilnValueError, match="outputs= cannot be given"):
        ctx.run({"x": x}, outputs={"vals": torch.empty(1, device="cuda")})


@pytest.mark.skipif(bool(gpu_reason()), reason=f"no usable GPU: {gpu_reason()}")
def test_tensorrt_output_allocator():
    torch = pytest.importorskip("torch")
    ctx = _build("cuda").create_context()
    rec = _Recorder(torch)
    for name in ("idx", "vals"):
        ctx.set_output_allocator(name, rec)
    x = torch.tensor([0.5, -1.0, 2.0, 3.0], device="cuda")
    ctx.set_input_shape("x", [4])
    ctx.set_tensor_address("x", x.data_ptr())
    ctx.execute_async(torch.cuda.current_stream().cuda_stream)
    torch.cuda.synchronize()
    assert rec.shapes == {"idx": (1, 3), "vals": (3,)} and rec.calls == 2
    assert ctx.get_tensor_shape("vals") == [3]
    torch.testing.assert_close(rec.bufs["vals"][:12].view(torch.float32),
                               torch.tensor([0.5, 2.0, 3.0], device="cuda"))
    # run() uses its own allocator and leaves these set
    torch.testing.assert_close(ctx.run({"x": x})["vals"], x[x > 0])
    ctx.execute_async(torch.cuda.current_stream().cuda_stream)
    torch.cuda.synchronize()
    assert rec.calls == 4

    class Raises(_Recorder):
        def reallocate_output(self, name, memory, size, alignment):
            raise MemoryError("pool exhausted\nsecond line")

    ctx.set_output_allocator("vals", Raises(torch))
    with pytest.raises(kiln.KilnError, match="reallocate_output raised MemoryError: pool exhausted") as e:
        ctx.execute_async(torch.cuda.current_stream().cuda_stream)
    assert "\n" not in str(e.value)

    class Null(_Recorder):
        def reallocate_output(self, name, memory, size, alignment):
            return 0

    ctx.set_output_allocator("vals", Null(torch))
    with pytest.raises(kiln.KilnError, match="gave no memory"):
        ctx.execute_async(torch.cuda.current_stream().cuda_stream)
    ctx.set_output_allocator("vals", None)
    with pytest.raises(kiln.KilnError, match="set_output_allocator"):
        ctx.execute_async(torch.cuda.current_stream().cuda_stream)
    ctx.set_output_allocator("vals", rec)  # the context runs again after the failures
    ctx.execute_async(torch.cuda.current_stream().cuda_stream)
    torch.cuda.synchronize()
    assert rec.shapes["vals"] == (3,)
