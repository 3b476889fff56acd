#!/usr/bin/env python3
"""Export a timm ViT or DeiT (timm.models.vision_transformer.VisionTransformer: qkv Linear ->
reshape -> permute -> unbind -> scaled_dot_product_attention), or another timm ViT by --model
(EVA-02: rotary embedding on the patch tokens; random weights, eval) to ONNX
with a dynamic batch; input pixel_values [batch, 3, 224, 224], output logits [batch, 1000].
Default vit_small_patch16_224 (DeiT-S's shape); --tiny: 2 layers, hidden 128, 2 heads.

  python3 scripts/export_timm_vit.py [models/timm_vit_s16.onnx] [--model NAME]
                                     [--exporter torchscript|dynamo] [--tiny] [--skeleton]

See scripts/transformer_export.py for the exporters.
"""
import argparse
import os
import sys

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import transformer_export as tx  # noqa: E402


def build(tiny=False, seed=0, name="vit_small_patch16_224"):
    import timm
    import torch
    torch.manual_seed(seed)
    kw = dict(depth=2, embed_dim=128, num_heads=2) if tiny else {}
    model = timm.create_model(name, pretrained=False, **kw).eval()
    x = torch.randn(2, 3, 224, 224)
    return model, (x,), ["pixel_values"], ["logits"], {"pixel_values": {0: "batch"}}


def main():
    ap = argparse.ArgumentParser()
    tx.add_arguments(ap, "models/timm_vit_s16.onnx")
    ap.add_argument("--model", default="vit_small_patch16_224", help="a timm ViT/DeiT name")
    a = ap.parse_args()
    import torch
    model, args, ins, outs, dyn = build(a.tiny, a.seed, a.model)
    with torch.no_grad():
        how = tx.export(model, args, a.path, ins, outs, dyn, a.exporter, static=a.static)
    # An EVA's rotary table (rope.*) is computed from the patch grid, not learned: a skeleton
    # keeps it, so the rotary's pairs stay equal.
    tx.finish(a, f"timm {a.model} ({len(model.blocks)} blocks, hidden {model.embed_dim})", how,
              keep=("rope.",))


if __name__ == "__main__":
    tx.main_guard(main)
