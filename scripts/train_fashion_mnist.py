#!/usr/bin/env python3
"""Trains a small ResNet-style CNN on Fashion-MNIST (Debian's dataset-fashion-mnist, no
downloads), exports it to ONNX and writes the data kiln's INT8 accuracy check needs:

  OUT/fmnist_resnet.onnx          the model, input "input" float32[N,1,28,28] (normalized)
  OUT/calib/NNN.npy               calibration batches, from training images only
  OUT/test_images.npy             the 10k test images, normalized like the input
  OUT/test_labels.npy             their labels (int64)

Then scripts/fashion_mnist_accuracy.py reports FP32/TF32/FP16/INT8 top-1 (docs/quantization.md).
A few minutes on a GPU (default 8 epochs); `--smoke` runs a handful of steps on the CPU to check
the pipeline. Needs PyTorch (KILN_WITH_TORCH=1 scripts/setup.sh)."""
import argparse
import glob
import gzip
import os
import subprocess
import time

import numpy as np

MEAN, STD = 0.2860, 0.3530  # Fashion-MNIST training set, pixels in [0, 1]


def find_idx(name):
    """A file of the Debian package by its IDX name (compressed or not); $FMNIST_DIR first (for
    machines without the package, e.g. a copy of /usr/share/datasets/fashion-mnist)."""
    if os.environ.get("FMNIST_DIR"):
        hits = sorted(glob.glob(os.path.join(os.environ["FMNIST_DIR"], name + "*")))
        if hits:
            return hits[0]
    try:
        files = subprocess.run(["dpkg", "-L", "dataset-fashion-mnist"], capture_output=True, text=True,
                               check=True).stdout.split()
    except (OSError, subprocess.CalledProcessError):
        files = glob.glob("/usr/share/**/*", recursive=True)
    hits = [f for f in files if os.path.basename(f).startswith(name) and os.path.isfile(f)]
    if not hits:
        raise SystemExit(f"{name} not found: install Debian's dataset-fashion-mnist (scripts/setup.sh)")
    return sorted(hits)[0]


def read_idx(path):
    with (gzip.open if path.endswith(".gz") else open)(path, "rb") as f:
        data = f.read()
    ndim = data[3]
    dims = [int.from_bytes(data[4 + 4 * i:8 + 4 * i], "big") for i in range(ndim)]
    return np.frombuffer(data, np.uint8, offset=4 + 4 * ndim).reshape(dims)


def load(split):
    prefix = "train" if split == "train" else "t10k"
    x = read_idx(find_idx(f"{prefix}-images-idx3-ubyte")).astype(np.float32) / 255.0
    y = read_idx(find_idx(f"{prefix}-labels-idx1-ubyte")).astype(np.int64)
    return ((x - MEAN) / STD)[:, None, :, :], y


