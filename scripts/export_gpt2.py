#!/usr/bin/env python3
"""Export GPT-2 (124M: transformers GPT2LMHeadModel(GPT2Config()), random weights, eval) to ONNX
with dynamic batch and sequence; inputs input_ids and attention_mask, output logits for every
position ([batch, sequence, 50257]), no KV cache.

  python3 scripts/export_gpt2.py [models/gpt2.onnx] [--exporter torchscript|dynamo] [--tiny]
                                 [--skeleton] [--layers N] [--attn sdpa|eager]

--attn eager: transformers' eager attention (scores filled by torch.where with finfo.min under
the causal mask, a slice of the model's causal buffer) instead of SDPA. See
scripts/transformer_export.py for the exporters, --tiny and --skeleton.
"""
import argparse
import os
import sys

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import transformer_export as tx  # noqa: E402


def build(tiny=False, layers=12, seed=0, attn="sdpa"):
    """The model (random weights from `seed`), returning logits only, with example inputs,
    input/output names and dynamic axes."""
    import torch
    from transformers import GPT2Config, GPT2LMHeadModel
    torch.manual_seed(seed)
    kw = dict(n_layer=2, n_embd=128, n_head=2, vocab_size=1000, n_positions=256) if tiny \
        else dict(n_layer=layers)
    cfg = GPT2Config(attn_implementation=attn, **kw)
    model = GPT2LMHeadModel(cfg).eval()
    return tx.causal_lm(model, cfg)


def main():
    ap = argparse.ArgumentParser()
    tx.add_arguments(ap, "models/gpt2.onnx")
    ap.add_argument("--layers", type=int, default=12)
    ap.add_argument("--attn", default="sdpa", choices=["sdpa", "eager"])
    a = ap.parse_args()
    import torch
    model, args, ins, outs, dyn = build(a.tiny, a.layers, a.seed, a.attn)
    cfg = model.config
    with torch.no_grad():
        # Older torch.export proves the sequence is below the position table's size and refuses
        # a range past it (the ONNX graph is the same for any range).
        how = tx.export(model, args, a.path, ins, outs, dyn, a.exporter, static=a.static,
                        max_sequence=cfg.n_positions - 1)
    tx.finish(a, f"GPT-2 ({cfg.n_layer} layers, hidden {cfg.n_embd}, vocabulary {cfg.vocab_size}, "
                 f"{a.attn} attention)", how)


if __name__ == "__main__":
    tx.main_guard(main)
