#!/usr/bin/env python3
"""Transformer model tests: BERT, GPT-2 and ViT (transformers), torchvision's ViT (dynamo only: its
TorchScript export fails in PyTorch), timm's ViT, timm's EVA-02 (rotary embedding on the patch
tokens in interleaved pairs; dynamo only, like torchvision's), a Llama-architecture decoder
with grouped-query attention and a GPT-NeoX one (Q, K and V interleaved per head in one
projection, a partial rotary), each exported the ways users export them (TorchScript opset 17 and
dynamo opset 18), at 2 layers and hidden size 128 with random weights; and the attention matrix
(tests/models/transformers/matrix: scripts/export_transformer_matrix.py): the Llama, Qwen2,
Phi-3, ViT, DeiT and BERT architectures x TorchScript, dynamo (and, for the decoders, dynamo
without dynamic shapes) x the transformers/PyTorch versions that exported them (in the file name:
llama_dynamo_tf5.17_pt2.11.onnx), so that attention reaches one form whatever the exporter; and
decoders exported with their KV cache by optimum (kvcache_*: scripts/export_kv_cache.py), run at
prefill and at decode steps after a past.

The graphs live in tests/models/transformers/ as skeletons (scripts/transformer_export.py
--tiny --skeleton: the exporters' own graphs without their large weights); each run fills the
weights back in with seeded random values. No PyTorch is needed; with --export-python PY (a
Python with torch and transformers, repeatable) the matrix is also exported afresh by that
Python's versions and those cells run too. For every model:
  - kiln's CPU backend, one engine with dynamic batch and sequence at -O2, against ONNX Runtime at
    two shapes (batch 1 with 7 tokens; batch 3 with 16 tokens and padding): relative L2 < 1e-4
    (an export with static shapes: its own shape, once without and once with padding);
  - with a CUDA build (no GPU needed): the cuda build step (kiln_lower_check, FP16, a batch
    1-8 x sequence 1-64 profile) must give every layer a GPU tactic and, for every model of
    FUSED_FORMS, put each attention on kiln.MultiHeadAttention with a fused tactic (mha.flash or
    mha.cudnn) and run at most 8 kernel-launching layers per transformer block (counted from one
    attention layer to the next).
Ends with the matrix: kernel layers a block per architecture, exporter and versions.
Exit status 1 on any failure.
"""
import argparse
import glob
import os
import subprocess
import sys
import tempfile

import numpy as np

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, os.path.join(HERE, "..", "..", "scripts"))
import transformer_export as tx  # noqa: E402

MAX_KERNEL_LAYERS_PER_BLOCK = 8
# The exports held to that budget of kernel layers a block (their attention reaches
# kiln.MultiHeadAttention). The Llama-architecture decoder is 8 a block: RMSNorm, the packed Q/K/V GEMM, the attention
# rotating its Q and K heads itself (mha.flash: fuse_attention_rotary), the output projection
# with the residual, RMSNorm, the packed gate and up GEMM, silu(gate) * up reading both halves in
# place, the down projection.
FUSED_FORMS = ("bert", "gpt2", "vit", "timm_vit", "timm_eva", "tv_vit", "llama", "qwen2", "phi3", "deit",
               "gptneox")
FUSED_ATTENTION_TACTICS = ("mha.flash", "mha.cudnn")
VOCAB = 1000  # the --tiny models' vocabulary


def rel_l2(a, b):
    a, b = a.astype(np.float64), b.astype(np.float64)
    return float(np.linalg.norm(a - b) / max(np.linalg.norm(b), 1e-30))


def is_vision(model):
    return "vit" in model or model.startswith(("deit", "timm_eva"))


def static_shape(onnx_path):
    """The first input's dims when the export fixed them (no dynamic axes), else None."""
    import onnx
    m = onnx.load(onnx_path, load_external_data=False)
    inits = {t.name for t in m.graph.initializer}
    first = next(i for i in m.graph.input if i.name not in inits)
    dims = first.type.tensor_type.shape.dim
    if all(d.HasField("dim_value") for d in dims):
        return tuple(d.dim_value for d in dims)
    return None


def feeds_for(model, batch, seq, rng, pad=True):
    if is_vision(model):
        return {"pixel_values": rng.standard_normal((batch, 3, 224, 224)).astype(np.float32)}
    mask = np.ones((batch, seq), np.int64)
    if batch > 1 and pad:
        mask[-1, seq - 3:] = 0  # the last sequence is padded
    return {"input_ids": rng.integers(0, VOCAB, (batch, seq)).astype(np.int64), "attention_mask": mask}


