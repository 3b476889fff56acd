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
import argparse
import os
import sys

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import transformer_export as tx  # noqa: E402


def build(tiny=False, seed=0):
    import torch
    from transformers import Phi3Config, Phi3ForCausalLM
    torch.manual_seed(seed)
    kw = dict(hidden_size=128, num_hidden_layers=2, num_attention_heads=4, num_key_value_heads=2,
              intermediate_size=344, vocab_size=1000) if tiny else \
        dict(hidden_size=768, num_hidden_layers=12, num_attention_heads=12,
             num_key_value_heads=4, intermediate_size=2048, vocab_size=32000)
    cfg = Phi3Config(max_position_embeddings=2048, original_max_position_embeddings=2048,
                     pad_token_id=0, bos_token_id=1, eos_token_id=2, attn_implementation="sdpa",
                     **kw)
    model = Phi3ForCausalLM(cfg).eval()
    return tx.causal_lm(model, cfg)


def main():
    ap = argparse.ArgumentParser()
    tx.add_arguments(ap, "models/phi3.onnx")
    a = ap.parse_args()
    import torch
    model, args, ins, outs, dyn = build(a.tiny, a.seed)
    cfg = model.config
    with torch.no_grad():
        how = tx.export(model, args, a.path, ins, outs, dyn, a.exporter, static=a.static)
    tx.finish(a, f"Phi-3 ({cfg.num_hidden_layers} layers, hidden {cfg.hidden_size}, "
                 f"{cfg.num_attention_heads} heads, {cfg.num_key_value_heads} key/value heads)", how)


if __name__ == "__main__":
    tx.main_guard(main)
