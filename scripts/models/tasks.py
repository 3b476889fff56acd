#!/usr/bin/env python3
"""The task models (detection, segmentation, video, optical flow, recurrent text models, Stable
Diffusion 1.5) exported as users export them, with random weights and fixed seeds.

  python3 scripts/models/tasks.py --out DIR [--models a,b,...] [--exporter auto|torchscript|dynamo]
  python3 scripts/models/tasks.py --list

Each model is a function below returning a Task: the PyTorch module (float32, eval, CPU), its
example inputs as numpy arrays (realistic content: task_inputs.py), the ONNX input and output
names and dynamic axes, and how to judge its outputs (dense tensors, or detections). Exports
are `torch.onnx.export` TorchScript (dynamo=False) at opset 17 with the dynamic axes users give
(batch where the model allows it), the dynamo exporter where TorchScript fails; Stable
Diffusion's networks as diffusers' and optimum's exporters make them (opset 14, their names and
dynamic axes, the UNet's weights as external data). Names ending in _tiny are small versions of
the same code (tests/models/tasks, scripts/models/gen_task_tests.py).

Random weights and detections: an untrained detector's class logits are nearly constant (all
scores tie at about 1/classes or at the prior's 0.01), so which boxes survive top-k and NMS is
decided by rounding, and no two runtimes agree. Every detector here therefore gets, after its
BatchNorm statistics are recalibrated on a few scenes, its class-logit layers (and the RPN's
objectness, FCOS's centerness) rescaled so that on a scene their outputs have a set median and
largest value (`spread_logits`): scores spread over (0, 1), the library's default score thresholds
kept, and the detections depend on the image. The graphs are the ones users export; only the
random weight values are chosen.
"""
import argparse
import dataclasses
import os
import sys
import time
from typing import Optional

import numpy as np

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import task_inputs as ti  # noqa: E402


@dataclasses.dataclass
class Task:
    name: str
    module: object                      # torch.nn.Module, float32, eval, CPU
    inputs: dict                        # {input name: task_inputs.make spec}, in forward's order
    outputs: list                       # ONNX output names, in the module's output order
    dynamic: dict                       # {input or output name: {axis: dim name}}
    kind: str = "dense"                 # "dense" | "detection"
    batchable: bool = True              # False: one image per call (feeds(1) only)
    opset: int = 17
    det: Optional[dict] = None          # detection outputs: see task_checks.det_rows
    note: str = ""
    external_data: bool = False         # weights > 2 GB: saved beside the .onnx file
    exporter: str = "auto"              # the exporter users use for it ("auto": TorchScript, dynamo if it fails)

    def feeds(self, batch=1):
        """{input name: np.ndarray} at `batch` (1 where the model has no batch axis)."""
        return ti.feeds(self.inputs, batch)

    def manifest(self):
        """What tests/models/run_task_tests.py needs to run the model without PyTorch."""
        return {"inputs": self.inputs, "outputs": self.outputs, "kind": self.kind, "batchable": self.batchable,
                "det": self.det, "opset": self.opset, "note": self.note}


MODELS = {}


def model(name):
    def reg(fn):
        MODELS[name] = fn
        return fn
    return reg


# ---------------------------------------------------------------------------------------------
# random weights that behave


def recalibrate_bn(module, run, batches):
    """BatchNorm running statistics from `batches` (each run through `run(module, batch)` with
    the BatchNorm layers alone in training mode, cumulative averages), as bench/zoo.py does: an
    untrained network's statistics (mean 0, variance 1) let deep stacks grow past float16."""
    import torch
    bns = [m for m in module.modules() if isinstance(m, torch.nn.modules.batchnorm._BatchNorm)]
    if not bns:
        return
    for bn in bns:
        bn.reset_running_stats()
        bn.momentum = None
        bn.train()
    with torch.no_grad():
        for b in batches:
            run(module, b)
    for bn in bns:
        bn.eval()


