#!/usr/bin/env python3
"""Export a Phi-3-architecture decoder (transformers' Phi3ForCausalLM: RMSNorm, rotary position
embedding, one packed qkv_proj for Q, K and V, one packed gate_up_proj for SwiGLU's gate and up;
random weights, eval, logits for every position, no cache) to ONNX with dynamic batch and
sequence; inputs input_ids and attention_mask [batch, sequence], output logits [batch, sequence,
vocabulary]. Default: hidden 768, 12 layers, 12 heads, 4 key/value heads, SwiGLU 2048, vocabulary
32000; --tiny: hidden 128, 2 layers, 4 heads, 2 key/value heads, SwiGLU 344, vocabulary 1000.

  python3 scripts/export_phi3.py [models/phi3.onnx] [--exporter torchscript|dynamo] [--tiny]
                                 [--skeleton] [--static]

See scripts/transformer_export.py for the exporters.
"""
import os
import sys

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import transformer_export as tx  # noqa: E402


def build(tiny=False, seed=0):
    import torch
    from transformers import Phi3Config, Phi3ForCausalLM
    torch.manual_seed(seed)
    cfg = Phi3Config(max_position_embeddings=2048, original_max_position_embeddings=2048,
                     pad_token_id=0, bos_token_id=1, eos_token_id=2, attn_implementation="sdpa",
                     **tx.decoder_sizes(tiny, kv_heads=4, tiny_kv_heads=2))
    model = Phi3ForCausalLM(cfg).eval()
    return tx.causal_lm(model, cfg)

def main():
    tx.decoder_main("Phi-3", "models/phi3.onnx", lambda a: build(a.tiny, a.seed))


if __name__ == "__main__":
    tx.main_guard(main)
