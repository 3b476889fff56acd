#!/usr/bin/env python3
"""Recurrent layers (LSTM, GRU, RNN): kiln against ONNX Runtime on graphs made with onnx.helper.

One-layer models over every direction, with and without sequence_lens (a length 0 included) and
initial states, GRU's linear_before_reset 0 and 1, clip, peepholes, input_forget and non-default
activations; two stacked layers as PyTorch exports nn.LSTM / nn.GRU / nn.RNN(num_layers=2,
bidirectional=True) (the first layer's Y transposed and reshaped into the second's X, the
initial states sliced per layer); layout 1 (batch-first), which ONNX Runtime does not run, is
compared with the layout-0 node between Transposes. Weights are uniform in +-1/sqrt(hidden) as
PyTorch initialises them; seq and batch are symbolic and each model runs at two shapes.

  tests/models/run_rnn_tests.py --kiln build/kiln [--build-flags '--backend cuda --no-tf32']

Each model is built at -O0 and -O2 and must agree with ONNX Runtime within relative L2 --tol
(1e-5). Exit status 1 on any mismatch. No torch needed.
"""
import argparse
import os
import subprocess
import sys
import tempfile

import numpy as np
import onnx
from onnx import TensorProto, helper, numpy_helper

try:
    import onnxruntime as ort
except ImportError:  # setup.sh installs it; say so rather than skip silently
    ort = None

GATES = {"LSTM": 4, "GRU": 3, "RNN": 1}


class Model:
    """A graph under construction: inputs, initializers, nodes."""

    def __init__(self, seed):
        self.rng = np.random.default_rng(seed)
        self.inputs, self.inits, self.nodes, self.outputs = [], [], [], []
        self.count = 0

    def name(self, base):
        self.count += 1
        return f"{base}_{self.count}"

    def const(self, base, arr):
        n = self.name(base)
        self.inits.append(numpy_helper.from_array(arr, n))
        return n

    def weight(self, shape, hidden):
        k = 1.0 / np.sqrt(hidden)
        return self.rng.uniform(-k, k, shape).astype(np.float32)

    def input(self, name, elem, dims):
        self.inputs.append(helper.make_tensor_value_info(name, elem, dims))
        return name

    def op(self, op_type, inputs, n_out=1, **attrs):
        outs = [self.name(op_type.lower()) for _ in range(n_out)]
        self.nodes.append(helper.make_node(op_type, inputs, outs, name=self.name("n"), **attrs))
        return outs if n_out > 1 else outs[0]

    def output(self, name, elem=TensorProto.FLOAT):
        self.outputs.append(helper.make_tensor_value_info(name, elem, None))

    def rnn(self, op, x, in_size, hidden, dirs, lens="", h0="", c0="", peep=False, bias=True,
            outputs=None, **attrs):
        g = GATES[op]
        ins = [x, self.const("W", self.weight((dirs, g * hidden, in_size), hidden)),
               self.const("R", self.weight((dirs, g * hidden, hidden), hidden)),
               self.const("B", self.weight((dirs, 2 * g * hidden), hidden)) if bias else "",
               lens, h0]
        if op == "LSTM":
            ins += [c0, self.const("P", self.weight((dirs, 3 * hidden), hidden)) if peep else ""]
        while ins[-1] == "":
            ins.pop()
        n_out = 3 if op == "LSTM" else 2
        outs = [self.name("y") for _ in range(n_out)]
        if outputs is not None:  # which outputs the node has ("" leaves one out)
            outs = [o if keep else "" for o, keep in zip(outs, outputs)]
            while outs[-1] == "":
                outs.pop()
        attrs.setdefault("direction", "bidirectional" if dirs == 2 else "forward")
        self.nodes.append(helper.make_node(op, ins, outs, name=self.name("n"), hidden_size=hidden,
                                           **attrs))
        return outs

    def finish(self, opset=14):
        g = helper.make_graph(self.nodes, "rnn", self.inputs, self.outputs, self.inits)
        m = helper.make_model(g, opset_imports=[helper.make_opsetid("", opset)])
        m.ir_version = 8
        return m


I, H = 5, 7


def one_layer(op, dirs, lens, states, seed, outputs=None, **attrs):
    """X [seq, batch, I] -> one recurrent node; every output it has is a graph output."""
    m = Model(seed)
    m.input("X", TensorProto.FLOAT, ["seq", "batch", I])
    lens_in = m.input("lens", TensorProto.INT32, ["batch"]) if lens else ""
    h0 = m.input("h0", TensorProto.FLOAT, [dirs, "batch", H]) if states else ""
    c0 = m.input("c0", TensorProto.FLOAT, [dirs, "batch", H]) if states and op == "LSTM" else ""
    for o in m.rnn(op, "X", I, H, dirs, lens_in, h0, c0, outputs=outputs, **attrs):
        if o:
            m.output(o)
    return m.finish()