def spread_logits(module, layers, run, median, top):
    """Rescales each layer (Conv2d/Linear) in `layers`, one after the other, by an affine map of
    its outputs on run(module): their median becomes `median` and their largest value `top`
    (the tail decides which detections survive, and it is far from Gaussian)."""
    import torch
    for layer in layers:
        got = []
        h = layer.register_forward_hook(lambda m, i, o: got.append(o.detach().flatten()))
        with torch.no_grad():
            run(module)
        h.remove()
        o = torch.cat(got).numpy()
        med, mx = float(np.median(o)), float(o.max())
        scale = (top - median) / max(mx - med, 1e-12)
        with torch.no_grad():
            layer.weight.mul_(scale)
            if layer.bias is None:
                layer.bias = torch.nn.Parameter(torch.zeros(layer.weight.shape[0]))
            layer.bias.copy_((layer.bias - med) * scale + median)


def _seed(n=0):
    import torch
    torch.manual_seed(n)
    np.random.seed(n)


# ---------------------------------------------------------------------------------------------
# torchvision detection

class TorchvisionDetector:
    """The torchvision detector on one image [3, H, W] -> boxes, scores, labels (and masks or
    keypoints): the list-in, dict-out model of torchvision, as its ONNX export flattens it."""

    @staticmethod
    def wrap(m, extra=()):
        import torch

        class Wrapper(torch.nn.Module):
            def __init__(self):
                super().__init__()
                self.m = m

            def forward(self, image):
                d = self.m([image])[0]
                return tuple(d[k] for k in ("boxes", "scores", "labels") + tuple(extra))
        return Wrapper().eval()


def _tv_detector(name, build, extra=(), spread=(), hw=(480, 640), note=""):
    import torch
    import torchvision  # noqa: F401 - imported before tracing: its first import inside a trace records an op
    _seed(0)
    m = build().eval()
    w = TorchvisionDetector.wrap(m, extra)
    spec = {"recipe": "scene", "shape": [3, *hw]}
    img = ti.make(spec)
    recalibrate_bn(m, lambda mod, x: mod(list(torch.from_numpy(x))), [ti.scenes(4, *hw, seed=1)])
    run = lambda mod: mod([torch.from_numpy(img)])  # noqa: E731
    for layers, (median, top) in spread:
        spread_logits(m, layers(m), run, median, top)
    outs = ["boxes", "scores", "labels"] + list(extra)
    dyn = {"image": {1: "height", 2: "width"}}
    for o in outs:
        dyn[o] = {0: "detections"}
    return Task(name, w, {"image": spec}, outs, dyn, kind="detection", batchable=False,
                det={"format": "torchvision", "boxes": "boxes", "scores": "scores", "labels": "labels"},
                note=note or f"one image {hw[0]}x{hw[1]} (torchvision's export takes a list: no batch axis)")


@model("ssdlite320_mobilenet_v3_large")
def ssdlite():
    import torchvision.models.detection as d
    return _tv_detector("ssdlite320_mobilenet_v3_large",
                        lambda: d.ssdlite320_mobilenet_v3_large(weights=None, weights_backbone=None),
                        spread=[(lambda m: [b[-1] for b in m.head.classification_head.module_list], (0.0, 6.0))])


@model("retinanet_resnet50_fpn")
def retinanet():
    import torchvision.models.detection as d
    return _tv_detector("retinanet_resnet50_fpn",
                        lambda: d.retinanet_resnet50_fpn(weights=None, weights_backbone=None),
                        spread=[(lambda m: [m.head.classification_head.cls_logits], (-6.0, 1.0))])


@model("fcos_resnet50_fpn")
def fcos():
    import torchvision.models.detection as d
    return _tv_detector("fcos_resnet50_fpn", lambda: d.fcos_resnet50_fpn(weights=None, weights_backbone=None),
                        spread=[(lambda m: [m.head.classification_head.cls_logits], (-6.0, 1.0)),
                                (lambda m: [m.head.regression_head.bbox_ctrness], (0.0, 3.0))])


_RCNN_SPREAD = [(lambda m: [m.rpn.head.cls_logits], (0.0, 4.0)),
                (lambda m: [m.roi_heads.box_predictor.cls_score], (0.0, 5.0))]


@model("fasterrcnn_mobilenet_v3_large_320_fpn")
def fasterrcnn():
    import torchvision.models.detection as d
    return _tv_detector("fasterrcnn_mobilenet_v3_large_320_fpn",
                        lambda: d.fasterrcnn_mobilenet_v3_large_320_fpn(weights=None, weights_backbone=None),
                        spread=_RCNN_SPREAD)


