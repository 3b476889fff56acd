#!/usr/bin/env python3
"""Export a Qwen2-architecture decoder (transformers' Qwen2ForCausalLM: RMSNorm, rotary position
embedding, grouped-query attention with biased Q, K and V projections, SwiGLU; random weights,
eval, logits for every position, no cache) to ONNX with dynamic batch and sequence; inputs
input_ids and attention_mask [batch, sequence], output logits [batch, sequence, vocabulary].
Default: hidden 768, 12 layers, 12 heads, 2 key/value heads, SwiGLU 2048, vocabulary 32000;
--tiny: hidden 128, 2 layers, 4 heads, 1 key/value head (multi-query), SwiGLU 344, vocabulary
1000.

  python3 scripts/export_qwen2.py [models/qwen2.onnx] [--exporter torchscript|dynamo] [--tiny]
                                  [--skeleton] [--static]

See scripts/transformer_export.py for the exporters.
"""
import os
import sys

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import transformer_export as tx  # noqa: E402


def build(tiny=False, seed=0):
    import torch
    from transformers import Qwen2Config, Qwen2ForCausalLM
    torch.manual_seed(seed)
    cfg = Qwen2Config(max_position_embeddings=2048, attn_implementation="sdpa",
                      **tx.decoder_sizes(tiny, kv_heads=2, tiny_kv_heads=1))
    model = Qwen2ForCausalLM(cfg).eval()
    with torch.no_grad():  # transformers initialises the biases to zero: make them count
        for layer in model.model.layers:
            for p in (layer.self_attn.q_proj, layer.self_attn.k_proj, layer.self_attn.v_proj):
                p.bias.normal_(0.0, 0.02)
    return tx.causal_lm(model, cfg)

def main():
    tx.decoder_main("Qwen2", "models/qwen2.onnx", lambda a: build(a.tiny, a.seed))


if __name__ == "__main__":
    tx.main_guard(main)