def kv_inputs(onnx_path):
    """A decoder exported with its KV cache (inputs past_key_values.*): its inputs as (name,
    dims), else None."""
    import onnx
    m = onnx.load(onnx_path, load_external_data=False)
    inits = {t.name for t in m.graph.initializer}
    ins = [(i.name, [d.dim_param or d.dim_value for d in i.type.tensor_type.shape.dim])
           for i in m.graph.input if i.name not in inits]
    return ins if any(n.startswith("past_key_values") for n, _ in ins) else None


def kv_feeds(ins, batch, seq, past, rng):
    """Inputs of a KV-cache decoder: seq new tokens after a past of `past` (0: prefill); the
    last sequence's first two positions masked where there are several."""
    feeds = {}
    for name, dims in ins:
        if name == "input_ids":
            feeds[name] = rng.integers(0, VOCAB, (batch, seq)).astype(np.int64)
        elif name == "attention_mask":
            mask = np.ones((batch, past + seq), np.int64)
            if batch > 1 and past + seq > 2:
                mask[-1, :2] = 0
            feeds[name] = mask
        elif name == "position_ids":
            feeds[name] = np.tile(np.arange(past, past + seq), (batch, 1)).astype(np.int64)
        else:
            shape = [batch if d == "batch_size" else past if d == "past_sequence_length" else d for d in dims]
            feeds[name] = rng.standard_normal(shape).astype(np.float32)
    return feeds


def kv_shapes(ins, points):
    """--min/opt/max-shapes of a KV-cache decoder at (batch, seq, past) points."""
    rng = np.random.default_rng(0)
    return [",".join(f"{k}:" + "x".join(map(str, v.shape)) for k, v in kv_feeds(ins, *p, rng).items())
            for p in points]


def shapes_arg(model, lo, opt, hi):
    if is_vision(model):
        return [f"pixel_values:{b}x3x224x224" for b, _ in (lo, opt, hi)]
    return [f"input_ids:{b}x{s},attention_mask:{b}x{s}" for b, s in (lo, opt, hi)]


def run(cmd):
    p = subprocess.run(cmd, capture_output=True, text=True, timeout=900)
    if p.returncode != 0:
        raise RuntimeError(f"{' '.join(cmd)} failed ({p.returncode}): {(p.stderr or p.stdout).strip()}")
    return p.stdout


def run_against_ort(kiln, sess, engine, feeds, out_dir):
    """Runs the engine on `feeds` (saved next to out_dir): the worst relative L2 of its outputs
    against ONNX Runtime's."""
    cmd = [kiln, "run", "--engine", engine, "--save-outputs", out_dir]
    for name, value in feeds.items():
        path = f"{out_dir}_{''.join(c if c.isalnum() else '_' for c in name)}.npy"
        np.save(path, value)
        cmd += ["--input", f"{name}={path}"]
    run(cmd)
    worst = 0.0
    for o, ref in zip(sess.get_outputs(), sess.run(None, feeds)):
        got = np.load(os.path.join(out_dir, "".join(c if c.isalnum() or c in "._-" else "_" for c in o.name) + ".npy"))
        if got.shape != ref.shape:
            raise RuntimeError(f"{o.name}: shape {got.shape} vs ONNX Runtime {ref.shape}")
        worst = max(worst, rel_l2(got, ref))
    return worst