@model("maskrcnn_resnet50_fpn")
def maskrcnn():
    import torchvision.models.detection as d
    return _tv_detector("maskrcnn_resnet50_fpn", lambda: d.maskrcnn_resnet50_fpn(weights=None, weights_backbone=None),
                        extra=("masks",), spread=_RCNN_SPREAD)


@model("keypointrcnn_resnet50_fpn")
def keypointrcnn():
    import torchvision.models.detection as d
    return _tv_detector("keypointrcnn_resnet50_fpn",
                        lambda: d.keypointrcnn_resnet50_fpn(weights=None, weights_backbone=None),
                        extra=("keypoints", "keypoints_scores"), spread=_RCNN_SPREAD)


def _tiny_rcnn(name, kind):
    """torchvision's FasterRCNN / MaskRCNN / KeypointRCNN classes around a two-conv backbone
    with 8 channels and heads of a few channels: the same graph (transform, RPN, NMS, RoIAlign,
    box decoding, mask pasting or keypoint decoding) at a size the repository can hold."""
    import torch.nn as nn
    from torchvision.models.detection import FasterRCNN, KeypointRCNN, MaskRCNN
    from torchvision.models.detection.anchor_utils import AnchorGenerator
    from torchvision.models.detection.faster_rcnn import FastRCNNPredictor, TwoMLPHead
    from torchvision.models.detection.keypoint_rcnn import KeypointRCNNHeads, KeypointRCNNPredictor
    from torchvision.models.detection.mask_rcnn import MaskRCNNHeads, MaskRCNNPredictor
    from torchvision.ops import MultiScaleRoIAlign
    _seed(0)
    c, classes = 8, 5
    backbone = nn.Sequential(nn.Conv2d(3, c, 3, 2, 1), nn.BatchNorm2d(c), nn.ReLU(),
                             nn.Conv2d(c, c, 3, 2, 1), nn.BatchNorm2d(c), nn.ReLU(),
                             nn.Conv2d(c, c, 3, 2, 1), nn.BatchNorm2d(c), nn.ReLU())
    backbone.out_channels = c
    common = dict(min_size=96, max_size=128, rpn_pre_nms_top_n_test=100, rpn_post_nms_top_n_test=30,
                  box_detections_per_img=20,
                  rpn_anchor_generator=AnchorGenerator(sizes=((16, 32, 64),), aspect_ratios=((0.5, 1.0, 2.0),)),
                  box_roi_pool=MultiScaleRoIAlign(["0"], 7, 2), box_head=TwoMLPHead(c * 49, 16),
                  box_predictor=FastRCNNPredictor(16, classes if kind != "keypoint" else 2))
    extra = ()
    if kind == "faster":
        build = lambda: FasterRCNN(backbone, **common)  # noqa: E731
    elif kind == "mask":
        build = lambda: MaskRCNN(backbone, mask_roi_pool=MultiScaleRoIAlign(["0"], 14, 2),  # noqa: E731
                                 mask_head=MaskRCNNHeads(c, [8], 1), mask_predictor=MaskRCNNPredictor(8, 8, classes),
                                 **common)
        extra = ("masks",)
    else:
        build = lambda: KeypointRCNN(backbone, keypoint_roi_pool=MultiScaleRoIAlign(["0"], 14, 2),  # noqa: E731
                                     keypoint_head=KeypointRCNNHeads(c, [8]),
                                     keypoint_predictor=KeypointRCNNPredictor(8, 17), **common)
        extra = ("keypoints", "keypoints_scores")
    return _tv_detector(name, build, extra=extra, spread=_RCNN_SPREAD, hw=(96, 128),
                        note=f"torchvision's {kind} R-CNN classes around a tiny backbone, one image 96x128")


@model("fasterrcnn_tiny")
def fasterrcnn_tiny():
    return _tiny_rcnn("fasterrcnn_tiny", "faster")


@model("maskrcnn_tiny")
def maskrcnn_tiny():
    return _tiny_rcnn("maskrcnn_tiny", "mask")


@model("keypointrcnn_tiny")
def keypointrcnn_tiny():
    return _tiny_rcnn("keypointrcnn_tiny", "keypoint")


