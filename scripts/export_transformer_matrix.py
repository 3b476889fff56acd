#!/usr/bin/env python3
"""Export the transformer test matrix with the PyTorch and transformers of the Python running
this script: the Llama, Qwen2, Phi-3, ViT, DeiT and BERT architectures (tiny, random weights;
transformers' SDPA attention, and for Llama and GPT-2 also its eager attention: llama-eager,
gpt2-eager)
with both exporters (TorchScript opset 17, dynamo opset 18), as skeletons
(scripts/transformer_export.py --skeleton) named

  <arch>_<exporter>_tf<transformers version>_pt<torch version>.onnx   (e.g. llama_dynamo_tf5.17_pt2.11.onnx)

in OUT (default tests/models/transformers/matrix). The decoders are also exported once more by
dynamo without dynamic shapes (<arch>_dynamo-static_...): what torch.onnx.export writes when it
is given no dynamic_shapes. tests/models/run_transformer_tests.py runs every file there. An export
that fails, or that is not valid ONNX (onnx.checker, full check, on the model with its weights
filled in: torch 2.5's dynamo exporter writes a Concat without its axis in the decoders), is
reported and removed (exit status 1 at the end).

  /tmp/venv-old/bin/python scripts/export_transformer_matrix.py [OUT] [--only llama,qwen2]
"""
import argparse
import os
import subprocess
import sys

HERE = os.path.dirname(os.path.abspath(__file__))
ARCHS = {  # arch -> (script, extra arguments)
    "llama": ("export_llama.py", []),
    "llama-eager": ("export_llama.py", ["--attn", "eager"]),
    "gpt2-eager": ("export_gpt2.py", ["--attn", "eager"]),
    "qwen2": ("export_qwen2.py", []),
    "phi3": ("export_phi3.py", []),
    "vit": ("export_vit.py", ["--arch", "vit"]),
    "deit": ("export_vit.py", ["--arch", "deit"]),
    "bert": ("export_bert.py", []),
}
DECODERS = ("llama", "qwen2", "phi3")


def version_tag():
    import torch
    import transformers
    short = lambda v: ".".join(v.split("+")[0].split(".")[:2])  # noqa: E731
    return f"tf{short(transformers.__version__)}_pt{short(torch.__version__)}"


def invalid(path):
    """Why the skeleton at `path`, its weights filled in, is not valid ONNX; "" when it is."""
    import tempfile

    import onnx
    sys.path.insert(0, HERE)
    import transformer_export as tx
    with tempfile.TemporaryDirectory() as tmp:
        full = os.path.join(tmp, "model.onnx")
        tx.materialize(path, full)
        try:
            onnx.checker.check_model(full, full_check=True)
        except Exception as e:  # noqa: BLE001 (the checker raises several kinds)
            return "the export is not valid ONNX: " + " ".join(str(e).split())[:300]
    return ""


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("out", nargs="?", default=os.path.join(HERE, "..", "tests", "models",
                                                           "transformers", "matrix"))
    ap.add_argument("--only", default="", help="comma-separated architectures")
    a = ap.parse_args()
    tag = version_tag()
    os.makedirs(a.out, exist_ok=True)
    failed = []
    for arch, (script, extra) in ARCHS.items():
        if a.only and arch not in a.only.split(","):
            continue
        cells = [("torchscript", []), ("dynamo", [])]
        if arch in DECODERS:
            cells.append(("dynamo-static", ["--static"]))
        for name, more in cells:
            path = os.path.join(a.out, f"{arch}_{name}_{tag}.onnx")
            cmd = [sys.executable, os.path.join(HERE, script), path, "--tiny", "--skeleton",
                   "--exporter", name.split("-")[0]] + extra + more
            p = subprocess.run(cmd, capture_output=True, text=True)
            why = (p.stderr or p.stdout).strip()[-800:] if p.returncode != 0 else invalid(path)
            if why:
                failed.append(os.path.basename(path))
                print(f"FAIL {os.path.basename(path)}: {why}")
                if os.path.exists(path):
                    os.remove(path)
            else:
                size = os.path.getsize(path)
                print(f"ok   {os.path.basename(path)} ({size // 1024} KiB)")
    if failed:
        print(f"{len(failed)} exports failed: {', '.join(failed)}")
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
