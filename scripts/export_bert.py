#!/usr/bin/env python3
"""Export a BERT-base encoder (transformers BertModel(BertConfig()), random weights, eval) to
ONNX with dynamic batch and sequence; inputs input_ids and attention_mask, outputs
last_hidden_state and pooler_output.

  python3 scripts/export_bert.py [models/bert_base.onnx] [--exporter torchscript|dynamo]
                                 [--tiny] [--skeleton] [--layers N] [--attn eager|sdpa]
                                 [--opset 17|16]

--exporter: TorchScript (opset 17, or --opset 16, which makes the exporter decompose LayerNorm)
or dynamo (opset 18, external data); see scripts/transformer_export.py for --tiny and
--skeleton. The graph keeps LayerNorm, GELU and attention in whatever form the exporter writes
them; kiln's optimizer must recognise them. Prints the exporter used and the op counts.
"""
import argparse
import os
import sys

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import transformer_export as tx  # noqa: E402


def build(tiny=False, layers=12, attn="sdpa", seed=0):
    """The model (random weights from `seed`), wrapped to return plain tensors, with example
    inputs, input/output names and dynamic axes."""
    import torch
    from transformers import BertConfig, BertModel
    torch.manual_seed(seed)
    kw = dict(num_hidden_layers=2, hidden_size=128, num_attention_heads=2, intermediate_size=512,
              vocab_size=1000) if tiny else dict(num_hidden_layers=layers)
    cfg = BertConfig(**kw)
    try:
        model = BertModel(cfg, attn_implementation=attn)
    except TypeError:
        cfg._attn_implementation = attn
        model = BertModel(cfg)
    model.eval()

    class Wrapper(torch.nn.Module):  # plain tensors out (no ModelOutput)
        def __init__(self, m):
            super().__init__()
            self.m = m
            self.config = cfg

        def forward(self, input_ids, attention_mask):
            out = self.m(input_ids=input_ids, attention_mask=attention_mask, return_dict=False)
            return out[0], out[1]

    ids = torch.randint(0, cfg.vocab_size, (2, 16))
    mask = torch.ones(2, 16, dtype=torch.int64)
    dyn = {"input_ids": {0: "batch", 1: "sequence"}, "attention_mask": {0: "batch", 1: "sequence"}}
    return (Wrapper(model), (ids, mask), ["input_ids", "attention_mask"],
            ["last_hidden_state", "pooler_output"], dyn)


def main():
    ap = argparse.ArgumentParser()
    tx.add_arguments(ap, "models/bert_base.onnx")
    ap.add_argument("--layers", type=int, default=12)
    ap.add_argument("--attn", default="sdpa", choices=["eager", "sdpa"])
    ap.add_argument("--opset", type=int, default=17, help="TorchScript: 17 (default) or 16")
    a = ap.parse_args()
    import torch
    model, args, ins, outs, dyn = build(a.tiny, a.layers, a.attn, a.seed)
    cfg = model.config
    with torch.no_grad():
        if a.exporter == "torchscript" and a.opset != 17:
            how = f"torch.onnx.export(dynamo=False), opset {a.opset}"
            torch.onnx.export(model, args, a.path, opset_version=a.opset, input_names=ins,
                              output_names=outs,
                              dynamic_axes=None if a.static else
                              {**dyn, **{o: {0: "batch"} for o in outs}},
                              do_constant_folding=False, dynamo=False)
        else:
            # torch 2.5's export proves the sequence is not 512 (the position table's size) and
            # refuses a range that holds it; the graph is the same for any range.
            how = tx.export(model, args, a.path, ins, outs, dyn, a.exporter, static=a.static,
                            max_sequence=511)
    tx.finish(a, f"BERT ({cfg.num_hidden_layers} layers, hidden {cfg.hidden_size}, {a.attn} attention)",
              how)


if __name__ == "__main__":
    tx.main_guard(main)