@model("ssd_tiny")
def ssd_tiny():
    """torchvision's SSD class around a two-level backbone of a few channels, 6 classes: SSDlite's
    postprocessing (a select and top-k chain per class, concatenated, then batched NMS) at a size
    the repository can hold."""
    from collections import OrderedDict

    import torch.nn as nn
    from torchvision.models.detection.anchor_utils import DefaultBoxGenerator
    from torchvision.models.detection.ssd import SSD, SSDHead
    _seed(0)
    c, classes = 8, 6

    class Backbone(nn.Module):
        def __init__(self):
            super().__init__()
            self.a = nn.Sequential(nn.Conv2d(3, c, 3, 4, 1), nn.ReLU(), nn.Conv2d(c, c, 3, 2, 1), nn.ReLU())
            self.b = nn.Sequential(nn.Conv2d(c, c, 3, 2, 1), nn.ReLU())

        def forward(self, x):
            a = self.a(x)
            return OrderedDict([("0", a), ("1", self.b(a))])

    anchors = DefaultBoxGenerator([[2], [2]])
    head = SSDHead([c, c], anchors.num_anchors_per_location(), classes)
    build = lambda: SSD(Backbone(), anchors, (96, 96), classes, head=head, score_thresh=0.2,  # noqa: E731
                        topk_candidates=20, detections_per_img=40)
    return _tv_detector("ssd_tiny", build, hw=(96, 128),
                        spread=[(lambda m: list(m.head.classification_head.module_list), (0.0, 3.0))],
                        note="torchvision's SSD class around a tiny backbone, 6 classes, one image 96x128")


# ---------------------------------------------------------------------------------------------
# a YOLO-style detector with NMS in the graph

def _yolo(name, width, depth, side, classes, logit_median):
    import torch
    from task_nets import YoloLike
    _seed(0)
    m = YoloLike(width=width, depth=depth, num_classes=classes).eval()
    recalibrate_bn(m, lambda mod, x: mod.features(torch.from_numpy(x)), [ti.scenes(2, side, side, s) for s in (1, 2)])
    spec = {"recipe": "scenes", "shape": ["N", 3, side, side]}
    img = torch.from_numpy(ti.make(spec, 1))
    spread_logits(m, [c[-1] for c in m.cls], lambda mod: mod.head(mod.features(img)),
                  median=logit_median, top=0.5)
    dyn = {"images": {0: "batch"}, "detections": {0: "detections"}}
    return Task(name, m, {"images": spec}, ["detections"], dyn, kind="detection",
                det={"format": "rows", "output": "detections", "image": 0, "boxes": [1, 2, 3, 4], "score": 5,
                     "label": 6},
                note=f"images [N, 3, {side}, {side}] in [0, 1]; detections [K, 7] = image, x1, y1, x2, y2, "
                     "score, class over the batch (confidence 0.25, NMS IoU 0.45, at most 300)")


@model("yolo_like")
def yolo_like():
    return _yolo("yolo_like", 32, 1, 640, 80, -6.0)  # about YOLOv8n-s's size


@model("yolo_like_tiny")
def yolo_like_tiny():
    return _yolo("yolo_like_tiny", 2, 1, 128, 8, -3.0)


# ---------------------------------------------------------------------------------------------
# segmentation, video, optical flow

class DictOut:
    @staticmethod
    def wrap(m, key="out"):
        import torch

        class Wrapper(torch.nn.Module):
            def __init__(self):
                super().__init__()
                self.m = m

            def forward(self, x):
                return self.m(x)[key]
        return Wrapper().eval()


def _dense_vision(name, m, spec, out="output", note=""):
    import torch
    recalibrate_bn(m, lambda mod, x: mod(torch.from_numpy(x)), [ti.make(dict(spec, seed=s), 2) for s in (11, 13)])
    return Task(name, m.eval(), {"input": spec}, [out], {"input": {0: "batch"}, out: {0: "batch"}},
                note=note or "input [" + ", ".join(map(str, spec["shape"])) + "]")


def _images(side):
    return {"recipe": "scenes", "shape": ["N", 3, side, side], "normalize": True}


