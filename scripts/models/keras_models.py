#!/usr/bin/env python3
"""Small Keras models (channels-last) with seeded random weights, saved as SavedModels and
converted with tf2onnx as the Keras path does (scripts/keras_fashion_mnist.py):

  python3 scripts/models/keras_models.py tests/models/keras [NAME,...]   # needs KILN_WITH_TF=1 scripts/setup.sh

writes keras_fmnist_tiny.onnx (the layer types of the Fashion-MNIST model at a few channels:
Rescaling, Conv2D + BatchNormalization + ReLU, MaxPooling2D, Flatten, Dropout, Dense) and
keras_rgb_tiny.onnx (an RGB input, so tf2onnx keeps a Transpose at the input; strided "same"
convolutions with asymmetric padding, a residual Add, DepthwiseConv2D, Concatenate,
AveragePooling2D, GlobalAveragePooling2D), and three recurrent ones: keras_rnn_tiny (Embedding,
LSTM, Bidirectional GRU), keras_rnn_masked_tiny (mask_zero padding, Bidirectional LSTM) and
keras_rnn_signal_tiny (Conv1D, GRU go_backwards, GRU reset_after=False, SimpleRNN). All are
committed (< 100 KB each) and checked by tests/models/run_keras_tests.py, which needs no
TensorFlow.
"""
import contextlib
import io
import os
import subprocess
import sys
import tempfile

import numpy as np


def randomize(model, seed):
    """Every weight random (biases too: tf2onnx drops an Add of zeros), BatchNorm statistics
    away from 0/1, so the converted graph has the patterns a trained model has."""
    rng = np.random.default_rng(seed)
    for v in model.weights:
        shape = tuple(v.shape)
        if "moving_variance" in v.path or "gamma" in v.path:
            v.assign(rng.uniform(0.5, 2.0, shape).astype("float32"))
        elif len(shape) <= 1:
            v.assign((rng.standard_normal(shape) * 0.2).astype("float32"))
        else:
            fan_in = int(np.prod(shape[:-1]))
            v.assign((rng.standard_normal(shape) * (2.0 / fan_in) ** 0.5).astype("float32"))


def fmnist_tiny(keras):
    # The Fashion-MNIST model's layers at a few channels (scripts/keras_fashion_mnist.py).
    sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), ".."))
    from keras_fashion_mnist import make_model

    return make_model(keras, channels=(4, 8), dense=16, name="keras_fmnist_tiny", out_name=None,
                      norm_name=None)


def rgb_tiny(keras):
    layers = keras.layers
    inp = keras.Input((16, 16, 3), name="pixels")
    x = layers.Conv2D(8, 3, padding="same", use_bias=False)(inp)
    x = layers.BatchNormalization()(x)
    x = layers.ReLU()(x)
    y = layers.Conv2D(8, 3, strides=2, padding="same", activation="relu")(x)  # pads 0,0,1,1
    x = layers.Add()([layers.MaxPooling2D()(x), y])
    x = layers.DepthwiseConv2D(3, padding="same")(x)
    x = layers.Concatenate()([x, layers.AveragePooling2D(3, strides=1, padding="same")(x)])
    x = layers.Conv2D(16, 3, strides=2, padding="valid", activation="relu")(x)
    x = layers.GlobalAveragePooling2D()(x)
    return keras.Model(inp, layers.Dense(5)(x), name="keras_rgb_tiny")


# Recurrent layers as tf2onnx converts Keras 3's: each recurrence a Loop over the steps, a
# backward direction (Bidirectional, go_backwards) a ReverseSequence on each side of it.
def rnn_tiny(keras):
    layers = keras.layers
    inp = keras.Input((12,), dtype="int32", name="tokens")
    x = layers.Embedding(50, 8)(inp)
    x = layers.LSTM(10, return_sequences=True)(x)
    x = layers.Bidirectional(layers.GRU(6))(x)
    return keras.Model(inp, layers.Dense(3)(x), name="keras_rnn_tiny")


def rnn_masked_tiny(keras):
    # Token 0 is padding (mask_zero): the recurrences keep their state past a sequence's end.
    layers = keras.layers
    inp = keras.Input((12,), dtype="int32", name="tokens")
    x = layers.Embedding(50, 8, mask_zero=True)(inp)
    x = layers.Bidirectional(layers.LSTM(6, return_sequences=True))(x)
    x = layers.LSTM(5)(x)
    return keras.Model(inp, layers.Dense(2)(x), name="keras_rnn_masked_tiny")


def rnn_signal_tiny(keras):
    layers = keras.layers
    inp = keras.Input((20, 3), name="signal")
    x = layers.Conv1D(8, 3, padding="same", activation="relu")(inp)
    x = layers.GRU(6, go_backwards=True, return_sequences=True)(x)
    x = layers.GRU(5, reset_after=False, return_sequences=True)(x)
    x = layers.SimpleRNN(4)(x)
    return keras.Model(inp, layers.Dense(2)(x), name="keras_rnn_signal_tiny")


MODELS = {"keras_fmnist_tiny": (fmnist_tiny, 0), "keras_rgb_tiny": (rgb_tiny, 1),
          "keras_rnn_tiny": (rnn_tiny, 2), "keras_rnn_masked_tiny": (rnn_masked_tiny, 3),
          "keras_rnn_signal_tiny": (rnn_signal_tiny, 4)}


def main():
    out = sys.argv[1] if len(sys.argv) > 1 else "tests/models/keras"
    only = sys.argv[2].split(",") if len(sys.argv) > 2 else list(MODELS)  # a comma list of names
    os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")
    import keras  # noqa: PLC0415 (optional dependency)

    os.makedirs(out, exist_ok=True)
    for name in only:
        fn, seed = MODELS[name]
        keras.utils.set_random_seed(seed)
        model = fn(keras)
        randomize(model, seed)
        with tempfile.TemporaryDirectory() as tmp:
            with contextlib.redirect_stdout(io.StringIO()):  # it prints every captured variable
                model.export(os.path.join(tmp, "sm"))
            path = os.path.join(out, name + ".onnx")
            subprocess.run([sys.executable, "-m", "tf2onnx.convert", "--saved-model", os.path.join(tmp, "sm"),
                            "--opset", "17", "--output", path], check=True, capture_output=True)
        print(f"wrote {path} ({os.path.getsize(path)} bytes)")


if __name__ == "__main__":
    main()
