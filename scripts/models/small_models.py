#!/usr/bin/env python3
"""Small ONNX models built with onnx.helper (no PyTorch needed), seeded random weights.

  python3 scripts/models/small_models.py OUT_DIR     # writes small_cnn.onnx, mlp.onnx, ...

Used by the quick start, the model-level tests and the optimizer tests.
"""
import os
import sys

import numpy as np
import onnx
from onnx import TensorProto, helper, numpy_helper

OPSET = 17


class Builder:
    def __init__(self, seed):
        self.rng = np.random.default_rng(seed)
        self.nodes, self.inits, self.n = [], [], 0

    def name(self, base):
        self.n += 1
        return f"{base}_{self.n}"

    def const(self, base, arr):
        nm = self.name(base)
        self.inits.append(numpy_helper.from_array(np.asarray(arr), nm))
        return nm

    def weight(self, base, shape, scale=None):
        fan_in = int(np.prod(shape[1:])) if len(shape) > 1 else shape[0]
        scale = scale or (2.0 / fan_in) ** 0.5
        return self.const(base, (self.rng.standard_normal(shape) * scale).astype(np.float32))

    def op(self, op_type, inputs, n_out=1, **attrs):
        outs = [self.name(op_type.lower()) for _ in range(n_out)]
        self.nodes.append(helper.make_node(op_type, inputs, outs, name=self.name(op_type), **attrs))
        return outs[0] if n_out == 1 else outs

    def conv_bn_relu(self, x, cin, cout, k, stride=1, relu=True):
        w = self.weight("conv_w", [cout, cin, k, k])
        y = self.op("Conv", [x, w], kernel_shape=[k, k], strides=[stride, stride], pads=[k // 2] * 4)
        bn = [self.const("bn_scale", self.rng.uniform(0.5, 1.5, cout).astype(np.float32)),
              self.const("bn_bias", self.rng.uniform(-0.2, 0.2, cout).astype(np.float32)),
              self.const("bn_mean", self.rng.uniform(-0.2, 0.2, cout).astype(np.float32)),
              self.const("bn_var", self.rng.uniform(0.5, 1.5, cout).astype(np.float32))]
        y = self.op("BatchNormalization", [y] + bn, epsilon=1e-5)
        return self.op("Relu", [y]) if relu else y

    def model(self, name, inputs, outputs, opset=OPSET):
        g = helper.make_graph(self.nodes, name, inputs, outputs, self.inits)
        m = helper.make_model(g, opset_imports=[helper.make_opsetid("", opset)], producer_name="kiln")
        m.ir_version = 8 if opset <= 17 else 10
        onnx.checker.check_model(m)
        return m


def small_cnn(seed=0):
    """Conv/BN/ReLU stem, a residual block, pooling and a classifier: input [N,3,32,32]."""
    b = Builder(seed)
    x = b.conv_bn_relu("input", 3, 16, 3)
    x = b.op("MaxPool", [x], kernel_shape=[2, 2], strides=[2, 2])
    y = b.conv_bn_relu(x, 16, 16, 3)
    y = b.conv_bn_relu(y, 16, 16, 3, relu=False)
    x = b.op("Relu", [b.op("Add", [x, y])])
    x = b.conv_bn_relu(x, 16, 32, 3, stride=2)
    x = b.op("GlobalAveragePool", [x])
    x = b.op("Flatten", [x], axis=1)
    x = b.op("Gemm", [x, b.weight("fc_w", [10, 32]), b.const("fc_b", np.zeros(10, np.float32) + 0.1)], transB=1)
    out = b.op("Softmax", [x], axis=1)
    b.nodes[-1].output[0] = "probabilities"
    return b.model("small_cnn", [helper.make_tensor_value_info("input", TensorProto.FLOAT, ["N", 3, 32, 32])],
                   [helper.make_tensor_value_info("probabilities", TensorProto.FLOAT, ["N", 10])])


def mlp(seed=1):
    """MatMul + Add + ReLU twice, then MatMul + Add: input [N,64]."""
    b = Builder(seed)
    x = "x"
    for i, (cin, cout) in enumerate([(64, 128), (128, 128), (128, 10)]):
        x = b.op("Add", [b.op("MatMul", [x, b.weight("w", [cin, cout])]),
                         b.const("b", b.rng.uniform(-0.1, 0.1, cout).astype(np.float32))])
        if i < 2:
            x = b.op("Relu", [x])
    b.nodes[-1].output[0] = "y"
    return b.model("mlp", [helper.make_tensor_value_info("x", TensorProto.FLOAT, ["N", 64])],
                   [helper.make_tensor_value_info("y", TensorProto.FLOAT, ["N", 10])])


def tiny_transformer(seed=2, d=32, heads=2, seq=8):
    """One encoder block in decomposed form, as PyTorch exports it: LayerNorm as
    ReduceMean/Sub/Pow/ReduceMean/Add/Sqrt/Div/Mul/Add, attention as MatMul/Div/Add(mask)/Softmax/
    MatMul, GELU as Div/Erf/Add/Mul/Mul. Input [N, seq, d]."""
    b = Builder(seed)
    dh = d // heads

    def layer_norm(x):
        mean = b.op("ReduceMean", [x], axes=[-1], keepdims=1)
        xc = b.op("Sub", [x, mean])
        var = b.op("ReduceMean", [b.op("Pow", [xc, b.const("two", np.float32(2.0))])], axes=[-1], keepdims=1)
        den = b.op("Sqrt", [b.op("Add", [var, b.const("eps", np.float32(1e-5))])])
        y = b.op("Div", [xc, den])
        y = b.op("Mul", [y, b.const("ln_g", b.rng.uniform(0.5, 1.5, d).astype(np.float32))])
        return b.op("Add", [y, b.const("ln_b", b.rng.uniform(-0.1, 0.1, d).astype(np.float32))])

    def linear(x, cin, cout):
        return b.op("Add", [b.op("MatMul", [x, b.weight("w", [cin, cout])]),
                            b.const("b", b.rng.uniform(-0.1, 0.1, cout).astype(np.float32))])

    def split_heads(x):  # [N,S,d] -> [N,h,S,dh]
        x = b.op("Reshape", [x, b.const("shape", np.array([0, 0, heads, dh], np.int64))])
        return b.op("Transpose", [x], perm=[0, 2, 1, 3])

    x = "x"
    h = layer_norm(x)
    q, k, v = (split_heads(linear(h, d, d)) for _ in range(3))
    kt = b.op("Transpose", [k], perm=[0, 1, 3, 2])
    s = b.op("Div", [b.op("MatMul", [q, kt]), b.const("scale", np.float32(np.sqrt(dh)))])
    s = b.op("Add", [s, "mask"])
    p = b.op("Softmax", [s], axis=-1)
    a = b.op("Transpose", [b.op("MatMul", [p, v])], perm=[0, 2, 1, 3])
    a = b.op("Reshape", [a, b.const("shape", np.array([0, 0, d], np.int64))])
    x = b.op("Add", [x, linear(a, d, d)])
    h = layer_norm(x)
    h = linear(h, d, 4 * d)
    g = b.op("Div", [h, b.const("sqrt2", np.float32(np.sqrt(2.0)))])
    g = b.op("Mul", [b.op("Mul", [h, b.op("Add", [b.op("Erf", [g]), b.const("one", np.float32(1.0))])]),
                     b.const("half", np.float32(0.5))])
    x = b.op("Add", [x, linear(g, 4 * d, d)])
    b.nodes[-1].output[0] = "y"
    return b.model("tiny_transformer",
                   [helper.make_tensor_value_info("x", TensorProto.FLOAT, ["N", seq, d]),
                    helper.make_tensor_value_info("mask", TensorProto.FLOAT, ["N", 1, 1, seq])],
                   [helper.make_tensor_value_info("y", TensorProto.FLOAT, ["N", seq, d])])


def tiny_llm(seed=3, d=32, heads=4, kv_heads=2, seq=8, max_pos=16):
    """One decoder block with the opset-23 ops today's exporters write for language models:
    RMSNormalization, RotaryEmbedding on Q and K, Attention with grouped-query heads and a
    causal mask, and an Einsum projection; the second norm is RMSNorm decomposed as older
    exports write it (x * Reciprocal(Sqrt(ReduceMean(x^2) + eps)) * g). Inputs x [N, seq, d],
    position_ids [N, seq]."""
    b = Builder(seed)
    dh = d // heads

    def rms_norm(x):
        return b.op("RMSNormalization", [x, b.const("rms_g", b.rng.uniform(0.5, 1.5, d).astype(np.float32))],
                    axis=-1, epsilon=1e-6)

    def heads_of(x, n):  # [N,S,n*dh] -> [N,n,S,dh]
        x = b.op("Reshape", [x, b.const("shape", np.array([0, 0, n, dh], np.int64))])
        return b.op("Transpose", [x], perm=[0, 2, 1, 3])

    freq = 1.0 / (10000 ** (np.arange(0, dh, 2) / dh))
    ang = np.outer(np.arange(max_pos), freq)
    cos, sin = b.const("cos", np.cos(ang).astype(np.float32)), b.const("sin", np.sin(ang).astype(np.float32))
    x = "x"
    h = rms_norm(x)
    q = heads_of(b.op("MatMul", [h, b.weight("wq", [d, d])]), heads)
    k = heads_of(b.op("MatMul", [h, b.weight("wk", [d, kv_heads * dh])]), kv_heads)
    v = heads_of(b.op("MatMul", [h, b.weight("wv", [d, kv_heads * dh])]), kv_heads)
    q = b.op("RotaryEmbedding", [q, cos, sin, "position_ids"])
    k = b.op("RotaryEmbedding", [k, cos, sin, "position_ids"], interleaved=1)
    a = b.op("Attention", [q, k, v], is_causal=1)
    a = b.op("Reshape", [b.op("Transpose", [a], perm=[0, 2, 1, 3]), b.const("shape", np.array([0, 0, d], np.int64))])
    x = b.op("Add", [x, b.op("Einsum", [a, b.weight("wo", [d, d])], equation="bsd,de->bse")])
    ms = b.op("ReduceMean", [b.op("Pow", [x, b.const("two", np.float32(2.0))]),
                             b.const("axes", np.array([-1], np.int64))], keepdims=1)
    r = b.op("Reciprocal", [b.op("Sqrt", [b.op("Add", [ms, b.const("eps", np.float32(1e-6))])])])
    h = b.op("Mul", [b.const("rms_g", b.rng.uniform(0.5, 1.5, d).astype(np.float32)), b.op("Mul", [x, r])])
    h = b.op("Mul", [h, b.op("Sigmoid", [h])])
    x = b.op("Add", [x, b.op("MatMul", [h, b.weight("w2", [d, d])])])
    b.nodes[-1].output[0] = "y"
    return b.model("tiny_llm",
                   [helper.make_tensor_value_info("x", TensorProto.FLOAT, ["N", seq, d]),
                    helper.make_tensor_value_info("position_ids", TensorProto.INT64, ["N", seq])],
                   [helper.make_tensor_value_info("y", TensorProto.FLOAT, ["N", seq, d])], opset=23)


MODELS = {"small_cnn": small_cnn, "mlp": mlp, "tiny_transformer": tiny_transformer, "tiny_llm": tiny_llm}


def main():
    out = sys.argv[1] if len(sys.argv) > 1 else "models"
    os.makedirs(out, exist_ok=True)
    for name, fn in MODELS.items():
        path = os.path.join(out, name + ".onnx")
        onnx.save(fn(), path)
        print(path)


if __name__ == "__main__":
    main()