@model("fcn_resnet50")
def fcn():
    import torchvision.models.segmentation as s
    _seed(0)
    return _dense_vision("fcn_resnet50", DictOut.wrap(s.fcn_resnet50(weights=None, weights_backbone=None)),
                         _images(520), "out")


@model("deeplabv3_mobilenet_v3_large")
def deeplab():
    import torchvision.models.segmentation as s
    _seed(0)
    return _dense_vision("deeplabv3_mobilenet_v3_large",
                         DictOut.wrap(s.deeplabv3_mobilenet_v3_large(weights=None, weights_backbone=None)),
                         _images(520), "out")


@model("lraspp_mobilenet_v3_large")
def lraspp():
    import torchvision.models.segmentation as s
    _seed(0)
    return _dense_vision("lraspp_mobilenet_v3_large",
                         DictOut.wrap(s.lraspp_mobilenet_v3_large(weights=None, weights_backbone=None)),
                         _images(520), "out")


def _clips(t, side):
    return {"recipe": "clips", "shape": ["N", 3, t, side, side]}


@model("r3d_18")
def r3d():
    import torchvision.models.video as v
    _seed(0)
    return _dense_vision("r3d_18", v.r3d_18(weights=None), _clips(16, 112))


@model("s3d")
def s3d():
    import torchvision.models.video as v
    _seed(0)
    return _dense_vision("s3d", v.s3d(weights=None), _clips(16, 224))


@model("segmentation_tiny")
def segmentation_tiny():
    """torchvision's LRASPP class (its head: 1x1 convs, the global-pool gate, bilinear upsampling
    of both branches to the input size) on a backbone of three strided conv-BN-ReLU stages."""
    import torch.nn as nn
    from torchvision.models.segmentation.lraspp import LRASPP
    _seed(0)

    def cbr(i, o, s=1, d=1):
        return nn.Sequential(nn.Conv2d(i, o, 3, s, d, dilation=d, bias=False), nn.BatchNorm2d(o), nn.ReLU())

    class Backbone(nn.Module):
        def __init__(self):
            super().__init__()
            self.low = nn.Sequential(cbr(3, 8, 2), cbr(8, 8, 2), cbr(8, 12, 2))  # stride 8
            self.high = nn.Sequential(cbr(12, 16, 2), cbr(16, 16, 1, 2))       # stride 16, dilated

        def forward(self, x):
            low = self.low(x)
            return {"low": low, "high": self.high(low)}

    m = DictOut.wrap(LRASPP(Backbone(), 12, 16, 5, inter_channels=8))
    return _dense_vision("segmentation_tiny", m, {"recipe": "scenes", "shape": ["N", 3, 64, 96], "normalize": True},
                         "out", note="torchvision's LRASPP head on a 3-stage backbone, 64x96")


@model("video3d_tiny")
def video3d_tiny():
    """The video models' layers at a tiny size: r3d's (3, 7, 7) stem and residual 3x3x3 block, an
    S3D-style separable block (1, 3, 3) then (3, 1, 1), 3-D max pooling, global average pooling."""
    import torch.nn as nn
    _seed(0)

    class Block(nn.Module):
        def __init__(self, c):
            super().__init__()
            self.a = nn.Sequential(nn.Conv3d(c, c, 3, 1, 1, bias=False), nn.BatchNorm3d(c), nn.ReLU())
            self.b = nn.Sequential(nn.Conv3d(c, c, 3, 1, 1, bias=False), nn.BatchNorm3d(c))

        def forward(self, x):
            return (x + self.b(self.a(x))).relu()

    m = nn.Sequential(
        nn.Conv3d(3, 8, (3, 7, 7), (1, 2, 2), (1, 3, 3), bias=False), nn.BatchNorm3d(8), nn.ReLU(), Block(8),
        nn.MaxPool3d((1, 3, 3), (1, 2, 2), (0, 1, 1)),
        nn.Conv3d(8, 12, (1, 3, 3), 1, (0, 1, 1), bias=False), nn.BatchNorm3d(12), nn.ReLU(),
        nn.Conv3d(12, 12, (3, 1, 1), (2, 1, 1), (1, 0, 0), bias=False), nn.BatchNorm3d(12), nn.ReLU(),
        nn.AdaptiveAvgPool3d(1), nn.Flatten(), nn.Linear(12, 10))
    return _dense_vision("video3d_tiny", m, _clips(8, 32), note="r3d/S3D layers on 8-frame 32x32 clips")


