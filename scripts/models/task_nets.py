"""The task models that are not a library's own: a YOLO-style detector, an LSTM text classifier
and a GRU tagger, written the way users write them in PyTorch (scripts/models/tasks.py exports
them).

YoloLike: an anchor-free single-stage detector in YOLOv8's shape, kept small: a strided
conv-BN-SiLU backbone with cross-stage blocks and SPPF, a PAN neck (upsample + concat, then
strided convs back down), a decoupled head per stride (8, 16, 32) predicting box distances
(left, top, right, bottom, softplus × stride) and class logits, the decode to xyxy boxes, and
the post-processing in forward as YOLO exports with NMS have it: best class per box, a
confidence threshold, torchvision.ops.batched_nms over (image, class) groups and the first
max_det survivors. Output: detections [K, 7] = (image index, x1, y1, x2, y2, score, class) for
the whole batch, K decided by the data.
"""
import torch
import torch.nn as nn
import torch.nn.functional as F
import torchvision  # at import: its first import inside a traced forward records an op call


class ConvBnAct(nn.Sequential):
    def __init__(self, c1, c2, k=3, s=1):
        super().__init__(nn.Conv2d(c1, c2, k, s, k // 2, bias=False), nn.BatchNorm2d(c2), nn.SiLU())


class Bottleneck(nn.Module):
    def __init__(self, c, shortcut=True):
        super().__init__()
        self.cv1, self.cv2 = ConvBnAct(c, c, 3), ConvBnAct(c, c, 3)
        self.add = shortcut

    def forward(self, x):
        y = self.cv2(self.cv1(x))
        return x + y if self.add else y


class CSPBlock(nn.Module):
    """YOLOv8's C2f: split in two, a chain of bottlenecks on one half, concat every stage."""

    def __init__(self, c1, c2, n=1, shortcut=True):
        super().__init__()
        self.c = c2 // 2
        self.cv1 = ConvBnAct(c1, 2 * self.c, 1)
        self.m = nn.ModuleList(Bottleneck(self.c, shortcut) for _ in range(n))
        self.cv2 = ConvBnAct((2 + n) * self.c, c2, 1)

    def forward(self, x):
        y = list(self.cv1(x).chunk(2, 1))
        for m in self.m:
            y.append(m(y[-1]))
        return self.cv2(torch.cat(y, 1))


class SPPF(nn.Module):
    def __init__(self, c1, c2, k=5):
        super().__init__()
        self.cv1, self.cv2 = ConvBnAct(c1, c1 // 2, 1), ConvBnAct(c1 // 2 * 4, c2, 1)
        self.pool = nn.MaxPool2d(k, 1, k // 2)

    def forward(self, x):
        x = self.cv1(x)
        y1 = self.pool(x)
        y2 = self.pool(y1)
        return self.cv2(torch.cat([x, y1, y2, self.pool(y2)], 1))


class YoloLike(nn.Module):
    def __init__(self, width=32, depth=1, num_classes=80, conf_thres=0.25, iou_thres=0.45, max_det=300):
        super().__init__()
        w = width
        self.nc, self.conf, self.iou, self.max_det = num_classes, conf_thres, iou_thres, max_det
        self.stem = nn.Sequential(ConvBnAct(3, w, 3, 2), ConvBnAct(w, 2 * w, 3, 2), CSPBlock(2 * w, 2 * w, depth))
        self.p3 = nn.Sequential(ConvBnAct(2 * w, 4 * w, 3, 2), CSPBlock(4 * w, 4 * w, 2 * depth))
        self.p4 = nn.Sequential(ConvBnAct(4 * w, 8 * w, 3, 2), CSPBlock(8 * w, 8 * w, 2 * depth))
        self.p5 = nn.Sequential(ConvBnAct(8 * w, 16 * w, 3, 2), CSPBlock(16 * w, 16 * w, depth),
                                SPPF(16 * w, 16 * w))
        self.up4 = CSPBlock(24 * w, 8 * w, depth, False)
        self.up3 = CSPBlock(12 * w, 4 * w, depth, False)
        self.down4 = nn.Sequential(ConvBnAct(4 * w, 4 * w, 3, 2))
        self.n4 = CSPBlock(12 * w, 8 * w, depth, False)
        self.down5 = nn.Sequential(ConvBnAct(8 * w, 8 * w, 3, 2))
        self.n5 = CSPBlock(24 * w, 16 * w, depth, False)
        self.strides = (8, 16, 32)
        chans = (4 * w, 8 * w, 16 * w)
        cb, cc = max(16, chans[0] // 4), max(chans[0], min(num_classes, 100))
        self.box = nn.ModuleList(nn.Sequential(ConvBnAct(c, cb), ConvBnAct(cb, cb), nn.Conv2d(cb, 4, 1))
                                 for c in chans)
        self.cls = nn.ModuleList(nn.Sequential(ConvBnAct(c, cc), ConvBnAct(cc, cc), nn.Conv2d(cc, num_classes, 1))
                                 for c in chans)

    def features(self, x):
        p3 = self.p3(self.stem(x))
        p4 = self.p4(p3)
        p5 = self.p5(p4)
        u4 = self.up4(torch.cat([F.interpolate(p5, scale_factor=2.0, mode="nearest"), p4], 1))
        n3 = self.up3(torch.cat([F.interpolate(u4, scale_factor=2.0, mode="nearest"), p3], 1))
        n4 = self.n4(torch.cat([self.down4(n3), u4], 1))
        n5 = self.n5(torch.cat([self.down5(n4), p5], 1))
        return n3, n4, n5

    def head(self, feats):
        """Boxes [N, A, 4] (xyxy, input pixels) and class scores [N, A, classes]."""
        boxes, scores = [], []
        for f, box, cls, s in zip(feats, self.box, self.cls, self.strides):
            n, _, h, w = f.shape
            ys = torch.arange(h, device=f.device, dtype=f.dtype) + 0.5
            xs = torch.arange(w, device=f.device, dtype=f.dtype) + 0.5
            gy, gx = torch.meshgrid(ys, xs, indexing="ij")
            centers = torch.stack([gx, gy], -1).reshape(1, h * w, 2) * s
            d = F.softplus(box(f)).flatten(2).transpose(1, 2) * s  # [N, hw, 4]: l, t, r, b
            boxes.append(torch.cat([centers - d[..., :2], centers + d[..., 2:]], -1))
            scores.append(cls(f).flatten(2).transpose(1, 2).sigmoid())
        return torch.cat(boxes, 1), torch.cat(scores, 1)

    def forward(self, images):
        boxes, scores = self.head(self.features(images))
        n, a = scores.shape[:2]
        conf, cls = scores.max(-1)  # [N, A]
        image = torch.arange(n, device=images.device).unsqueeze(1).expand(n, a)
        keep = conf.flatten() > self.conf
        b = boxes.reshape(-1, 4)[keep]
        c = conf.flatten()[keep]
        k = cls.flatten()[keep]
        i = image.flatten()[keep]
        sel = torchvision.ops.batched_nms(b, c, k + i * self.nc, self.iou)[: self.max_det]
        return torch.cat([i[sel].unsqueeze(1).to(b.dtype), b[sel], c[sel].unsqueeze(1),
                          k[sel].unsqueeze(1).to(b.dtype)], 1)


class LstmClassifier(nn.Module):
    """Token ids [N, T] -> class logits [N, classes]: embedding, a 2-layer bidirectional LSTM,
    the last layer's final hidden states of both directions, a linear layer."""

    def __init__(self, vocab=20000, emb=128, hidden=256, layers=2, classes=4):
        super().__init__()
        self.emb = nn.Embedding(vocab, emb)
        self.rnn = nn.LSTM(emb, hidden, num_layers=layers, bidirectional=True, batch_first=True)
        self.fc = nn.Linear(2 * hidden, classes)

    def forward(self, ids):
        _, (h, _) = self.rnn(self.emb(ids))
        return self.fc(torch.cat([h[-2], h[-1]], 1))


class GruTagger(nn.Module):
    """Token ids [N, T] -> tag logits [N, T, tags]: embedding, a 2-layer bidirectional GRU, a
    linear layer per token (a BiGRU tagger without its CRF)."""

    def __init__(self, vocab=20000, emb=128, hidden=256, layers=2, tags=17):
        super().__init__()
        self.emb = nn.Embedding(vocab, emb)
        self.rnn = nn.GRU(emb, hidden, num_layers=layers, bidirectional=True, batch_first=True)
        self.fc = nn.Linear(2 * hidden, tags)

    def forward(self, ids):
        y, _ = self.rnn(self.emb(ids))
        return self.fc(y)
