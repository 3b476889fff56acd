"""The Python API on the cpu backend: build -> save -> load -> run against ONNX Runtime, the
engine's description, ONNX Runtime's and TensorRT's interfaces, DLPack and threads."""
import threading

import numpy as np
import pytest
from conftest import feeds_for, gpu_reason, ort_outputs, rel_l2

import kiln
import small_models


@pytest.mark.parametrize("name", list(small_models.MODELS))
def test_round_trip_matches_onnxruntime(name, models_dir, tmp_path):
    model = models_dir / f"{name}.onnx"
    engine = kiln.build(str(model), backend="cpu")
    path = tmp_path / f"{name}.kiln"
    engine.save(path)
    loaded = kiln.load(path)
    assert [t.name for t in loaded.inputs] == [t.name for t in engine.inputs]
    ctx = loaded.create_context()
    rng = np.random.default_rng(0)
    for batch in (1, 3):
        feeds = feeds_for(name, batch, rng)
        got = ctx.run(feeds)
        want = ort_outputs(model, feeds)
        assert list(got) == [t.name for t in loaded.outputs]
        for k in want:
            assert isinstance(got[k], np.ndarray)
            assert got[k].shape == want[k].shape
            assert rel_l2(got[k], want[k]) < 1e-5, k


def test_engine_description(cnn_engine):
    (inp,) = cnn_engine.inputs
    assert inp.name == "input" and inp.dtype == "float32"
    assert isinstance(inp.shape[0], str) and inp.shape[1:] == [3, 32, 32]
    assert cnn_engine.backend == "cpu"
    assert cnn_engine.profile["input"]["max"] == [8, 3, 32, 32]
    layers = cnn_engine.layers
    assert layers and {"name", "type", "precision", "onnx_nodes"} <= set(layers[0])
    # BatchNorm folds into the convolutions and ReLU fuses (-O2): fewer layers than ONNX nodes.
    assert not any(l["type"] == "BatchNormalization" for l in layers)
    assert any(l["type"] == "kiln.FusedConv" for l in layers)
    assert cnn_engine.device_memory is None  # cpu engines keep nothing on a device
    assert cnn_engine.inspect()["kind"] == "kiln engine"


def test_build_from_bytes_and_model_proto_with_progress(models_dir):
    import onnx

    proto = onnx.load(str(models_dir / "mlp.onnx"))
    lines = []
    e1 = kiln.build(proto.SerializeToString(), backend="cpu", progress=lines.append)
    e2 = kiln.build(proto, backend="cpu", opt_level=0)
    assert lines[0].startswith("building model.onnx (cpu backend") and lines[-1].startswith("built in")
    x = np.random.default_rng(0).standard_normal((2, 64)).astype(np.float32)
    a = e1.create_context().run({"x": x})
    b = e2.create_context().run({"x": x})
    for k in a:
        np.testing.assert_allclose(a[k], b[k], rtol=1e-5, atol=1e-6)


def test_fp16_io_formats(models_dir):
    """trtexec's --inputIOFormats / --outputIOFormats: float16 in and out, the same names, the
    model's float32 arithmetic in between (rounded to float16 once, at the end)."""
    path = str(models_dir / "mlp.onnx")
    half = kiln.build(path, backend="cpu", input_io_formats="fp16", output_io_formats=["fp16"])
    full = kiln.build(path, backend="cpu")
    assert [t.dtype for t in half.inputs] == ["float16"]
    assert [t.dtype for t in half.outputs] == ["float16"] * len(full.outputs)
    assert [t.name for t in half.outputs] == [t.name for t in full.outputs]
    x = np.random.default_rng(0).standard_normal((2, 64)).astype(np.float16)
    a = half.create_context().run({"x": x})
    b = full.create_context().run({"x": x.astype(np.float32)})
    for k in b:
        assert a[k].dtype == np.float16
        np.testing.assert_array_equal(a[k], b[k].astype(np.float16))
    with pytest.raises(kiln.KilnError, match="'fp8' is not a type"):
        kiln.build(path, backend="cpu", output_io_formats="fp8")
    with pytest.raises(kiln.KilnTypeError, match="output_io_formats must be"):
        kiln.build(path, backend="cpu", output_io_formats=16)


def test_non_contiguous_numpy_inputs(cnn_engine):
    rng = np.random.default_rng(1)
    base = rng.standard_normal((2, 32, 32, 3)).astype(np.float32)
    strided = base.transpose(0, 3, 1, 2)  # NHWC memory seen as NCHW: not contiguous
    assert not strided.flags.c_contiguous
    ctx = cnn_engine.create_context()
    got = ctx.run({"input": strided})
    want = ctx.run({"input": np.ascontiguousarray(strided)})
    for k in want:
        np.testing.assert_array_equal(got[k], want[k])
    # A slice with a step is strided too.
    big = rng.standard_normal((4, 3, 32, 32)).astype(np.float32)
    got = ctx.run({"input": big[::2]})
    want = ctx.run({"input": big[::2].copy()})
    for k in want:
        np.testing.assert_array_equal(got[k], want[k])