def check_cpu(kiln, model, onnx_path, tmp, rng):
    import onnxruntime as ort
    so = ort.SessionOptions()
    so.log_severity_level = 3  # errors only (dynamo's unused initializers are warned about)
    sess = ort.InferenceSession(onnx_path, so, providers=["CPUExecutionProvider"])
    engine = os.path.join(tmp, model + ".kiln")
    kv = kv_inputs(onnx_path)
    fixed = None if kv else static_shape(onnx_path)
    if kv:
        # Prefill (no past), then decode steps: one token, and four, after a past.
        lo, opt, hi = kv_shapes(kv, [(1, 1, 0), (2, 8, 16), (4, 16, 32)])
        run([kiln, "build", "--onnx", onnx_path, "--save-engine", engine, "--backend", "cpu",
             "--min-shapes", lo, "--opt-shapes", opt, "--max-shapes", hi])
        worst = 0.0
        for batch, seq, past in [(2, 7, 0), (3, 1, 5), (1, 4, 9)]:
            worst = max(worst, run_against_ort(kiln, sess, engine, kv_feeds(kv, batch, seq, past, rng),
                                               os.path.join(tmp, f"{model}_{batch}_{seq}_{past}")))
        if worst > 1e-4:
            raise RuntimeError(f"relative L2 {worst:.3g} against ONNX Runtime (limit 1e-4)")
        return worst
    if fixed:
        b, s = fixed[0], fixed[1] if len(fixed) > 1 else 1
        lo = opt = hi = (b, s)
        runs = [(b, s, False), (b, s, True)]
    else:
        lo, opt, hi = (1, 1), (2, 16), (4, 32)
        runs = [(1, 7, True), (3, 16, True)]
    lo, opt, hi = shapes_arg(model, lo, opt, hi)
    run([kiln, "build", "--onnx", onnx_path, "--save-engine", engine, "--backend", "cpu",
         "--min-shapes", lo, "--opt-shapes", opt, "--max-shapes", hi])
    worst = 0.0
    for batch, seq, pad in runs:
        worst = max(worst, run_against_ort(kiln, sess, engine, feeds_for(model, batch, seq, rng, pad),
                                           os.path.join(tmp, f"{model}_{batch}_{seq}_{int(pad)}")))
    if worst > 1e-4:
        raise RuntimeError(f"relative L2 {worst:.3g} against ONNX Runtime (limit 1e-4)")
    return worst


def check_gpu_layers(lower_check, model, onnx_path):
    """The kernel layers a block (None where the model is not held to the budget) and a note."""
    kv = kv_inputs(onnx_path)
    fixed = None if kv else static_shape(onnx_path)
    if kv:  # decoding: one token at a time after up to 128 (a batch of 1-8; prefill up to 16)
        lo, opt, hi = kv_shapes(kv, [(1, 1, 1), (4, 1, 64), (8, 16, 128)])
        prof = ["--min-shapes", lo, "--opt-shapes", opt, "--max-shapes", hi]
    elif fixed:
        shape = shapes_arg(model, fixed[:2], fixed[:2], fixed[:2])[0]
        prof = ["--shapes", shape]
    else:
        lo, opt, hi = shapes_arg(model, (1, 1), (4, 16), (8, 64))
        prof = ["--min-shapes", lo, "--opt-shapes", opt, "--max-shapes", hi]
    out = run([lower_check, "--fp16", "--print"] + prof + [onnx_path])
    if not out.strip().splitlines()[-1].startswith("ok"):
        raise RuntimeError("the cuda build step failed: " + out.strip().splitlines()[-1])
    layers = [line.split() for line in out.splitlines() if line.startswith("  ")]
    if not model.startswith(FUSED_FORMS):
        # A KV cache's decoder: its attention must read the cache in place on a fused tactic
        # (kv_head_major); the kernel layers are reported, not held to the budget (the cache's
        # Concat(past, new) is two copies a block, its float32 I/O two conversions).
        kernels = sum(1 for l in layers if l[0] == "kernel")
        if kv:
            bad = [l for l in layers if l[1] == "kiln.Attention" or
                   (l[1] == "kiln.MultiHeadAttention" and l[2] not in FUSED_ATTENTION_TACTICS)]
            if bad:
                raise RuntimeError(f"the KV cache's attention on {bad[0][1]} {bad[0][2]}, not a fused tactic")
        attn = [i for i, l in enumerate(layers) if l[1] in ("kiln.MultiHeadAttention", "kiln.Attention")]
        block = (f", {sum(1 for l in layers[attn[0]:attn[1]] if l[0] == 'kernel')} a block, attention on "
                 f"{layers[attn[0]][2]}" if len(attn) >= 2 else "")
        return None, (f"{kernels} kernel layers in all{block} (not held to "
                      f"{MAX_KERNEL_LAYERS_PER_BLOCK} a block)")
    generic = [l for l in layers if l[1] == "kiln.Attention"]
    if generic:
        raise RuntimeError(f"{len(generic)} attention layers left as generic kiln.Attention "
                           f"({generic[0][2]}), not kiln.MultiHeadAttention")
    attn = [i for i, l in enumerate(layers) if l[1] == "kiln.MultiHeadAttention"]
    if len(attn) < 2:
        raise RuntimeError(f"{len(attn)} attention layers folded into kiln.MultiHeadAttention (want 2)")
    unfused = sorted({layers[i][2] for i in attn if layers[i][2] not in FUSED_ATTENTION_TACTICS})
    if unfused:
        raise RuntimeError(f"attention on {', '.join(unfused)}, not a fused tactic "
                           f"({', '.join(FUSED_ATTENTION_TACTICS)})")
    block = sum(1 for l in layers[attn[0]:attn[1]] if l[0] == "kernel")
    if block > MAX_KERNEL_LAYERS_PER_BLOCK:
        raise RuntimeError(f"{block} kernel layers per block (at most {MAX_KERNEL_LAYERS_PER_BLOCK})")
    return block, f"{block} kernel layers per block, attention on {layers[attn[0]][2]}"


