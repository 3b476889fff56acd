#!/usr/bin/env python3
"""Export ViT-B/16 (transformers ViTModel(ViTConfig()), 224x224, random weights, eval) to ONNX
with a dynamic batch; input pixel_values [batch, 3, 224, 224], outputs last_hidden_state
([batch, 197, 768]) and pooler_output. --arch deit: DeiT-B/16 (transformers DeiTModel, with its
class and distillation tokens: last_hidden_state [batch, 198, 768]).

  python3 scripts/export_vit.py [models/vit_b16.onnx] [--exporter torchscript|dynamo] [--tiny]
                                [--skeleton] [--arch vit|deit]

See scripts/transformer_export.py for the exporters, --tiny and --skeleton.
"""
import argparse
import os
import sys

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import transformer_export as tx  # noqa: E402


def build(tiny=False, seed=0, arch="vit"):
    """The model (random weights from `seed`), returning plain tensors, with example inputs,
    input/output names and dynamic axes."""
    import torch
    import transformers
    torch.manual_seed(seed)
    kw = dict(num_hidden_layers=2, hidden_size=128, num_attention_heads=2,
              intermediate_size=512) if tiny else {}
    prefix = {"vit": "ViT", "deit": "DeiT"}[arch]
    cfg = getattr(transformers, prefix + "Config")(**kw)
    model = getattr(transformers, prefix + "Model")(cfg).eval()

    class Wrapper(torch.nn.Module):
        def __init__(self, m):
            super().__init__()
            self.m = m
            self.config = cfg

        def forward(self, pixel_values):
            out = self.m(pixel_values=pixel_values, return_dict=False)
            return out[0], out[1]

    x = torch.randn(2, 3, cfg.image_size, cfg.image_size)
    return (Wrapper(model), (x,), ["pixel_values"], ["last_hidden_state", "pooler_output"],
            {"pixel_values": {0: "batch"}})


def main():
    ap = argparse.ArgumentParser()
    tx.add_arguments(ap, "models/vit_b16.onnx")
    ap.add_argument("--arch", choices=["vit", "deit"], default="vit")
    a = ap.parse_args()
    import torch
    model, args, ins, outs, dyn = build(a.tiny, a.seed, a.arch)
    cfg = model.config
    with torch.no_grad():
        how = tx.export(model, args, a.path, ins, outs, dyn, a.exporter, static=a.static)
    tx.finish(a, f"{a.arch} ({cfg.num_hidden_layers} layers, hidden {cfg.hidden_size}, "
                 f"patch {cfg.patch_size}, image {cfg.image_size})", how)


if __name__ == "__main__":
    tx.main_guard(main)