def stacked(op, seed, **attrs):
    """PyTorch's export of a 2-layer bidirectional nn.LSTM/GRU/RNN with sequence lengths and
    initial states: layer 2 reads layer 1's Y as [seq, batch, 2 * H]."""
    m = Model(seed)
    m.input("X", TensorProto.FLOAT, ["seq", "batch", I])
    lens = m.input("lens", TensorProto.INT32, ["batch"])
    m.input("h0", TensorProto.FLOAT, [4, "batch", H])
    if op == "LSTM":
        m.input("c0", TensorProto.FLOAT, [4, "batch", H])

    def part(name, k):
        return m.op("Slice", [name, m.const("s", np.array([2 * k], np.int64)),
                              m.const("e", np.array([2 * k + 2], np.int64)),
                              m.const("a", np.array([0], np.int64))])

    x, size, hs, cs = "X", I, [], []
    for k in range(2):
        c0 = part("c0", k) if op == "LSTM" else ""
        outs = m.rnn(op, x, size, H, 2, lens, part("h0", k), c0, **attrs)
        hs.append(outs[1])
        if op == "LSTM":
            cs.append(outs[2])
        y = m.op("Transpose", [outs[0]], perm=[0, 2, 1, 3])
        x, size = m.op("Reshape", [y, m.const("shape", np.array([0, 0, -1], np.int64))]), 2 * H
    m.output(x)
    m.output(m.op("Concat", hs, axis=0))
    if op == "LSTM":
        m.output(m.op("Concat", cs, axis=0))
    return m.finish()


def batch_first(op, dirs, seed, **attrs):
    """(kiln's model, ONNX Runtime's model): a layout-1 node with sequence_lens and initial
    states, and the same node at layout 0 between Transposes, which ONNX Runtime runs."""
    models = []
    for layout in (1, 0):
        m = Model(seed)  # same seed: same weights
        m.input("X", TensorProto.FLOAT, ["batch", "seq", I])
        lens = m.input("lens", TensorProto.INT32, ["batch"])
        m.input("h0", TensorProto.FLOAT, ["batch", dirs, H])
        if op == "LSTM":
            m.input("c0", TensorProto.FLOAT, ["batch", dirs, H])
        names = ["X", "h0", "c0"] if op == "LSTM" else ["X", "h0"]
        if layout == 0:
            names = [m.op("Transpose", [n], perm=[1, 0, 2]) for n in names]
        c0 = names[2] if op == "LSTM" else ""
        outs = m.rnn(op, names[0], I, H, dirs, lens, names[1], c0, layout=layout, **attrs)
        if layout == 0:
            outs = [m.op("Transpose", [outs[0]], perm=[2, 0, 1, 3])] + \
                   [m.op("Transpose", [o], perm=[1, 0, 2]) for o in outs[1:]]
        for o in outs:
            m.output(o)
        models.append(m.finish())
    return models


def cases():
    """(name, kiln model, ONNX Runtime model or None for the same, batch_first)."""
    out = []
    seed = 0
    for op in ("LSTM", "GRU", "RNN"):
        for dirs, direction in ((1, "forward"), (1, "reverse"), (2, "bidirectional")):
            for lens, states in ((False, False), (True, True), (True, False)):
                seed += 1
                name = f"{op.lower()}_{direction}{'_lens' if lens else ''}{'_states' if states else ''}"
                out.append((name, one_layer(op, dirs, lens, states, seed, direction=direction), None, False))
        seed += 1
        out.append((f"{op.lower()}_stacked_bidirectional",
                    stacked(op, seed, **({"linear_before_reset": 1} if op == "GRU" else {})), None, False))
        for dirs in (1, 2):
            seed += 1
            kiln_m, ort_m = batch_first(op, dirs, seed)
            out.append((f"{op.lower()}_layout1_{'bidirectional' if dirs == 2 else 'forward'}", kiln_m, ort_m, True))
    extras = [
        ("gru_linear_before_reset_reverse", "GRU", 1, dict(direction="reverse", linear_before_reset=1)),
        ("gru_clip_bidirectional", "GRU", 2, dict(clip=0.5)),
        ("lstm_peepholes_clip", "LSTM", 2, dict(peep=True, clip=0.8)),
        ("lstm_input_forget", "LSTM", 1, dict(input_forget=1, peep=True)),
        ("lstm_activations", "LSTM", 2, dict(activations=["HardSigmoid", "LeakyRelu", "ScaledTanh"] * 2,
                                             activation_alpha=[0.3, 0.05, 0.9, 0.4, 0.2, 0.1],
                                             activation_beta=[0.45, 1.1, 0.6, 0.3])),
        ("gru_activations", "GRU", 1, dict(activations=["Softsign", "Elu"], activation_alpha=[0.7])),
        ("rnn_relu_bidirectional", "RNN", 2, dict(activations=["Relu", "Relu"])),
        ("rnn_no_bias", "RNN", 1, dict(bias=False)),
        ("lstm_y_h_only", "LSTM", 1, dict(outputs=[False, True, False])),
        ("lstm_y_c_only", "LSTM", 2, dict(outputs=[False, False, True])),
    ]
    for name, op, dirs, attrs in extras:
        seed += 1
        m = Model(seed)
        m.input("X", TensorProto.FLOAT, ["seq", "batch", I])
        lens = m.input("lens", TensorProto.INT32, ["batch"])
        for o in m.rnn(op, "X", I, H, dirs, lens, **attrs):
            if o:
                m.output(o)
        out.append((name, m.finish(), None, False))
    return out