def make_model(torch):
    nn = torch.nn

    class Block(nn.Module):
        def __init__(self, cin, cout, stride):
            super().__init__()
            self.c1 = nn.Conv2d(cin, cout, 3, stride, 1, bias=False)
            self.b1 = nn.BatchNorm2d(cout)
            self.c2 = nn.Conv2d(cout, cout, 3, 1, 1, bias=False)
            self.b2 = nn.BatchNorm2d(cout)
            self.down = None
            if stride != 1 or cin != cout:
                self.down = nn.Sequential(nn.Conv2d(cin, cout, 1, stride, bias=False), nn.BatchNorm2d(cout))

        def forward(self, x):
            y = torch.relu(self.b1(self.c1(x)))
            y = self.b2(self.c2(y))
            return torch.relu(y + (x if self.down is None else self.down(x)))

    return nn.Sequential(
        nn.Conv2d(1, 32, 3, 1, 1, bias=False), nn.BatchNorm2d(32), nn.ReLU(),
        Block(32, 32, 1), Block(32, 64, 2), Block(64, 64, 1), Block(64, 128, 2), Block(128, 128, 1),
        nn.AdaptiveAvgPool2d(1), nn.Flatten(), nn.Linear(128, 10))


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--out", default="out/fashion_mnist")
    ap.add_argument("--epochs", type=int, default=8)
    ap.add_argument("--batch", type=int, default=256)
    ap.add_argument("--calib-images", type=int, default=512, help="training images for calibration")
    ap.add_argument("--calib-batch", type=int, default=64)
    ap.add_argument("--smoke", action="store_true", help="a few CPU steps on a subset (pipeline check)")
    ap.add_argument("--seed", type=int, default=0)
    a = ap.parse_args()
    import torch  # noqa: PLC0415 (optional dependency)

    torch.manual_seed(a.seed)
    rng = np.random.default_rng(a.seed)
    device = "cpu" if a.smoke or not torch.cuda.is_available() else "cuda"
    xtr, ytr = load("train")
    xte, yte = load("test")
    os.makedirs(os.path.join(a.out, "calib"), exist_ok=True)
    # Calibration images: training images the model is not evaluated on (a random subset).
    pick = rng.permutation(len(xtr))[: a.calib_images]
    for i in range(0, len(pick), a.calib_batch):
        np.save(os.path.join(a.out, "calib", f"{i // a.calib_batch:03d}.npy"), xtr[pick[i:i + a.calib_batch]])
    np.save(os.path.join(a.out, "test_images.npy"), xte)
    np.save(os.path.join(a.out, "test_labels.npy"), yte)

    model = make_model(torch).to(device)
    steps_per_epoch = len(xtr) // a.batch
    total = 20 if a.smoke else a.epochs * steps_per_epoch
    opt = torch.optim.SGD(model.parameters(), lr=0.1, momentum=0.9, weight_decay=5e-4, nesterov=True)
    sched = torch.optim.lr_scheduler.OneCycleLR(opt, max_lr=0.2, total_steps=total)
    xt, yt = torch.from_numpy(xtr), torch.from_numpy(ytr)
    t0 = time.time()
    model.train()
    for step in range(total):
        if step % steps_per_epoch == 0:
            order = torch.randperm(len(xtr))
        idx = order[(step % steps_per_epoch) * a.batch:][: a.batch]
        x, y = xt[idx].to(device), yt[idx].to(device)
        if not a.smoke:  # light augmentation: random horizontal flips
            flip = torch.rand(len(x), device=device) < 0.5
            x = torch.where(flip[:, None, None, None], x.flip(3), x)
        loss = torch.nn.functional.cross_entropy(model(x), y, label_smoothing=0.1)
        opt.zero_grad(set_to_none=True)
        loss.backward()
        opt.step()
        sched.step()
        if step % 200 == 0 or step == total - 1:
            print(f"step {step + 1}/{total} loss {loss.item():.4f} ({time.time() - t0:.0f} s)", flush=True)
    model.eval()
    correct = 0
    with torch.no_grad():
        for i in range(0, len(xte), 1000):
            correct += (model(torch.from_numpy(xte[i:i + 1000]).to(device)).argmax(1).cpu().numpy()
                        == yte[i:i + 1000]).sum()
    print(f"pytorch fp32 test top-1: {100.0 * correct / len(xte):.2f}%")
    path = os.path.join(a.out, "fmnist_resnet.onnx")
    kw = dict(input_names=["input"], output_names=["logits"], opset_version=17,
              dynamic_axes={"input": {0: "N"}, "logits": {0: "N"}})
    try:  # the TorchScript exporter (newer torch defaults to the dynamo one)
        torch.onnx.export(model.cpu(), torch.zeros(1, 1, 28, 28), path, dynamo=False, **kw)
    except TypeError:
        torch.onnx.export(model.cpu(), torch.zeros(1, 1, 28, 28), path, **kw)
    print(f"wrote {path}, {len(pick)} calibration images in {os.path.join(a.out, 'calib')}, test set .npy")


if __name__ == "__main__":
    main()