def matrix_cell(model):
    """(architecture, exporter, versions) of a matrix file's name, else None."""
    parts = model.split("_")
    if len(parts) != 4 or not parts[2].startswith("tf") or not parts[3].startswith("pt"):
        return None
    return parts[0], parts[1], f"transformers {parts[2][2:]}, torch {parts[3][2:]}"


def print_matrix(cells):
    """Kernel layers a block per architecture (rows) and exporter + versions (columns)."""
    if not cells:
        return
    cols = sorted({(exp, ver) for (_, exp, ver) in cells})
    rows = sorted({arch for (arch, _, _) in cells})
    print("\nattention matrix (kernel layers a block in the cuda build step; FAIL: see above):")
    print("| architecture | " + " | ".join(f"{e}, {v}" for e, v in cols) + " |")
    print("|---" * (len(cols) + 1) + "|")
    for r in rows:
        print(f"| {r} | " + " | ".join(cells.get((r, e, v), "-") for e, v in cols) + " |")


def export_matrix(python, out):
    """Exports the matrix with `python`'s torch and transformers into `out`; the files made."""
    script = os.path.join(HERE, "..", "..", "scripts", "export_transformer_matrix.py")
    p = subprocess.run([python, script, out], capture_output=True, text=True, timeout=3600)
    print(p.stdout.strip())
    if p.returncode != 0:
        print(f"transformer tests: some exports by {python} failed (above)")
    return sorted(glob.glob(os.path.join(out, "*.onnx")))


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--kiln", default="build/kiln")
    ap.add_argument("--lower-check", default=None,
                    help="kiln_lower_check (default: next to --kiln, when built with CUDA)")
    ap.add_argument("--export-python", action="append", default=[],
                    help="a Python with torch and transformers: export the matrix with its "
                         "versions too (repeatable)")
    ap.add_argument("--filter", default="", help="only models whose name contains this")
    args = ap.parse_args()
    lower_check = args.lower_check or os.path.join(os.path.dirname(args.kiln), "tests", "cuda",
                                                   "kiln_lower_check")
    if not os.path.exists(lower_check):
        print("transformer tests: no kiln_lower_check (a build without CUDA): GPU layer counts skipped")
        lower_check = None
    if not args.export_python:
        print("transformer tests: the committed exports only (--export-python PY exports the "
              "matrix afresh with PY's torch and transformers)")
    failures = 0
    cells = {}
    rng = np.random.default_rng(0)
    with tempfile.TemporaryDirectory() as tmp:
        skeletons = sorted(glob.glob(os.path.join(HERE, "transformers", "*.onnx")) +
                           glob.glob(os.path.join(HERE, "transformers", "matrix", "*.onnx")))
        for i, py in enumerate(args.export_python):
            fresh = export_matrix(py, os.path.join(tmp, f"fresh{i}"))
            skeletons += [f for f in fresh
                          if os.path.basename(f) not in {os.path.basename(s) for s in skeletons}]
        for skeleton in skeletons:
            model = os.path.splitext(os.path.basename(skeleton))[0]
            if args.filter and args.filter not in model:
                continue
            path = os.path.join(tmp, model + ".onnx")
            tx.materialize(skeleton, path, seed=int(rng.integers(1 << 30)))
            cell = matrix_cell(model)
            try:
                err = check_cpu(args.kiln, model, path, tmp, rng)
                msg = f"ok   {model}: CPU engine vs ONNX Runtime rel L2 {err:.2e}"
                if lower_check:
                    block, note = check_gpu_layers(lower_check, model, path)
                    msg += f"; {note} on cuda"
                    if cell:
                        cells[cell] = str(block)
                elif cell:
                    cells[cell] = "ok (CPU)"
                print(msg)
            except Exception as e:  # noqa: BLE001 (ONNX Runtime's errors too)
                print(f"FAIL {model}: {' '.join(str(e).split())[:600]}")
                if cell:
                    cells[cell] = "FAIL"
                failures += 1
    print_matrix(cells)
    print("transformer tests: " + ("all pass" if failures == 0 else f"{failures} failed"))
    return 1 if failures else 0


if __name__ == "__main__":
    sys.exit(main())
