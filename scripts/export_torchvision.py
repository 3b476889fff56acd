#!/usr/bin/env python3
"""Export a torchvision classifier (random weights, eval mode) to ONNX as users do: opset 17,
TorchScript exporter where this torch has it, dynamic batch, input 'input', output 'logits'.
BatchNorm statistics are randomised so that folding them is exercised.

  python3 scripts/export_torchvision.py resnet50 models/resnet50.onnx
"""
import sys

import torch
import torchvision


def main():
    name, out = sys.argv[1], sys.argv[2]
    torch.manual_seed(0)
    model = getattr(torchvision.models, name)(weights=None).eval()
    with torch.no_grad():
        for m in model.modules():
            if isinstance(m, torch.nn.BatchNorm2d):
                m.running_mean.uniform_(-0.1, 0.1)
                m.running_var.uniform_(0.5, 1.5)
                m.weight.uniform_(0.5, 1.5)
                m.bias.uniform_(-0.1, 0.1)
    x = torch.randn(1, 3, 224, 224)
    kw = dict(input_names=["input"], output_names=["logits"], opset_version=17,
              dynamic_axes={"input": {0: "N"}, "logits": {0: "N"}})
    try:
        torch.onnx.export(model, (x,), out, dynamo=False, **kw)
        how = "TorchScript exporter"
    except TypeError:
        torch.onnx.export(model, (x,), out, **kw)
        how = "default exporter"
    print(f"exported torchvision {name} to {out} ({how}, opset 17, dynamic batch)")


if __name__ == "__main__":
    main()
