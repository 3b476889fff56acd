#!/usr/bin/env python3
"""Regenerates tests/models/tasks/: the task models' tiny versions (scripts/models/tasks.py,
random weights, seed 0) exported as the full ones are, and manifest.json, which says how
tests/models/run_task_tests.py makes each model's inputs (task_inputs.make specs) and judges its
outputs, so that the runner needs no PyTorch. Needs PyTorch, torchvision, transformers and
diffusers (the versions are written into the manifest).

  python3 scripts/models/gen_task_tests.py [--out tests/models/tasks] [--models a,b]
"""
import argparse
import json
import os
import sys

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, HERE)
import tasks  # noqa: E402

ROOT = os.path.dirname(os.path.dirname(HERE))
# What each tiny model stands for (and the ops it brings).
TINY = {
    "yolo_like_tiny": "YOLO-style detector, NMS in the graph (If, NonMaxSuppression, NonZero)",
    "fasterrcnn_tiny": "torchvision Faster R-CNN (If, NonMaxSuppression, TopK, RoiAlign)",
    "ssd_tiny": "torchvision SSD (a NonZero and TopK chain per class: batch_select_topk)",
    "maskrcnn_tiny": "torchvision Mask R-CNN (also Loop: mask pasting)",
    "keypointrcnn_tiny": "torchvision Keypoint R-CNN (also Loop: heatmaps to keypoints)",
    "flow_lookup_tiny": "RAFT's correlation lookup (GridSample)",
    "segmentation_tiny": "torchvision's LRASPP head (global-pool gate, bilinear upsampling)",
    "video3d_tiny": "r3d/S3D layers (Conv3d stem, residual 3x3x3, separable (1,3,3)+(3,1,1), MaxPool3d)",
    "lstm_classifier_tiny": "bidirectional 2-layer LSTM text classifier (LSTM)",
    "gru_tagger_tiny": "bidirectional 2-layer GRU tagger (GRU)",
    "sd15_unet_tiny": "SD 1.5 UNet blocks: ResNet, cross-attention transformer, up/down sampling",
    "sd15_vae_decoder_tiny": "SD 1.5 VAE decoder blocks (GroupNorm, mid attention, upsampling)",
    "sd15_text_encoder_tiny": "SD 1.5's CLIP text encoder (causal mask, quick GELU, argmax pooling)",
    "spectrogram_tiny": "an audio front end: torch.stft, power, filter bank, log, Conv1d (STFT)",
    "fnet_tiny": "FNet's token mixing: the real part of a 2-D FFT (DFT)",
}
MAX_BYTES = 1 << 20


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--out", default=os.path.join(ROOT, "tests", "models", "tasks"))
    ap.add_argument("--models", default=",".join(TINY))
    a = ap.parse_args()
    import torch
    import torchvision
    versions = {"torch": torch.__version__, "torchvision": torchvision.__version__}
    for lib in ("transformers", "diffusers"):  # the SD models need them, the others not
        try:
            versions[lib] = __import__(lib).__version__
        except ImportError:
            pass
    os.makedirs(a.out, exist_ok=True)
    mpath = os.path.join(a.out, "manifest.json")
    manifest = {"models": {}}
    if os.path.exists(mpath):
        with open(mpath) as f:
            manifest = json.load(f)
    # The versions every model was made with, unless a model says its own (made alone later).
    every = set(a.models.split(",")) >= set(TINY)
    if every:
        manifest["generated_with"] = dict(versions, script="scripts/models/gen_task_tests.py")
    for name in a.models.split(","):
        path, meta = tasks.export_to(tasks.MODELS[name](), a.out)
        os.remove(path + ".json")  # the manifest holds it
        meta.pop("export_s", None)
        meta["what"] = TINY[name]
        if not every:
            meta["generated_with"] = versions
        size = os.path.getsize(path)
        if size > MAX_BYTES:
            sys.exit(f"{name}: {size} bytes, over {MAX_BYTES}: make it smaller")
        manifest["models"][name] = meta
        print(f"{name}: {path} ({size // 1024} KiB, {meta['exporter']})")
    with open(mpath, "w") as f:
        json.dump(manifest, f, indent=1)
        f.write("\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
