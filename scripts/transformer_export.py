"""What the transformer export scripts share (export_bert.py, export_gpt2.py, export_vit.py).

Models are exported the two ways users export them today:
  torchscript  torch.onnx.export(..., dynamo=False), opset 17, dynamic_axes
  dynamo       torch.onnx.export(..., dynamo=True), opset 18, dynamic_shapes with named dims,
               weights as external data (next to the .onnx file)
Both get dynamic batch ("batch") and sequence ("sequence") dims.

--tiny makes the 2-layer, hidden-128 random version the CPU model tests run
(tests/models/run_transformer_tests.py); --skeleton writes the graph without its large weights
(each replaced by the mean and deviation it had), small enough to keep in the repository: the
tests fill the weights back in with random values of those statistics.
"""
import argparse
import os
import sys

import numpy as np

SKELETON_TAG = "kiln-random"
# Smaller initializers stay as they are: shapes, indices, scalars, norms, and the rotary caches
# and masks an export at static shapes folds into constants (16 positions x 32 in a tiny
# decoder), whose values the graph depends on (a rotary's two equal halves).
SKELETON_MIN_ELEMENTS = 1025


def add_arguments(ap, default_path):
    ap.add_argument("path", nargs="?", default=default_path)
    ap.add_argument("--exporter", choices=["torchscript", "dynamo"], default="torchscript")
    ap.add_argument("--tiny", action="store_true", help="2 layers, hidden 128 (CPU model tests)")
    ap.add_argument("--skeleton", action="store_true",
                    help="keep only small initializers (tests/models/transformers)")
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--static", action="store_true",
                    help="no dynamic axes: the example inputs' shapes are fixed in the graph (what "
                         "torch.onnx.export writes without dynamic_axes or dynamic_shapes)")


def export(module, args, path, input_names, output_names, dynamic, exporter, static=False,
           max_sequence=4096):
    """Exports `module` (plain tensors in and out); `dynamic` maps each input name to
    {axis: "batch" | "sequence"} (static: no dynamic axes, the example inputs' shapes;
    max_sequence: the upper end of dynamo's range for "sequence", which the ONNX graph does not
    record). Returns a one-line description of the exporter."""
    import torch
    os.makedirs(os.path.dirname(os.path.abspath(path)) or ".", exist_ok=True)
    if exporter == "torchscript":
        axes = dict(dynamic)
        for o in output_names:
            axes[o] = {0: "batch"}
        torch.onnx.export(module, args, path, opset_version=17, input_names=input_names,
                          output_names=output_names, dynamic_axes=None if static else axes,
                          do_constant_folding=False, dynamo=False)
        return "torch.onnx.export(dynamo=False), opset 17" + (", static shapes" if static else "")
    from torch.export import Dim
    dims = {"batch": Dim("batch", min=1, max=1024),
            "sequence": Dim("sequence", min=1, max=max_sequence)}
    shapes = tuple({axis: dims[name] for axis, name in dynamic.get(n, {}).items()} for n in input_names)
    torch.onnx.export(module, args, path, opset_version=18, input_names=input_names,
                      output_names=output_names, dynamic_shapes=None if static else shapes,
                      dynamo=True, external_data=True)
    return "torch.onnx.export(dynamo=True), opset 18, external data" + \
        (", static shapes" if static else "")


def causal_lm(model, cfg):
    """A transformers causal language model as export takes it: (input_ids, attention_mask)
    [batch, sequence] in, logits only out (no cache); with example inputs, input/output names
    and dynamic axes (export_gpt2.py, export_llama.py)."""
    import torch

    class Wrapper(torch.nn.Module):  # logits only, no cache
        def __init__(self, m):
            super().__init__()
            self.m = m
            self.config = cfg

        def forward(self, input_ids, attention_mask):
            return self.m(input_ids=input_ids, attention_mask=attention_mask, use_cache=False,
                          return_dict=False)[0]

    ids = torch.randint(0, cfg.vocab_size, (2, 16))
    mask = torch.ones(2, 16, dtype=torch.int64)
    dyn = {"input_ids": {0: "batch", 1: "sequence"}, "attention_mask": {0: "batch", 1: "sequence"}}
    return Wrapper(model), (ids, mask), ["input_ids", "attention_mask"], ["logits"], dyn


