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
import os
import sys

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import transformer_export as tx  # noqa: E402


def build(tiny=False, seed=0, attn="sdpa"):
    import torch
    from transformers import LlamaConfig, LlamaForCausalLM
    torch.manual_seed(seed)
    cfg = LlamaConfig(max_position_embeddings=2048, attn_implementation=attn,
                      **tx.decoder_sizes(tiny, kv_heads=4, tiny_kv_heads=2))
    model = LlamaForCausalLM(cfg).eval()
    return tx.causal_lm(model, cfg)

def main():
    def attn(ap):
        ap.add_argument("--attn", default="sdpa", choices=["sdpa", "eager"],
                        help="transformers' attention: SDPA, or eager (MatMul, scale, mask Add, Softmax)")
    tx.decoder_main("Llama", "models/llama.onnx", lambda a: build(a.tiny, a.seed, a.attn), attn)


if __name__ == "__main__":
    tx.main_guard(main)
