#!/usr/bin/env python3
"""Export a Llama-architecture decoder (transformers' LlamaForCausalLM: RMSNorm, rotary position
embedding, grouped-query attention, SwiGLU; random weights, eval, logits for every position, no
cache) to ONNX with dynamic batch and sequence; inputs input_ids and attention_mask
[batch, sequence], output logits [batch, sequence, vocabulary]. Default: hidden 768, 12 layers,
12 heads, 4 key/value heads, SwiGLU 2048, vocabulary 32000; --tiny: hidden 128, 2 layers, 4
heads, 2 key/value heads, SwiGLU 344, vocabulary 1000.

  python3 scripts/export_llama.py [models/llama.onnx] [--exporter torchscript|dynamo] [--tiny]
                                  [--skeleton] [--static] [--attn sdpa|eager]

See scripts/transformer_export.py for the exporters.
"""
import argparse
import os
import sys

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import transformer_export as tx  # noqa: E402


def build(tiny=False, seed=0, attn="sdpa"):
    import torch
    from transformers import LlamaConfig, LlamaForCausalLM
    torch.manual_seed(seed)
    kw = dict(hidden_size=128, num_hidden_layers=2, num_attention_heads=4, num_key_value_heads=2,
              intermediate_size=344, vocab_size=1000) if tiny else \
        dict(hidden_size=768, num_hidden_layers=12, num_attention_heads=12,
             num_key_value_heads=4, intermediate_size=2048, vocab_size=32000)
    cfg = LlamaConfig(max_position_embeddings=2048, attn_implementation=attn, **kw)
    model = LlamaForCausalLM(cfg).eval()
    return tx.causal_lm(model, cfg)


def main():
    ap = argparse.ArgumentParser()
    tx.add_arguments(ap, "models/llama.onnx")
    ap.add_argument("--attn", default="sdpa", choices=["sdpa", "eager"],
                    help="transformers' attention: SDPA, or eager (MatMul, scale, mask Add, Softmax)")
    a = ap.parse_args()
    import torch
    model, args, ins, outs, dyn = build(a.tiny, a.seed, a.attn)
    cfg = model.config
    with torch.no_grad():
        how = tx.export(model, args, a.path, ins, outs, dyn, a.exporter, static=a.static)
    tx.finish(a, f"Llama ({cfg.num_hidden_layers} layers, hidden {cfg.hidden_size}, "
                 f"{cfg.num_attention_heads} heads, {cfg.num_key_value_heads} key/value heads)", how)


if __name__ == "__main__":
    tx.main_guard(main)
