#!/usr/bin/env python3
"""Export torchvision's ViT-B/16 (torchvision.models.vit_b_16, nn.MultiheadAttention
sequence-first, random weights, eval) to ONNX with a dynamic batch; input pixel_values
[batch, 3, 224, 224], output logits [batch, 1000]. --tiny: 2 layers, hidden 128, 2 heads.

  python3 scripts/export_tv_vit.py [models/tv_vit_b16.onnx] [--exporter torchscript|dynamo]
                                   [--tiny] [--skeleton]

torchvision's TorchScript export of this model fails in PyTorch 2.11 (users take dynamo); the
tiny one exports both ways. See scripts/transformer_export.py for the exporters.
"""
import argparse
import os
import sys

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import transformer_export as tx  # noqa: E402


def build(tiny=False, seed=0):
    import torch
    from torchvision.models.vision_transformer import VisionTransformer
    torch.manual_seed(seed)
    kw = dict(num_layers=2, num_heads=2, hidden_dim=128, mlp_dim=512) if tiny else \
        dict(num_layers=12, num_heads=12, hidden_dim=768, mlp_dim=3072)
    model = VisionTransformer(image_size=224, patch_size=16, **kw).eval()
    # torchvision zero-initializes the classifier, which would make every logit 0.
    torch.nn.init.normal_(model.heads.head.weight, std=0.02)
    torch.nn.init.normal_(model.heads.head.bias, std=0.02)
    model.config = kw
    x = torch.randn(2, 3, 224, 224)
    return model, (x,), ["pixel_values"], ["logits"], {"pixel_values": {0: "batch"}}


def main():
    ap = argparse.ArgumentParser()
    tx.add_arguments(ap, "models/tv_vit_b16.onnx")
    a = ap.parse_args()
    import torch
    model, args, ins, outs, dyn = build(a.tiny, a.seed)
    with torch.no_grad():
        how = tx.export(model, args, a.path, ins, outs, dyn, a.exporter, static=a.static)
    tx.finish(a, f"torchvision ViT ({model.config['num_layers']} layers, hidden "
                 f"{model.config['hidden_dim']}, nn.MultiheadAttention)", how)


if __name__ == "__main__":
    tx.main_guard(main)