@model("raft_small")
def raft():
    import torch
    import torchvision.models.optical_flow as of
    _seed(0)
    m = of.raft_small(weights=None).eval()

    class LastFlow(torch.nn.Module):  # RAFT returns every update's flow; users keep the last
        def __init__(self):
            super().__init__()
            self.m = m

        def forward(self, image1, image2):
            return self.m(image1, image2)[-1]

    h, w = 360, 640
    specs = {f"image{i + 1}": {"recipe": "frames", "shape": ["N", 3, h, w], "which": i} for i in (0, 1)}
    f = ti.feeds(specs, 1)
    recalibrate_bn(m, lambda mod, f: mod(torch.from_numpy(f["image1"]), torch.from_numpy(f["image2"])), [f])
    return Task("raft_small", LastFlow().eval(), specs, ["flow"],
                {"image1": {0: "batch"}, "image2": {0: "batch"}, "flow": {0: "batch"}},
                note=f"two frames [N, 3, {h}, {w}] in [-1, 1]; 12 flow updates (GridSample), the last flow out")


@model("flow_lookup_tiny")
def flow_lookup_tiny():
    """RAFT's correlation lookup at a tiny size: features of both frames, their all-pairs
    correlation, sampled (F.grid_sample, bilinear, align_corners=True: ONNX GridSample) in a
    3x3 window around each pixel moved by a first flow guess, and a conv head to the flow."""
    import torch
    import torch.nn as nn
    import torch.nn.functional as F
    _seed(0)

    class FlowLookup(nn.Module):
        def __init__(self, c=8, r=1):
            super().__init__()
            self.r = r
            self.feat = nn.Sequential(nn.Conv2d(3, c, 3, 2, 1), nn.ReLU(), nn.Conv2d(c, c, 3, 2, 1))
            self.guess = nn.Conv2d(c, 2, 3, 1, 1)
            self.head = nn.Conv2d((2 * r + 1) ** 2, 2, 3, 1, 1)

        def forward(self, image1, image2):
            f1, f2 = self.feat(image1), self.feat(image2)
            n, c, h, w = f1.shape
            corr = torch.matmul(f1.flatten(2).transpose(1, 2), f2.flatten(2)) / c ** 0.5  # [N, HW, HW]
            corr = corr.reshape(n * h * w, 1, h, w)
            ys, xs = torch.meshgrid(torch.arange(h, dtype=f1.dtype), torch.arange(w, dtype=f1.dtype), indexing="ij")
            coords = torch.stack([xs, ys], -1).unsqueeze(0) + 2.0 * torch.tanh(self.guess(f1)).permute(0, 2, 3, 1)
            d = torch.arange(-self.r, self.r + 1, dtype=f1.dtype)
            dy, dx = torch.meshgrid(d, d, indexing="ij")
            delta = torch.stack([dx, dy], -1).reshape(1, 2 * self.r + 1, 2 * self.r + 1, 2)
            grid = coords.reshape(n * h * w, 1, 1, 2) + delta
            scale = torch.tensor([2.0 / (w - 1), 2.0 / (h - 1)], dtype=f1.dtype)
            sampled = F.grid_sample(corr, grid * scale - 1, mode="bilinear", align_corners=True)
            return self.head(sampled.reshape(n, h, w, -1).permute(0, 3, 1, 2))

    specs = {f"image{i + 1}": {"recipe": "frames", "shape": ["N", 3, 32, 48], "which": i} for i in (0, 1)}
    return Task("flow_lookup_tiny", FlowLookup().eval(), specs, ["flow"],
                {"image1": {0: "batch"}, "image2": {0: "batch"}, "flow": {0: "batch"}},
                note="RAFT's all-pairs correlation lookup (GridSample) at 32x48, 8 channels")


# ---------------------------------------------------------------------------------------------
# recurrent text models

