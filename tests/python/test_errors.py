"""Bad input raises KilnError (KilnValueError / KilnTypeError where that fits) with kiln's
one-line message, and never crashes the interpreter."""
import os

import numpy as np
import pytest

import kiln


@pytest.fixture()
def ctx(cnn_engine):
    return cnn_engine.create_context()


def good():
    return np.zeros((1, 3, 32, 32), np.float32)


def test_error_classes():
    assert issubclass(kiln.KilnError, RuntimeError)
    assert issubclass(kiln.KilnValueError, kiln.KilnError) and issubclass(kiln.KilnValueError, ValueError)
    assert issubclass(kiln.KilnTypeError, kiln.KilnError) and issubclass(kiln.KilnTypeError, TypeError)


@pytest.mark.parametrize("dtype", [np.float64, np.float16, np.int32, np.bool_])
def test_wrong_dtype_is_refused_not_converted(ctx, dtype):
    with pytest.raises(kiln.KilnTypeError, match=r"input 'input': the engine takes float32, not "):
        ctx.run({"input": good().astype(dtype)})


def test_byte_swapped_array_is_refused(ctx):
    with pytest.raises(kiln.KilnTypeError, match="takes float32, not >f4"):
        ctx.run({"input": good().astype(">f4")})


def test_wrong_dtype_refused_by_the_extension_too(ctx):
    # The extension checks again, below the Python checks.
    with pytest.raises(kiln.KilnTypeError, match="takes float32, not float64"):
        ctx._core.execute([("input", good().astype(np.float64))])


@pytest.mark.parametrize("shape, message", [
    ((1, 3, 32), "has rank 3"),
    ((1, 4, 32, 32), r"dimension 1 must be 3"),
    ((9, 3, 32, 32), r"outside the engine's profile \(min \[1,3,32,32\], max \[8,3,32,32\]\)"),
])
def test_wrong_shape(ctx, shape, message):
    with pytest.raises(kiln.KilnValueError, match=message):
        ctx.run({"input": np.zeros(shape, np.float32)})


def test_missing_and_unknown_input_names(ctx):
    with pytest.raises(kiln.KilnValueError, match="input 'input' was not given"):
        ctx.run({})
    with pytest.raises(kiln.KilnValueError, match=r"no input named 'image' \(its inputs: input\)"):
        ctx.run({"input": good(), "image": good()})
    with pytest.raises(kiln.KilnValueError, match="no input named 'image'"):
        ctx._core.execute([("image", good())])


def test_not_a_tensor(ctx):
    with pytest.raises(kiln.KilnTypeError, match="expected a NumPy array, a PyTorch tensor or a DLPack"):
        ctx.run({"input": [[1.0, 2.0]]})
    with pytest.raises(kiln.KilnTypeError, match="takes a dict"):
        ctx.run([good()])
    with pytest.raises(kiln.KilnValueError, match="stream= applies to device tensors"):
        ctx.run({"input": good()}, stream=0)


def test_corrupt_engine_files(cnn_engine, tmp_path):
    path = tmp_path / "e.kiln"
    cnn_engine.save(path)
    data = bytearray(path.read_bytes())
    flipped = tmp_path / "flipped.kiln"
    data[len(data) // 2] ^= 0xFF
    flipped.write_bytes(bytes(data))
    with pytest.raises(kiln.KilnError, match="flipped.kiln"):
        kiln.load(flipped)
    short = tmp_path / "short.kiln"
    short.write_bytes(path.read_bytes()[:100])
    with pytest.raises(kiln.KilnError, match="short.kiln"):
        kiln.load(short)
    junk = tmp_path / "junk.kiln"
    junk.write_bytes(os.urandom(4096))
    with pytest.raises(kiln.KilnError, match="junk.kiln"):
        kiln.load(junk)
    with pytest.raises(kiln.KilnError, match="missing.kiln"):
        kiln.load(tmp_path / "missing.kiln")


def test_bad_build_arguments(models_dir, tmp_path):
    model = str(models_dir / "mlp.onnx")
    with pytest.raises(kiln.KilnValueError, match="opt_level must be 0, 1 or 2"):
        kiln.build(model, backend="cpu", opt_level=7)
    with pytest.raises(kiln.KilnTypeError, match="opt_level must be an int"):
        kiln.build(model, backend="cpu", opt_level="2")
    with pytest.raises(kiln.KilnError, match="unknown backend 'tpu'"):
        kiln.build(model, backend="tpu")
    with pytest.raises(kiln.KilnTypeError, match=r"shapes\['x'\] must be a sequence of ints"):
        kiln.build(model, backend="cpu", shapes={"x": "1x64"})
    with pytest.raises(kiln.KilnTypeError, match="takes a .onnx path"):
        kiln.build(12345)
    bad = tmp_path / "bad.onnx"
    bad.write_bytes(b"not a model")
    with pytest.raises(kiln.KilnError, match="bad.onnx"):
        kiln.build(str(bad), backend="cpu")
    with pytest.raises(kiln.KilnError, match="--fp16 is not supported by the cpu backend"):
        kiln.build(model, backend="cpu", fp16=True)


def test_progress_callback_errors_propagate(models_dir):
    def boom(line):
        raise KeyError("from the callback")

    with pytest.raises(KeyError, match="from the callback"):
        kiln.build(str(models_dir / "mlp.onnx"), backend="cpu", progress=boom)


def test_messages_are_one_line(tmp_path):
    odd = tmp_path / "two\nlines.kiln"
    odd.write_bytes(b"\x00" * 64)
    with pytest.raises(kiln.KilnError) as e:
        kiln.load(odd)
    assert "\n" not in str(e.value) and "two lines.kiln" in str(e.value)