def decoder_sizes(tiny, kv_heads, tiny_kv_heads):
    """The sizes of the decoders export_llama/qwen2/phi3.py build: hidden 768, 12 layers, 12
    heads, SwiGLU 2048, vocabulary 32000; tiny: hidden 128, 2 layers, 4 heads, SwiGLU 344,
    vocabulary 1000; key/value heads as given."""
    if tiny:
        return dict(hidden_size=128, num_hidden_layers=2, num_attention_heads=4,
                    num_key_value_heads=tiny_kv_heads, intermediate_size=344, vocab_size=1000)
    return dict(hidden_size=768, num_hidden_layers=12, num_attention_heads=12,
                num_key_value_heads=kv_heads, intermediate_size=2048, vocab_size=32000)


def decoder_main(name, default_path, build, more_arguments=None):
    """A decoder export script's main: the common flags (and `more_arguments(ap)`'s), then
    `build(parsed arguments)`'s causal_lm() exported and reported as `name`."""
    ap = argparse.ArgumentParser()
    add_arguments(ap, default_path)
    if more_arguments:
        more_arguments(ap)
    a = ap.parse_args()
    import torch
    model, args, ins, outs, dyn = build(a)
    cfg = model.config
    with torch.no_grad():
        how = export(model, args, a.path, ins, outs, dyn, a.exporter, static=a.static)
    finish(a, f"{name} ({cfg.num_hidden_layers} layers, hidden {cfg.hidden_size}, "
              f"{cfg.num_attention_heads} heads, "
              f"{getattr(cfg, 'num_key_value_heads', cfg.num_attention_heads)} key/value heads)", how)


def skeletonize(path, keep=()):
    """Rewrites the model at `path` in place without its large float initializers: each keeps
    its name, type and shape, and its doc_string records the mean and standard deviation.
    Initializers whose name contains one of `keep` stay whole (tables computed, not learned,
    whose values the optimizer reads: a rotary embedding's sin/cos table)."""
    import onnx
    from onnx import numpy_helper
    m = onnx.load(path)  # loads external data too
    for t in m.graph.initializer:
        a = numpy_helper.to_array(t)
        if a.size < SKELETON_MIN_ELEMENTS or a.dtype.kind != "f" or any(k in t.name for k in keep):
            continue
        doc = f"{SKELETON_TAG} mean={float(a.mean()):.6g} std={float(a.std()):.6g}"
        empty = onnx.TensorProto()
        empty.name, empty.data_type, empty.doc_string = t.name, t.data_type, doc
        empty.dims.extend(t.dims)
        t.CopyFrom(empty)
    strip_metadata(m)
    for f in os.listdir(os.path.dirname(os.path.abspath(path))):  # drop its external data
        if f.startswith(os.path.basename(path)) and f != os.path.basename(path):
            os.remove(os.path.join(os.path.dirname(os.path.abspath(path)), f))
    onnx.save(m, path)


def strip_metadata(m):
    """Drops the nodes' doc strings and metadata (older dynamo exporters record a stack trace on
    every node, most of a skeleton's size); the graph is unchanged."""
    for n in m.graph.node:
        n.doc_string = ""
        del n.metadata_props[:]


def materialize(path, out, seed=0):
    """Writes to `out` the skeleton at `path` with every stripped weight filled with normal
    values of its recorded mean and deviation (seeded)."""
    import onnx
    from onnx import numpy_helper
    rng = np.random.default_rng(seed)
    m = onnx.load(path)
    for t in m.graph.initializer:
        if not t.doc_string.startswith(SKELETON_TAG):
            continue
        stats = dict(kv.split("=") for kv in t.doc_string.split()[1:])
        dtype = onnx.helper.tensor_dtype_to_np_dtype(t.data_type)
        a = rng.normal(float(stats["mean"]), float(stats["std"]), tuple(t.dims)).astype(dtype)
        t.CopyFrom(numpy_helper.from_array(a, t.name))
    onnx.save(m, out)


def report(path, what, how):
    import onnx
    m = onnx.load(path, load_external_data=False)
    ops = {}
    for n in m.graph.node:
        ops[n.op_type] = ops.get(n.op_type, 0) + 1
    print(f"wrote {path}: {what}, exporter {how}, {len(m.graph.node)} nodes "
          f"{dict(sorted(ops.items()))}")


def finish(a, what, how, keep=()):
    if a.skeleton:
        skeletonize(a.path, keep)
    report(a.path, what, how)


def main_guard(fn):
    try:
        fn()
    except ImportError as e:
        sys.exit(f"error: {e} (install PyTorch and transformers: KILN_WITH_TORCH=1 scripts/setup.sh)")