def _text(name, cls, seq, vocab, out, **kw):
    from task_nets import GruTagger, LstmClassifier
    _seed(0)
    m = {"lstm": LstmClassifier, "gru": GruTagger}[cls](vocab=vocab, **kw).eval()
    dyn = {"input_ids": {0: "batch", 1: "sequence"}, out: {0: "batch"}}
    if cls == "gru":
        dyn[out][1] = "sequence"
    return Task(name, m, {"input_ids": {"recipe": "tokens", "shape": ["N", seq], "vocab": vocab}}, [out], dyn,
                note=f"input_ids [N, {seq}] int64 (batch and sequence dynamic)")


@model("lstm_classifier")
def lstm():
    return _text("lstm_classifier", "lstm", 128, 20000, "logits")


@model("gru_tagger")
def gru():
    return _text("gru_tagger", "gru", 64, 20000, "tags")


@model("lstm_classifier_tiny")
def lstm_tiny():
    return _text("lstm_classifier_tiny", "lstm", 12, 100, "logits", emb=8, hidden=12)


@model("gru_tagger_tiny")
def gru_tiny():
    return _text("gru_tagger_tiny", "gru", 12, 100, "tags", emb=8, hidden=12, tags=5)


# ---------------------------------------------------------------------------------------------
# spectral models: the DFT and STFT in the graph (dynamo exports them; TorchScript cannot)

@model("spectrogram_tiny")
def spectrogram_tiny():
    """An audio classifier's front end in the graph: torch.stft (centred, Hann window) -> power
    -> a mel-like filter bank -> log -> Conv1d -> pooled logits (the STFT op and a reflect Pad)."""
    import torch
    import torch.nn as nn
    _seed(0)

    class Spectrogram(nn.Module):
        def __init__(self):
            super().__init__()
            self.register_buffer("window", torch.hann_window(64))
            self.register_buffer("bank", torch.rand(33, 16))
            self.conv = nn.Conv1d(16, 8, 3)
            self.head = nn.Linear(8, 4)

        def forward(self, audio):
            z = torch.stft(audio, n_fft=64, hop_length=16, window=self.window, return_complex=True)
            power = z.abs() ** 2                                    # [N, 33, frames]
            mel = torch.log(power.transpose(1, 2) @ self.bank + 1e-6)
            return self.head(torch.relu(self.conv(mel.transpose(1, 2))).mean(-1))

    return Task("spectrogram_tiny", Spectrogram().eval(), {"audio": {"recipe": "normal", "shape": ["N", 800]}},
                ["logits"], {"audio": {0: "batch"}, "logits": {0: "batch"}},
                note="audio [N, 800] -> logits [N, 4]; STFT 64 / hop 16")


@model("fnet_tiny")
def fnet_tiny():
    """FNet's token mixing: the real part of a 2-D FFT over the hidden and sequence axes in place of
    attention (DFT ops), then LayerNorm and a GELU MLP, two blocks."""
    import torch
    import torch.nn as nn
    _seed(0)

    class Block(nn.Module):
        def __init__(self, d):
            super().__init__()
            self.n1, self.n2 = nn.LayerNorm(d), nn.LayerNorm(d)
            self.ff = nn.Sequential(nn.Linear(d, 2 * d), nn.GELU(), nn.Linear(2 * d, d))

        def forward(self, x):
            x = self.n1(x + torch.fft.fftn(x, dim=(-1, -2)).real)
            return self.n2(x + self.ff(x))

    class FNet(nn.Module):
        def __init__(self):
            super().__init__()
            self.emb = nn.Embedding(100, 32)
            self.blocks = nn.Sequential(Block(32), Block(32))

        def forward(self, input_ids):
            return self.blocks(self.emb(input_ids))

    return Task("fnet_tiny", FNet().eval(), {"input_ids": {"recipe": "tokens", "shape": ["N", 16], "vocab": 100}},
                ["hidden"], {"input_ids": {0: "batch"}, "hidden": {0: "batch"}},
                note="input_ids [N, 16] -> hidden [N, 16, 32]; 2-D FFT token mixing")


# ---------------------------------------------------------------------------------------------
# Stable Diffusion 1.5 (task_sd.py)

def _sd(name):
    import task_sd
    return task_sd.build(name, Task, _seed)


for _n in ("sd15_unet", "sd15_vae_decoder", "sd15_text_encoder",
           "sd15_unet_tiny", "sd15_vae_decoder_tiny", "sd15_text_encoder_tiny"):
    MODELS[_n] = (lambda n: lambda: _sd(n))(_n)


