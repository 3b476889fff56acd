#!/usr/bin/env python3
"""Export torchvision ResNet-50 (random weights, eval mode) to ONNX, opset 17, dynamic batch.

  python3 scripts/export_resnet50.py [models/resnet50.onnx]

Needs torch (+ torchvision; without it an identical replica of torchvision's ResNet-50
definition is used) and onnx. Uses the TorchScript exporter (dynamo=False) when this torch
has it, since that is what most deployed ONNX files come from; it prints which one it used.
BatchNorm statistics are randomised so that folding them is actually exercised.
"""
import os
import sys

import torch
from torch import nn


def torchvision_resnet50():
    try:
        import torchvision
        return torchvision.models.resnet50(weights=None), "torchvision"
    except ImportError:
        return ResNet50(), "replica of torchvision.models.resnet50"


class Bottleneck(nn.Module):
    expansion = 4

    def __init__(self, inplanes, planes, stride=1, downsample=None):
        super().__init__()
        self.conv1 = nn.Conv2d(inplanes, planes, 1, bias=False)
        self.bn1 = nn.BatchNorm2d(planes)
        self.conv2 = nn.Conv2d(planes, planes, 3, stride, 1, bias=False)
        self.bn2 = nn.BatchNorm2d(planes)
        self.conv3 = nn.Conv2d(planes, planes * 4, 1, bias=False)
        self.bn3 = nn.BatchNorm2d(planes * 4)
        self.relu = nn.ReLU(inplace=True)
        self.downsample = downsample

    def forward(self, x):
        identity = x
        out = self.relu(self.bn1(self.conv1(x)))
        out = self.relu(self.bn2(self.conv2(out)))
        out = self.bn3(self.conv3(out))
        if self.downsample is not None:
            identity = self.downsample(x)
        return self.relu(out + identity)


class ResNet50(nn.Module):
    def __init__(self, num_classes=1000):
        super().__init__()
        self.inplanes = 64
        self.conv1 = nn.Conv2d(3, 64, 7, 2, 3, bias=False)
        self.bn1 = nn.BatchNorm2d(64)
        self.relu = nn.ReLU(inplace=True)
        self.maxpool = nn.MaxPool2d(3, 2, 1)
        self.layer1 = self._make_layer(64, 3)
        self.layer2 = self._make_layer(128, 4, 2)
        self.layer3 = self._make_layer(256, 6, 2)
        self.layer4 = self._make_layer(512, 3, 2)
        self.avgpool = nn.AdaptiveAvgPool2d((1, 1))
        self.fc = nn.Linear(2048, num_classes)

    def _make_layer(self, planes, blocks, stride=1):
        down = None
        if stride != 1 or self.inplanes != planes * 4:
            down = nn.Sequential(nn.Conv2d(self.inplanes, planes * 4, 1, stride, bias=False),
                                 nn.BatchNorm2d(planes * 4))
        layers = [Bottleneck(self.inplanes, planes, stride, down)]
        self.inplanes = planes * 4
        layers += [Bottleneck(self.inplanes, planes) for _ in range(1, blocks)]
        return nn.Sequential(*layers)

    def forward(self, x):
        x = self.maxpool(self.relu(self.bn1(self.conv1(x))))
        x = self.layer4(self.layer3(self.layer2(self.layer1(x))))
        return self.fc(torch.flatten(self.avgpool(x), 1))


def export(model, args, path, input_names, output_names, dynamic_axes, opset=17):
    """TorchScript exporter when available (returns its name), else the dynamo one."""
    os.makedirs(os.path.dirname(os.path.abspath(path)), exist_ok=True)
    try:
        torch.onnx.export(model, args, path, opset_version=opset, input_names=input_names,
                          output_names=output_names, dynamic_axes=dynamic_axes,
                          do_constant_folding=False, dynamo=False)
        return "torch.onnx.export(dynamo=False) [TorchScript]"
    except TypeError:  # old torch without the dynamo switch: TorchScript is the only one
        torch.onnx.export(model, args, path, opset_version=opset, input_names=input_names,
                          output_names=output_names, dynamic_axes=dynamic_axes,
                          do_constant_folding=False)
        return "torch.onnx.export [TorchScript]"


def main():
    path = sys.argv[1] if len(sys.argv) > 1 else "models/resnet50.onnx"
    torch.manual_seed(0)
    model, source = torchvision_resnet50()
    with torch.no_grad():
        for m in model.modules():
            if isinstance(m, nn.BatchNorm2d):
                m.running_mean.uniform_(-0.1, 0.1)
                m.running_var.uniform_(0.5, 1.5)
                m.weight.uniform_(0.5, 1.0)
                m.bias.uniform_(-0.1, 0.1)
    model.eval()
    x = torch.randn(1, 3, 224, 224)
    how = export(model, (x,), path, ["input"], ["logits"], {"input": {0: "N"}, "logits": {0: "N"}})
    import onnx
    m = onnx.load(path)
    ops = {}
    for n in m.graph.node:
        ops[n.op_type] = ops.get(n.op_type, 0) + 1
    print(f"wrote {path}: ResNet-50 from {source}, exporter {how}, opset "
          f"{m.opset_import[0].version}, {len(m.graph.node)} nodes {dict(sorted(ops.items()))}")


if __name__ == "__main__":
    main()
