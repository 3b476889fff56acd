#!/usr/bin/env python3
"""Export a GPT-NeoX-architecture decoder (transformers' GPTNeoXForCausalLM, Pythia's
architecture: one query_key_value projection whose heads interleave their Q, K and V, a partial
rotary embedding on the first quarter of each head, parallel attention and MLP residuals; random
weights, eval, logits for every position, no cache) to ONNX with dynamic batch and sequence;
inputs input_ids and attention_mask [batch, sequence], output logits [batch, sequence,
vocabulary]. Default: hidden 768, 12 layers, 12 heads, MLP 3072, vocabulary 32000 (Pythia-160M's
shape); --tiny: hidden 128, 2 layers, 4 heads, MLP 512, vocabulary 1000.

  python3 scripts/export_gptneox.py [models/gptneox.onnx] [--exporter torchscript|dynamo]
                                    [--tiny] [--skeleton] [--static]

See scripts/transformer_export.py for the exporters.
"""
import os
import sys

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import transformer_export as tx  # noqa: E402


def build(tiny=False, seed=0):
    import torch
    from transformers import GPTNeoXConfig, GPTNeoXForCausalLM
    torch.manual_seed(seed)
    sizes = (dict(hidden_size=128, num_hidden_layers=2, num_attention_heads=4,
                  intermediate_size=512, vocab_size=1000) if tiny else
             dict(hidden_size=768, num_hidden_layers=12, num_attention_heads=12,
                  intermediate_size=3072, vocab_size=32000))
    cfg = GPTNeoXConfig(max_position_embeddings=2048, rotary_pct=0.25, attn_implementation="sdpa",
                        **sizes)
    return tx.causal_lm(GPTNeoXForCausalLM(cfg).eval(), cfg)


def main():
    tx.decoder_main("GPT-NeoX", "models/gptneox.onnx", lambda a: build(a.tiny, a.seed))


if __name__ == "__main__":
    tx.main_guard(main)
