#!/usr/bin/env python3
"""Export a BERT-base encoder (transformers BertModel(BertConfig()), random weights, eval) to
ONNX, opset 17, dynamic batch and sequence; inputs input_ids and attention_mask.

  python3 scripts/export_bert.py [models/bert_base.onnx] [--layers N] [--attn eager|sdpa]
                                 [--opset 17|16]

Run it from scripts/ or the repository root. The graph keeps LayerNorm, GELU and attention in whatever form the exporter writes them (at
opset 17 LayerNorm is ONNX LayerNormalization; GELU is the erf expression; attention is
MatMul/Div/Add/Softmax/MatMul for "eager" and the scaled_dot_product_attention expansion for
"sdpa"); kiln's optimizer must recognise them. Prints the exporter used and the op counts.
"""
import argparse
import os
import sys

import torch

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from export_resnet50 import export  # noqa: E402


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("path", nargs="?", default="models/bert_base.onnx")
    ap.add_argument("--layers", type=int, default=12)
    ap.add_argument("--attn", default="eager", choices=["eager", "sdpa"])
    ap.add_argument("--opset", type=int, default=17,
                    help="17 (default); 16 makes the exporter decompose LayerNorm")
    a = ap.parse_args()
    from transformers import BertConfig, BertModel
    torch.manual_seed(0)
    cfg = BertConfig(num_hidden_layers=a.layers)
    try:
        model = BertModel(cfg, attn_implementation=a.attn)
    except TypeError:
        cfg._attn_implementation = a.attn
        model = BertModel(cfg)
    model.eval()
    ids = torch.randint(0, cfg.vocab_size, (2, 16))
    mask = torch.ones(2, 16, dtype=torch.int64)

    class Wrapper(torch.nn.Module):  # plain tensors out (no ModelOutput)
        def __init__(self, m):
            super().__init__()
            self.m = m

        def forward(self, input_ids, attention_mask):
            out = self.m(input_ids=input_ids, attention_mask=attention_mask, return_dict=False)
            return out[0], out[1]

    dyn = {"input_ids": {0: "N", 1: "S"}, "attention_mask": {0: "N", 1: "S"},
           "last_hidden_state": {0: "N", 1: "S"}, "pooler_output": {0: "N"}}
    with torch.no_grad():
        how = export(Wrapper(model), (ids, mask), a.path, ["input_ids", "attention_mask"],
                     ["last_hidden_state", "pooler_output"], dyn, opset=a.opset)
    import onnx
    m = onnx.load(a.path)
    ops = {}
    for n in m.graph.node:
        ops[n.op_type] = ops.get(n.op_type, 0) + 1
    print(f"wrote {a.path}: BERT ({a.layers} layers, {a.attn} attention), exporter {how}, opset "
          f"{m.opset_import[0].version}, {len(m.graph.node)} nodes {dict(sorted(ops.items()))}")


if __name__ == "__main__":
    main()