def test_outputs_own_their_memory(models_dir):
    engine = kiln.build(str(models_dir / "mlp.onnx"), backend="cpu")
    ctx = engine.create_context()
    x = np.ones((1, 64), np.float32)
    first = ctx.run({"x": x})
    second = ctx.run({"x": x * 2})
    for k in first:
        assert not np.shares_memory(first[k], second[k])
        first[k][...] = 0  # writable, and the next run is not affected
    third = ctx.run({"x": x * 2})
    for k in third:
        np.testing.assert_array_equal(third[k], second[k])


class _DLPack:
    """A DLPack producer that is neither NumPy nor PyTorch (as a JAX or CuPy array would be)."""

    def __init__(self, a):
        self._a = a

    def __dlpack__(self, **kw):
        return self._a.__dlpack__(**kw)

    def __dlpack_device__(self):
        return self._a.__dlpack_device__()


def test_dlpack_host_producer(cnn_engine):
    x = np.random.default_rng(2).standard_normal((1, 3, 32, 32)).astype(np.float32)
    ctx = cnn_engine.create_context()
    got = ctx.run({"input": _DLPack(x)})
    want = ctx.run({"input": x})
    for k in want:
        np.testing.assert_array_equal(got[k], want[k])


def test_four_contexts_in_four_threads(cnn_engine, models_dir):
    rng = np.random.default_rng(3)
    inputs = [rng.standard_normal((b, 3, 32, 32)).astype(np.float32) for b in (1, 2, 4, 8)]
    want = [ort_outputs(models_dir / "small_cnn.onnx", {"input": x}) for x in inputs]
    contexts = [cnn_engine.create_context() for _ in range(4)]
    errors, done = [], []
    barrier = threading.Barrier(4)

    def work(i):
        try:
            barrier.wait()
            for _ in range(5):
                got = contexts[i].run({"input": inputs[i]})
                for k in want[i]:
                    assert rel_l2(got[k], want[i][k]) < 1e-5
            done.append(i)
        except Exception as e:  # noqa: BLE001 - reported below
            errors.append(e)

    threads = [threading.Thread(target=work, args=(i,)) for i in range(4)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(timeout=120)
    assert not errors, errors
    assert sorted(done) == [0, 1, 2, 3]


def test_one_context_shared_by_threads_is_serialised(cnn_engine):
    ctx = cnn_engine.create_context()
    x = np.random.default_rng(4).standard_normal((2, 3, 32, 32)).astype(np.float32)
    want = ctx.run({"input": x})
    results = []

    def work():
        for _ in range(4):
            results.append(ctx.run({"input": x}))

    threads = [threading.Thread(target=work) for _ in range(3)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(timeout=120)
    assert len(results) == 12
    for r in results:
        for k in want:
            np.testing.assert_array_equal(r[k], want[k])


def test_inference_session_like_onnxruntime(models_dir, tmp_path):
    import onnxruntime as ort

    model = str(models_dir / "tiny_transformer.onnx")
    sess = kiln.InferenceSession(model, backend="cpu")
    ref = ort.InferenceSession(model, providers=["CPUExecutionProvider"])
    assert [(i.name, i.type) for i in sess.get_inputs()] == [(i.name, i.type) for i in ref.get_inputs()]
    assert [o.name for o in sess.get_outputs()] == [o.name for o in ref.get_outputs()]
    feeds = feeds_for("tiny_transformer", 2, np.random.default_rng(5))
    got = sess.run(None, feeds)
    want = ref.run(None, feeds)
    for g, w in zip(got, want):
        assert rel_l2(g, w) < 1e-5
    name = ref.get_outputs()[0].name
    (only,) = sess.run([name], feeds)
    np.testing.assert_array_equal(only, got[0])
    # from an engine file and from an Engine
    sess.engine.save(tmp_path / "t.kiln")
    for src in (str(tmp_path / "t.kiln"), sess.engine):
        (again, *_) = kiln.InferenceSession(src).run(None, feeds)
        np.testing.assert_array_equal(again, got[0])


def test_tensorrt_device_path_needs_cuda(cnn_engine):
    ctx = cnn_engine.create_context()
    with pytest.raises(kiln.KilnError, match="needs an engine built for the cuda backend"):
        ctx.set_input_shape("input", [1, 3, 32, 32])
    with pytest.raises(kiln.KilnError, match="needs an engine built for the cuda backend"):
        ctx.execute_async(0)


def _cuda_small_cnn(model):
    """The small CNN as a cuda engine with a dynamic batch 1-8 (opt 4)."""
    return kiln.build(str(model), backend="cuda", min_shapes={"input": [1, 3, 32, 32]},
                      opt_shapes={"input": [4, 3, 32, 32]}, max_shapes={"input": [8, 3, 32, 32]})


@pytest.mark.skipif(bool(gpu_reason()), reason=f"no usable GPU: {gpu_reason()}")
def test_torch_cuda_tensors_round_trip(models_dir):
    torch = pytest.importorskip("torch")
    torch.manual_seed(0)
    model = models_dir / "small_cnn.onnx"
    engine = _cuda_small_cnn(model)
    ctx = engine.create_context()
    x = torch.randn(4, 3, 32, 32, device="cuda")
    out = ctx.run({"input": x})
    want = ort_outputs(model, {"input": x.cpu().numpy()})
    for k, v in out.items():
        assert isinstance(v, torch.Tensor) and v.is_cuda
        assert rel_l2(v.cpu().numpy(), want[k]) < 1e-3
    # on the caller's stream, into tensors the caller gives
    s = torch.cuda.Stream()
    given = {k: torch.empty_like(v) for k, v in out.items()}
    with torch.cuda.stream(s):
        again = ctx.run({"input": x}, stream=s.cuda_stream, outputs=given)
    s.synchronize()
    for k in out:
        assert again[k] is given[k]
        torch.testing.assert_close(again[k], out[k])
    # TensorRT's shape: shapes, addresses, execute_async
    ctx.set_input_shape("input", list(x.shape))
    ctx.set_tensor_address("input", x.data_ptr())
    outs = {k: torch.empty(ctx.get_tensor_shape(k), device="cuda") for k in out}
    for k, t in outs.items():
        ctx.set_tensor_address(k, t.data_ptr())
    ctx.execute_async(torch.cuda.current_stream().cuda_stream)
    torch.cuda.synchronize()
    for k in out:
        torch.testing.assert_close(outs[k], out[k])
    # a non-PyTorch DLPack consumer takes kiln's own device outputs
    y = ctx.run({"input": _DLPack(x)})
    for k in out:
        torch.testing.assert_close(torch.from_dlpack(y[k]), out[k])


@pytest.mark.skipif(bool(gpu_reason()), reason=f"no usable GPU: {gpu_reason()}")
@pytest.mark.parametrize("graphs", [False, True])
def test_repeated_torch_calls(models_dir, graphs):
    """Repeats of a call take run()'s short path; each still reads its own input, writes new
    outputs, and a change of shape, dtype or the low-level setters goes back to the full path."""
    torch = pytest.importorskip("torch")
    torch.manual_seed(0)
    model = models_dir / "small_cnn.onnx"
    engine = _cuda_small_cnn(model)
    ctx = engine.create_context()
    ctx.set_use_cuda_graph(graphs)
    kept = []
    for step, batch in enumerate([4, 4, 4, 4, 2, 4, 4, 2, 2]):
        x = torch.randn(batch, 3, 32, 32, device="cuda")
        out = ctx.run({"input": x})
        want = ort_outputs(model, {"input": x.cpu().numpy()})
        for k, v in out.items():
            assert rel_l2(v.cpu().numpy(), want[k]) < 1e-3, (step, k)
            assert all(v.data_ptr() != o[k].data_ptr() for o in kept), "outputs are new tensors"
        kept.append(out)
        if step == 5:  # the low-level path sets another shape in between
            ctx.set_input_shape("input", [3, 3, 32, 32])
    with pytest.raises(kiln.KilnTypeError):
        ctx.run({"input": torch.zeros(4, 3, 32, 32, device="cuda", dtype=torch.float16)})
    with pytest.raises(kiln.KilnValueError):
        ctx.run({"input": torch.zeros(4, 3, 32, 32, device="cuda"), "extra": torch.zeros(1, device="cuda")})



@pytest.mark.skipif(bool(gpu_reason()), reason=f"no usable GPU: {gpu_reason()}")
def test_repeated_calls_across_streams(models_dir):
    """A repeat's outputs are allocated a call ahead for the stream that call ran on: calls that
    move between PyTorch's stream and a side stream each get outputs of their own, written on the
    stream they asked for, and all agree with ONNX Runtime."""
    torch = pytest.importorskip("torch")
    torch.manual_seed(1)
    model = models_dir / "small_cnn.onnx"
    engine = _cuda_small_cnn(model)
    ctx = engine.create_context()
    side = torch.cuda.Stream()
    x = torch.randn(4, 3, 32, 32, device="cuda")
    want = ort_outputs(model, {"input": x.cpu().numpy()})
    kept = []
    for step, on_side in enumerate([False, False, True, True, False, True, False, False]):
        out = ctx.run({"input": x}, stream=side.cuda_stream if on_side else None)
        (side if on_side else torch.cuda.current_stream()).synchronize()
        for k, v in out.items():
            assert rel_l2(v.cpu().numpy(), want[k]) < 1e-3, (step, k)
            assert all(v.data_ptr() != o[k].data_ptr() for o in kept), "outputs are new tensors"
        kept.append(out)