# ---------------------------------------------------------------------------------------------
# export

def torch_args(task, feeds):
    import torch
    return tuple(torch.from_numpy(v) for v in feeds.values())


def export(task, path, exporter=None, feeds=None):
    """Writes task's ONNX model to `path`; returns the exporter used ("torchscript" or
    "dynamo") and, where TorchScript failed first, why."""
    import torch
    feeds = feeds or task.feeds(2 if task.batchable else 1)
    args = torch_args(task, feeds)
    names = list(feeds)
    exporter = exporter or task.exporter
    os.makedirs(os.path.dirname(os.path.abspath(path)) or ".", exist_ok=True)
    why = None
    if exporter in ("auto", "torchscript"):
        try:
            with torch.no_grad():
                torch.onnx.export(task.module, args, path, opset_version=task.opset, input_names=names,
                                  output_names=task.outputs, dynamic_axes=task.dynamic, dynamo=False,
                                  do_constant_folding=True)
            if task.external_data:
                _one_data_file(path)
            return "torchscript", None
        except Exception as e:  # noqa: BLE001 - TorchScript's failure is reported, then dynamo
            if exporter == "torchscript":
                raise
            why = f"{type(e).__name__}: {str(e).strip().splitlines()[0][:300]}"
            print(f"  {task.name}: TorchScript export failed ({why}); dynamo", flush=True)
    from torch.export import Dim
    dims = {}
    shapes = []
    for n in names:
        axes = task.dynamic.get(n, {})
        shapes.append({a: dims.setdefault(d, Dim(d, min=1, max=4096)) for a, d in axes.items()} or None)
    with torch.no_grad():
        torch.onnx.export(task.module, args, path, input_names=names, output_names=task.outputs,
                          dynamic_shapes=tuple(shapes), dynamo=True, external_data=task.external_data)
    return "dynamo", why


def _one_data_file(path):
    """diffusers' converter rewrites the UNet's external data as one file beside the model
    (`weights.pb`); TorchScript writes one file per tensor."""
    import onnx
    d = os.path.dirname(os.path.abspath(path))
    m = onnx.load(path)
    for f in os.listdir(d):
        full = os.path.join(d, f)
        if full != os.path.abspath(path) and not f.endswith(".onnx") and os.path.isfile(full):
            os.remove(full)
    onnx.save_model(m, path, save_as_external_data=True, all_tensors_to_one_file=True,
                    location=os.path.basename(path) + ".data", convert_attribute=False)


def export_to(task, out_dir, exporter=None):
    """Exports `task` into out_dir (its own folder there where its weights are external data)
    with its manifest beside it (NAME.onnx.json: Task.manifest() and how it was exported).
    Returns (path, manifest)."""
    import json
    d = os.path.join(out_dir, task.name) if task.external_data else out_dir
    path = os.path.join(d, task.name + ".onnx")
    t0 = time.time()
    how, why = export(task, path, exporter)
    meta = dict(task.manifest(), exporter=how, torchscript_error=why, export_s=round(time.time() - t0, 1))
    import onnx
    m = onnx.load(path, load_external_data=False)
    meta["opset"] = next(o.version for o in m.opset_import if o.domain in ("", "ai.onnx"))  # dynamo: 18 or more
    with open(path + ".json", "w") as f:
        json.dump(meta, f, indent=1)
    return path, meta


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--out", default="models/tasks")
    ap.add_argument("--models", default=",".join(n for n in MODELS if not n.endswith("_tiny")))
    ap.add_argument("--exporter", default=None, choices=["auto", "torchscript", "dynamo"])
    ap.add_argument("--list", action="store_true")
    a = ap.parse_args()
    if a.list:
        print("\n".join(MODELS))
        return 0
    for name in a.models.split(","):
        task = MODELS[name]()
        path, meta = export_to(task, a.out, a.exporter)
        why = meta["torchscript_error"]
        print(f"{name}: {path} ({meta['exporter']}{'; TorchScript: ' + why if why else ''}, {meta['export_s']:.0f} s)"
              + (f"; {task.note}" if task.note else ""), flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