def feeds_for(model, seq, batch, rng, batch_first):
    feeds = {}
    for vi in model.graph.input:
        if vi.name in {i.name for i in model.graph.initializer}:
            continue
        if vi.name == "lens":
            lens = rng.integers(0, seq + 1, batch).astype(np.int32)
            lens[0] = seq  # the longest sequence, and a zero length where there is room
            if batch > 2:
                lens[-1] = 0
            feeds["lens"] = lens
            continue
        dims = []
        for d in vi.type.tensor_type.shape.dim:
            dims.append(d.dim_value if d.HasField("dim_value") else
                        {"seq": seq, "batch": batch}[d.dim_param])
        feeds[vi.name] = rng.standard_normal(dims).astype(np.float32)
    return feeds


def run(cmd):
    p = subprocess.run(cmd, capture_output=True, text=True, timeout=600)
    if p.returncode != 0:
        raise RuntimeError(f"{' '.join(cmd)} failed ({p.returncode}): {p.stderr.strip()}")
    return p.stdout


def rel_l2(a, b):
    a, b = a.astype(np.float64), b.astype(np.float64)
    return float(np.linalg.norm(a - b) / max(np.linalg.norm(b), 1e-30))


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--kiln", default="build/kiln")
    ap.add_argument("--build-flags", default="", help="more `kiln build` flags (e.g. '--backend cuda')")
    ap.add_argument("--tol", type=float, default=1e-5, help="relative L2 bound per output")
    ap.add_argument("--filter", default="", help="only cases whose name contains this")
    args = ap.parse_args()
    if ort is None:
        print("rnn tests: onnxruntime is not installed (scripts/setup.sh installs it)")
        return 1
    failures = checked = 0
    rng = np.random.default_rng(0)
    with tempfile.TemporaryDirectory() as tmp:
        for name, kiln_model, ort_model, bf in cases():
            if args.filter not in name:
                continue
            path = os.path.join(tmp, name + ".onnx")
            onnx.save(kiln_model, path)
            sess = ort.InferenceSession((ort_model or kiln_model).SerializeToString(),
                                        providers=["CPUExecutionProvider"])
            # The cuda backend builds at a profile: the two shapes the runs below use.
            profile = []
            if "cuda" in args.build_flags:
                spec = lambda f: ",".join(f"{k}:{'x'.join(map(str, v.shape))}" for k, v in f.items())
                small = spec(feeds_for(kiln_model, 1, 1, np.random.default_rng(1), bf))
                large = spec(feeds_for(kiln_model, 6, 3, np.random.default_rng(1), bf))
                profile = ["--min-shapes", small, "--opt-shapes", large, "--max-shapes", large]
            for opt_level in (0, 2):
                engine = os.path.join(tmp, f"{name}_O{opt_level}.kiln")
                label = f"{name} -O{opt_level}"
                try:
                    run([args.kiln, "build", "--onnx", path, "--save-engine", engine, "--opt-level",
                         str(opt_level), *args.build_flags.split(), *profile])
                except RuntimeError as e:
                    print(f"FAIL {label}: build: {e}")
                    failures += 1
                    continue
                for seq, batch in ((6, 3), (1, 1)):
                    feeds = feeds_for(kiln_model, seq, batch, rng, bf)
                    out_dir = os.path.join(tmp, "out")
                    cmd = [args.kiln, "run", "--engine", engine, "--save-outputs", out_dir]
                    for k, v in feeds.items():
                        np.save(os.path.join(tmp, f"{k}.npy"), v)
                        cmd += ["--input", f"{k}={os.path.join(tmp, k + '.npy')}"]
                    try:
                        run(cmd)
                    except RuntimeError as e:
                        print(f"FAIL {label} seq {seq} batch {batch}: {e}")
                        failures += 1
                        continue
                    expected = sess.run(None, feeds)
                    errs = []
                    for out, want in zip(kiln_model.graph.output, expected):
                        got = np.load(os.path.join(out_dir, out.name + ".npy"))
                        errs.append(rel_l2(got, want) if got.shape == want.shape else float("inf"))
                    checked += 1
                    ok = max(errs) < args.tol
                    failures += not ok
                    if not ok:
                        print(f"FAIL {label} seq {seq} batch {batch}: rel L2 per output "
                              + ", ".join(f"{e:.2e}" for e in errs))
    print(f"rnn tests: {checked} runs, "
          f"{'all agree with ONNX Runtime' if failures == 0 else f'{failures} FAILED'}")
    return 1 if failures else 0


if __name__ == "__main__":
    sys.exit(main())
