"""The GEMM floor of a transformer: a model made of only the GEMM layers of BERT-base, GPT-2 or
ViT-B/16 at a given batch, with the epilogues kiln fuses into them, and nothing else (no
embeddings, attention, LayerNorm or head split). For bench/transformer_bench.py's `floor` part:
kiln's FP16 engine of it and torch.compile of it, timed as the full models are, say how much of a
full model's time its GEMMs alone take, and so the most any speed-up of the other layers can give:
torch.compile's time for the full model over kiln's for its GEMMs alone is the ratio kiln would
reach if everything but the GEMMs took no time.

Per block, as the engine runs them (docs/perf.md, "A transformer block"): Q, K and V as one GEMM
with bias, [M, 768] x [768, 2304]; the output projection with bias and the residual, [M, 768] x
[768, 768]; FFN1 with bias and GELU (erf: BERT, ViT; tanh: GPT-2), [M, 768] x [768, 3072]; FFN2
with bias and the residual, [M, 3072] x [3072, 768]. GPT-2 adds its LM head, [M, 768] x [768,
50257] without bias. M = batch x sequence (ViT: batch x 197), as [batch, sequence, width] tensors.
Twelve blocks, each with its own weights (read from memory as the model's are). Every product is an
output of the model, so none is dead code; the inputs (the activations X [M, 768] and H [M, 3072],
the residual R) are shared by the blocks. Exported in float32 as the full models are, built with
--fp16 and FP16 inputs and outputs (no conversions at the edges): the float32 logits the full GPT-2
writes cost more than this model's FP16 ones, so the floor is a lower bound.
"""
import os

GEOMETRY = {  # hidden, FFN, blocks, activation, LM head columns, sequence (None: --seq)
    "bert": (768, 3072, 12, "erf", 0, None),
    "gpt2": (768, 3072, 12, "tanh", 50257, None),
    "vit": (768, 3072, 12, "erf", 0, 197),
}


def rows(model, batch, seq):
    return batch * (GEOMETRY[model][5] or seq)


def dims(model, batch, seq):
    """The inputs' leading dimensions: [batch, sequence], as the full models' activations (so the
    export writes MatMul and Add, as it does for them, not Gemm)."""
    return (batch, GEOMETRY[model][5] or seq)


def module(model, seed=0, half=True):
    """The GEMM-only model on the GPU (FP16, or float32 for the export), inputs x [B, S, h],
    hid [B, S, ffn], r [B, S, h]."""
    import torch
    hidden, ffn, blocks, act, vocab, _ = GEOMETRY[model]
    torch.manual_seed(seed)

    class Floor(torch.nn.Module):
        def __init__(self):
            super().__init__()
            L = torch.nn.Linear
            self.qkv = torch.nn.ModuleList(L(hidden, 3 * hidden) for _ in range(blocks))
            self.proj = torch.nn.ModuleList(L(hidden, hidden) for _ in range(blocks))
            self.fc1 = torch.nn.ModuleList(L(hidden, ffn) for _ in range(blocks))
            self.fc2 = torch.nn.ModuleList(L(ffn, hidden) for _ in range(blocks))
            self.act = torch.nn.GELU(approximate="tanh" if act == "tanh" else "none")
            self.head = L(hidden, vocab, bias=False) if vocab else None

        def forward(self, x, hid, r):
            outs = []
            for i in range(blocks):
                outs += [self.qkv[i](x), self.proj[i](x) + r, self.act(self.fc1[i](x)),
                         self.fc2[i](hid) + r]
            if self.head is not None:
                outs.append(self.head(x))
            return tuple(outs)

    m = Floor().cuda().eval()
    return m.half() if half else m


def inputs(model, batch, seq, seed=0, dtype="float16"):
    import numpy as np
    hidden, ffn = GEOMETRY[model][:2]
    d = dims(model, batch, seq)
    rng = np.random.default_rng(seed)
    return {"x": rng.standard_normal(d + (hidden,)).astype(dtype),
            "hid": rng.standard_normal(d + (ffn,)).astype(dtype),
            "r": rng.standard_normal(d + (hidden,)).astype(dtype)}


def export(model, batch, seq, path):
    """Writes the GEMM-only model at this batch (static shapes) to `path` as ONNX (TorchScript
    exporter, opset 17), in float32 as the full models are exported: build it with --fp16 and
    BUILD_ARGS (FP16 inputs and outputs)."""
    import torch
    if os.path.exists(path):
        return
    m = module(model, half=False)
    feeds = {k: torch.from_numpy(v).cuda() for k, v in inputs(model, batch, seq, dtype="float32").items()}
    n_out = len(m(*feeds.values()))
    with torch.no_grad():
        torch.onnx.export(m, tuple(feeds.values()), path, input_names=list(feeds),
                          output_names=[f"y{i}" for i in range(n_out)], opset_version=17,
                          dynamo=False)


# FP16 in and out, as the torch.compile side has them (its model is .half()).
BUILD_ARGS = ["--fp16", "--input-io-formats", "fp16", "--output-io-formats", "fp16"]


def shape_arg(model, batch, seq):
    hidden, ffn = GEOMETRY[model][:2]
    b, s = dims(model, batch, seq)
    return f"x:{b}x{s}x{hidden},hid:{b}x{s}x{ffn},r:{b}x{s}x{hidden}"


def gflop(model, batch, seq):
    hidden, ffn, blocks, _, vocab, _ = GEOMETRY[model]
    m = rows(model, batch, seq)
    per_block = 2 * m * hidden * (3 * hidden + hidden + 2 * ffn)
    return (blocks * per_block + 2 * m * hidden * vocab) / 1e9
