#!/usr/bin/env python3
"""Transformers on the GPU: kiln's FP16 engines next to PyTorch eager and
torch.compile(mode="reduce-overhead") in FP16, in one run. Models (--models):
  bert      BERT-base (transformers)
  gpt2      GPT-2 (124M, logits for every position; transformers)
  vit       ViT-B/16 (transformers' ViTModel)
  llama     a Llama-architecture decoder (transformers' LlamaForCausalLM: hidden 768, 12 layers,
            12 heads, 4 key/value heads, SwiGLU 2048, vocabulary 32000; logits for every position)
  qwen2     a Qwen2-architecture decoder (transformers' Qwen2ForCausalLM: biased Q/K/V, hidden 768,
            12 layers, 12 heads, 2 key/value heads; scripts/export_qwen2.py)
  phi3      a Phi-3-architecture decoder (transformers' Phi3ForCausalLM: packed qkv_proj and
            gate_up_proj, hidden 768, 12 layers, 12 heads, 4 key/value heads; scripts/export_phi3.py)
  tv_vit    torchvision's ViT-B/16 (nn.MultiheadAttention); dynamo only: its TorchScript export
            fails in PyTorch, so the torchscript exporter is skipped for it (said on stdout)
  timm_vit  timm's ViT/DeiT (--timm-model, default vit_small_patch16_224: DeiT-S's shape)
Each is the model its scripts/export_<model>.py build()s (random weights, seed 0); the text
models take input_ids and attention_mask [batch, --seq], the ViTs pixel_values [batch, 3, 224, 224].

  bench/transformer_bench.py --kiln .deps/kiln --out OUT [--models bert,gpt2,vit,llama,qwen2,phi3,tv_vit,timm_vit]
                        [--parts export,speed,dynamic,floor,accuracy,precisions] [--batches 1,32]
                        [--seq 128] [--precisions fp32,fp16,int8,best] [--calib-batches N]
                        [--iters 300] [--exporters torchscript,dynamo] [--rounds N] [--duration S]
                        [--fp16-io] [--timm-model NAME] [--tiny] [--cpu] [--onnx-dir DIR]

Parts:
  export    <--onnx-dir>/<model>_<exporter>.onnx (default models/) from scripts/export_<model>.py
            (random weights, seed 0); an existing file is reused. speed, dynamic and floor use the
            first of --exporters that the model has (tv_vit: dynamo), accuracy each of them
  speed     per batch: a static-shape FP16 engine (`kiln build --fp16`, empty timing cache: the
            build time is reported), `kiln bench --use-cuda-graph --no-data-transfers` (median of
            at least --iters runs), the same with KILN_PDL=0 (no programmatic dependent launch),
            then PyTorch eager and torch.compile at the same shape; --rounds N repeats kiln (both
            ways) and torch.compile N times interleaved and reports the medians; --fp16-io also
            times an engine with float16 inputs and outputs, as PyTorch's FP16 model has them
  dynamic   one engine with a profile of batch 1-64 and sequence 1-512 (BERT) or 1-1024 (GPT-2,
            the Llama decoder; the ViTs: batch 1-64), run
            at each (batch, --seq) through `kiln bench --shapes`, against the static engines
  floor     per --floor-batches (32): the model's GEMM layers alone (bench/gemm_floor.py: the
            block's four GEMMs with their epilogues, twelve blocks, GPT-2's LM head; FP16 in and
            out), kiln's engine of it and torch.compile of it; after `speed`, the full model's
            torch.compile time over kiln's GEMM layers alone: the ratio kiln would reach if
            nothing else took time. tv_vit has ViT-B/16's GEMMs (gemm_floor's vit); llama and
            timm_vit have no geometry in gemm_floor.py and are skipped (said on stdout)
  accuracy  per exporter: the FP16 engine's outputs and PyTorch's FP16 outputs, each against
            ONNX Runtime's CPU float32 reference on the same input (batch 2, the second
            sequence padded), relative L2. With --cpu: kiln's CPU engine (float32) and PyTorch's
            float32 model on the CPU instead, no GPU needed (a check of the bench itself)
  precisions  per batch (token models): kiln's engines at each of --precisions (fp32, fp16, int8,
            best; INT8 calibrated on --calib-batches batches of random sequences), timed, each
            against a strict FP32 engine on held-out sequences (relative L2 of every output, and
            top-1 token agreement of a language model's logits), with the speedup over kiln's
            FP32 engine; PyTorch FP32 and FP16 eager and FP16 torch.compile beside them. --cpu:
            the cpu backend's fp32 and int8 engines, no GPU needed
--tiny: the export scripts' --tiny models (2 layers, hidden 128; files <model>_<exporter>_tiny.onnx),
so that export and accuracy --cpu run in a minute on a CPU:
  bench/transformer_bench.py --kiln build/kiln --out /tmp/tx --models llama,tv_vit,timm_vit \
      --parts export,accuracy --tiny --cpu --seq 16
Results: OUT/transformers.json, OUT/builds.log (every build's --verbose output: tactics and
their times), OUT/profiles.txt (`kiln bench --dump-profile` of each speed engine) and the table
on stdout; engines and scratch files go to --work. Run on the GPU machine through
bench/transformers.sh, which unpacks kiln's binaries first.
"""
import argparse
import json
import os
import statistics
import subprocess
import sys
import time

import numpy as np

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, os.path.join(ROOT, "scripts"))

MODELS = {"bert": "BERT-base", "gpt2": "GPT-2 (124M)", "vit": "ViT-B/16", "llama": "Llama decoder",
          "qwen2": "Qwen2 decoder", "phi3": "Phi-3 decoder",
          "tv_vit": "torchvision ViT-B/16", "timm_vit": "timm vit_small_patch16_224"}
VISION = ("vit", "tv_vit", "timm_vit")  # pixel_values [batch, 3, 224, 224] in, no sequence
# The dynamic engine's longest sequence: the model's positions (BERT's 512; GPT-2's and the Llama
# decoder's profile stops at 1024, the 1-1024).
MAX_SEQ = {"bert": 512, "gpt2": 1024, "llama": 1024, "qwen2": 1024, "phi3": 1024}
# The exporters a model has where not both, and why (the others are skipped, and said so).
EXPORTERS = {"tv_vit": (("dynamo",), "torchvision's ViT: its TorchScript export fails in PyTorch, dynamo only")}
# bench/gemm_floor.py's geometry with the same GEMMs (torchvision's ViT-B/16 has ViT-B/16's).
FLOOR_GEOMETRY = {"bert": "bert", "gpt2": "gpt2", "vit": "vit", "tv_vit": "vit"}


PARTS = ("export", "speed", "dynamic", "floor", "accuracy", "precisions")
# precisions: each engine's build flags (int8 and best calibrated on random token sequences).
PRECISION_FLAGS = {"fp32": [], "fp16": ["--fp16"], "int8": ["--int8"], "best": ["--best"]}


def log(msg):
    print(msg, flush=True)


def run(cmd, timeout=1200, log_path=None, env=None):
    """Runs a command (`env`: variables added to this process's); with `log_path`, appends its
    command line and output there."""
    t0 = time.time()
    p = subprocess.run(cmd, capture_output=True, text=True, timeout=timeout,
                       env={**os.environ, **env} if env else None)
    if log_path:
        with open(log_path, "a") as f:
            f.write(f"\n===== {' '.join(cmd)}\n{p.stdout}{p.stderr}")
    if p.returncode != 0:
        raise RuntimeError(f"{' '.join(cmd)}: exit {p.returncode}: {(p.stderr or p.stdout).strip()[-2000:]}")
    return p.stdout, time.time() - t0


def onnx_path(a, model, exporter):
    """The export of `model` (with --timm-model other than the default, named after it)."""
    name = model
    if model == "timm_vit" and a.timm_model != "vit_small_patch16_224":
        name = f"timm_{a.timm_model}"
    return os.path.join(a.onnx_dir, f"{name}_{exporter}{'_tiny' if a.tiny else ''}.onnx")


def exporters(a, model):
    """The ones of --exporters that `model` has."""
    return [e for e in a.exporters if e in EXPORTERS.get(model, (a.exporters,))[0]]


def shapes(model, batch, seq):
    if model in VISION:
        return f"pixel_values:{batch}x3x224x224"
    return f"input_ids:{batch}x{seq},attention_mask:{batch}x{seq}"


def inputs(model, batch, seq, vocab, rng, pad=False):
    if model in VISION:
        return {"pixel_values": rng.standard_normal((batch, 3, 224, 224)).astype(np.float32)}
    mask = np.ones((batch, seq), np.int64)
    if pad and batch > 1:
        mask[-1, seq - seq // 4:] = 0
    return {"input_ids": rng.integers(0, vocab, (batch, seq)).astype(np.int64), "attention_mask": mask}


def torch_model(a, model, cpu=False):
    """The same model the export made (its script's build(), seed 0; --tiny: the tiny one), FP16
    on the GPU (cpu: float32 on the CPU), and its vocabulary (0 for the ViTs)."""
    import importlib
    mod = importlib.import_module(f"export_{model}")
    kw = {"name": a.timm_model} if model == "timm_vit" else {}
    m = mod.build(tiny=a.tiny, **kw)[0]
    vocab = getattr(getattr(m, "config", None), "vocab_size", 0)
    return (m.float().eval() if cpu else m.half().cuda().eval()), vocab


def kiln_bench(kiln, engine, shape, iters, out_json, env=None, duration=None, cpu=False):
    run([kiln, "bench", "--engine", engine, "--shapes", shape]
        + ([] if cpu else ["--use-cuda-graph", "--no-data-transfers"])
        + ["--iterations", str(iters), "--warmup", "50", "--export-json", out_json]
        + (["--duration", str(duration)] if duration is not None else []), env=env)
    with open(out_json) as f:
        rec = json.load(f)
    return rec["latency_ms"]["median"]


def time_torch(fn, args, iters, duration=0.0):
    """Median (ms, CUDA events) of at least `iters` calls of fn(*args) and at least `duration`
    seconds of them, each call waited for, as `kiln bench` times an engine."""
    import torch
    times = []
    t0 = time.time()
    with torch.inference_mode():
        while len(times) < iters or time.time() - t0 < duration:
            a, b = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
            a.record()
            fn(*args)
            b.record()
            b.synchronize()
            times.append(a.elapsed_time(b))
    return statistics.median(times)


def torch_times(m, feeds, iters, duration=0.0, keep_compiled=False):
    """Medians (ms) of eager and torch.compile(mode="reduce-overhead") on `feeds` (CUDA events).
    With keep_compiled, also the compiled function and its arguments (for later rounds)."""
    import torch
    args = tuple(torch.from_numpy(v).cuda() for v in feeds.values())
    args = tuple(a.half() if a.is_floating_point() else a for a in args)
    out = {}
    for kind in ("eager", "compile"):
        torch._dynamo.reset()
        fn = m if kind == "eager" else torch.compile(m, mode="reduce-overhead")
        t0 = time.time()
        with torch.inference_mode():
            for _ in range(5):
                fn(*args)
            torch.cuda.synchronize()
        out[kind + "_first_s"] = time.time() - t0
        out[kind] = time_torch(fn, args, iters, duration)
        if kind == "compile" and keep_compiled:
            out["compiled"] = (fn, args)
    return out


def build(kiln, onnx, engine, shape_args, log_path=None, cpu=False, precision=False):
    """Builds an FP16 engine (cpu: a float32 one for the CPU backend; precision: as shape_args'
    flags say) of the model at `onnx` (with --verbose into `log_path`: the tactics and their
    times)."""
    cmd = [kiln, "build", "--onnx", onnx, "--save-engine", engine] + \
        (["--backend", "cpu"] if cpu else [] if precision else ["--fp16"])
    out, secs = run(cmd + shape_args + (["--verbose"] if log_path else []), log_path=log_path)
    return secs


def kernel_layers(kiln, engine):
    """`kiln inspect --json`'s count of the layers that launch a kernel, and all layers."""
    out, _ = run([kiln, "inspect", engine, "--json"])
    j = json.loads(out)
    return j.get("kernel_layers"), len(j["layers"])


def first_exporter(a, model, part):
    """The exporter `part` uses for `model` (the first of --exporters it has), or None (said)."""
    ex = exporters(a, model)
    if not ex:
        log(f"{MODELS[model]}: {part} skipped: none of --exporters {','.join(a.exporters)} "
            f"({EXPORTERS[model][1]})")
    return ex[0] if ex else None


def part_speed(a, model, res):
    import torch
    exporter = first_exporter(a, model, "speed")
    if exporter is None:
        return
    m, vocab = torch_model(a, model) if not a.no_torch else (None, 0)
    rng = np.random.default_rng(0)
    for batch in a.batches:
        shape = shapes(model, batch, a.seq)
        engine = os.path.join(a.work, f"{model}_b{batch}.kiln")
        secs = build(a.kiln, onnx_path(a, model, exporter), engine, ["--shapes", shape],
                     os.path.join(a.out, "builds.log"))
        kjson = os.path.join(a.work, f"bench_{model}_b{batch}.json")

        engine16 = None
        if a.fp16_io:
            # The same model with float16 inputs and outputs (--input-io-formats and
            # --output-io-formats fp16), as PyTorch's FP16 model takes and returns them.
            engine16 = os.path.join(a.work, f"{model}_b{batch}_fp16io.kiln")
            build(a.kiln, onnx_path(a, model, exporter), engine16,
                  ["--shapes", shape, "--input-io-formats", "fp16", "--output-io-formats", "fp16"],
                  os.path.join(a.out, "builds.log"))

        def kiln_round():
            # The engine as built, then without programmatic dependent launch (each kernel starts
            # after the last one ends), for the difference it makes.
            r = {"kiln_ms": kiln_bench(a.kiln, engine, shape, a.iters, kjson, duration=a.duration),
                 "kiln_no_pdl_ms": kiln_bench(a.kiln, engine, shape, a.iters, kjson,
                                              env={"KILN_PDL": "0"}, duration=a.duration)}
            if engine16:
                r["kiln_fp16io_ms"] = kiln_bench(a.kiln, engine16, shape, a.iters, kjson, duration=a.duration)
            return r

        rounds = [kiln_round()]
        run([a.kiln, "bench", "--engine", engine, "--shapes", shape, "--dump-profile", "--iterations", "20",
             "--no-data-transfers"], log_path=os.path.join(a.out, "profiles.txt"))
        t = (torch_times(m, inputs(model, batch, a.seq, vocab, rng), a.iters, a.duration or 0.0,
                         keep_compiled=a.rounds > 1) if not a.no_torch
             else {"eager": None, "compile": None, "compile_first_s": None})
        rounds[0]["compile_ms"] = t["compile"]
        for _ in range(1, a.rounds):
            # Further rounds, each kiln (PDL on, off) then torch.compile, so that the GPU's clock
            # and temperature drift alike over all three; medians of all rounds are reported.
            r = kiln_round()
            r["compile_ms"] = time_torch(*t["compiled"], a.iters, a.duration or 0.0) if not a.no_torch else None
            rounds.append(r)
        kiln_ms = statistics.median(r["kiln_ms"] for r in rounds)
        plain_ms = statistics.median(r["kiln_no_pdl_ms"] for r in rounds)
        io16_ms = statistics.median(r["kiln_fp16io_ms"] for r in rounds) if engine16 else None
        if not a.no_torch:
            t["compile"] = statistics.median(r["compile_ms"] for r in rounds)
        if len(rounds) > 1:
            log(f"  rounds: " + "; ".join(f"kiln {r['kiln_ms']:.3f} / no PDL {r['kiln_no_pdl_ms']:.3f}"
                                        + (f" / compile {r['compile_ms']:.3f}" if r["compile_ms"] else "")
                                        for r in rounds))
        t.pop("compiled", None)
        kl, layers = kernel_layers(a.kiln, engine)
        row = {"model": model, "exporter": exporter, "batch": batch, "seq": a.seq, "kiln_ms": kiln_ms,
               "kiln_no_pdl_ms": plain_ms,
               "kiln_fp16io_ms": io16_ms,
               "rounds": rounds, "duration_s": a.duration, "build_s": secs,
               "kernel_layers": kl, "layers": layers,
               "eager_ms": t["eager"], "compile_ms": t["compile"], "compile_first_s": t["compile_first_s"]}
        res["speed"].append(row)
        log(f"{MODELS[model]} ({exporter}) b{batch}: kiln {kiln_ms:.3f} ms ({plain_ms:.3f} with KILN_PDL=0; "
            + (f"{io16_ms:.3f} with float16 inputs and outputs; " if io16_ms else "") +
            f"built in {secs:.1f} s, {kl} of {layers} "
            f"layers launch kernels)" + ("" if a.no_torch else
            f", eager {t['eager']:.3f} ms, torch.compile {t['compile']:.3f} ms: "
            f"{t['compile'] / kiln_ms:.2f}x compile"
            + (f", {t['compile'] / io16_ms:.2f}x with float16 inputs and outputs" if io16_ms else "")))
    del m
    torch.cuda.empty_cache()


def part_dynamic(a, model, res):
    exporter = first_exporter(a, model, "dynamic")
    if exporter is None:
        return
    engine = os.path.join(a.work, f"{model}_dynamic.kiln")
    if model in VISION:
        lo, opt, hi = shapes(model, 1, 0), shapes(model, 32, 0), shapes(model, 64, 0)
    else:
        lo, opt, hi = shapes(model, 1, 1), shapes(model, 32, a.seq), shapes(model, 64, MAX_SEQ[model])
    secs = build(a.kiln, onnx_path(a, model, exporter), engine,
                 ["--min-shapes", lo, "--opt-shapes", opt, "--max-shapes", hi],
                 os.path.join(a.out, "builds.log"))
    for batch in a.batches:
        shape = shapes(model, batch, a.seq)
        ms = kiln_bench(a.kiln, engine, shape, a.iters, os.path.join(a.work, f"bench_{model}_dyn_b{batch}.json"))
        static = next((r["kiln_ms"] for r in res["speed"] if r["model"] == model and r["batch"] == batch), None)
        res["dynamic"].append({"model": model, "exporter": exporter, "batch": batch, "seq": a.seq, "dynamic_ms": ms,
                               "static_ms": static, "build_s": secs})
        log(f"{MODELS[model]} dynamic engine at b{batch}: {ms:.3f} ms" +
            (f" ({ms / static:.2f}x the static engine's {static:.3f} ms)" if static else ""))


def part_floor(a, model, res):
    """The model's GEMM layers alone (bench/gemm_floor.py), kiln and torch.compile, per batch."""
    import torch
    import gemm_floor
    geo = FLOOR_GEOMETRY.get(model)
    if geo is None or a.tiny:
        log(f"{MODELS[model]}: floor skipped: " + ("its GEMMs are full-size, the model --tiny" if a.tiny else
                                                   "bench/gemm_floor.py has no geometry for its GEMMs"))
        return
    for batch in a.floor_batches:
        path = os.path.join(a.work, f"floor_{geo}_b{batch}.onnx")
        gemm_floor.export(geo, batch, a.seq, path)
        engine = os.path.join(a.work, f"floor_{geo}_b{batch}.kiln")
        shape = gemm_floor.shape_arg(geo, batch, a.seq)
        _, secs = run([a.kiln, "build", "--onnx", path, "--save-engine", engine, "--verbose"]
                      + gemm_floor.BUILD_ARGS, log_path=os.path.join(a.out, "builds.log"))
        kiln_ms = kiln_bench(a.kiln, engine, shape, a.iters,
                             os.path.join(a.work, f"bench_floor_{geo}_b{batch}.json"), duration=a.duration)
        t = {"compile": None, "eager": None}
        if not a.no_torch:
            m = gemm_floor.module(geo)
            t = torch_times(m, gemm_floor.inputs(geo, batch, a.seq), a.iters, a.duration or 0.0)
            del m
            torch.cuda.empty_cache()
        full = next((r for r in res["speed"] if r["model"] == model and r["batch"] == batch), None)
        gf = gemm_floor.gflop(geo, batch, a.seq)
        row = {"model": model, "geometry": geo, "batch": batch, "seq": a.seq, "gflop": gf, "kiln_ms": kiln_ms,
               "compile_ms": t["compile"], "eager_ms": t["eager"], "build_s": secs,
               "model_kiln_ms": full and full["kiln_ms"], "model_compile_ms": full and full["compile_ms"]}
        res["floor"].append(row)
        log(f"{MODELS[model]} b{batch}, GEMM layers alone ({gf:.0f} GFLOP): kiln {kiln_ms:.3f} ms "
            f"({gf / kiln_ms:.0f} TFLOP/s)"
            + (f", torch.compile {t['compile']:.3f} ms, eager {t['eager']:.3f} ms" if t["compile"] else "")
            + (f"; the full model: kiln {full['kiln_ms']:.3f} ms ({kiln_ms / full['kiln_ms']:.0%} of it "
               f"in the GEMM layers' time), torch.compile {full['compile_ms']:.3f} ms, which is "
               f"{full['compile_ms'] / kiln_ms:.2f}x kiln's GEMM layers alone"
               if full and full["compile_ms"] else ""))


def rel_l2(x, ref):
    x, ref = np.asarray(x, np.float64), np.asarray(ref, np.float64)
    return float(np.linalg.norm(x - ref) / max(np.linalg.norm(ref), 1e-30))


def part_accuracy(a, model, res):
    import onnxruntime as ort
    import torch
    ex = exporters(a, model)
    if not ex:
        first_exporter(a, model, "accuracy")
        return
    prec = "fp32" if a.cpu else "fp16"
    m, vocab = torch_model(a, model, cpu=a.cpu)
    feeds = inputs(model, 2, a.seq, vocab, np.random.default_rng(1), pad=True)
    with torch.inference_mode():
        args = tuple(torch.from_numpy(v) for v in feeds.values())
        if not a.cpu:
            args = tuple(x.cuda().half() if x.is_floating_point() else x.cuda() for x in args)
        tout = m(*args)
        tout = [t.float().cpu().numpy() for t in (tout if isinstance(tout, tuple) else (tout,))]
    for exporter in ex:
        path = onnx_path(a, model, exporter)
        so = ort.SessionOptions()
        so.intra_op_num_threads = os.cpu_count() or 4
        sess = ort.InferenceSession(path, so, providers=["CPUExecutionProvider"])
        refs = sess.run(None, feeds)
        engine = os.path.join(a.work, f"{model}_{exporter}_acc.kiln")
        build(a.kiln, path, engine, ["--shapes", shapes(model, 2, a.seq)], cpu=a.cpu)
        cmd = [a.kiln, "run", "--engine", engine, "--save-outputs", os.path.join(a.work, "acc_out")]
        for name, v in feeds.items():
            p = os.path.join(a.work, f"acc_{name}.npy")
            np.save(p, v)
            cmd += ["--input", f"{name}={p}"]
        run(cmd)
        kl, layers = kernel_layers(a.kiln, engine)
        log(f"{MODELS[model]} {exporter}: " + (f"{kl} of {layers} layers launch kernels" if kl is not None
                                               else f"{layers} layers"))
        if len(refs) != len(tout):
            raise RuntimeError(f"{exporter}: {len(refs)} outputs in the ONNX model, {len(tout)} from PyTorch")
        for o, ref, t in zip(sess.get_outputs(), refs, tout):
            got = np.load(os.path.join(a.work, "acc_out", o.name + ".npy"))
            if got.shape != ref.shape or t.shape != ref.shape:
                raise RuntimeError(f"{exporter} {o.name}: kiln {got.shape}, PyTorch {t.shape}, "
                                   f"ONNX Runtime {ref.shape}")
            row = {"model": model, "exporter": exporter, "output": o.name, "shape": list(ref.shape),
                   "kernel_layers": kl, "precision": prec,
                   f"kiln_{prec}": rel_l2(got, ref), f"torch_{prec}": rel_l2(t, ref)}
            res["accuracy"].append(row)
            log(f"{MODELS[model]} {exporter} {o.name} {list(ref.shape)}: kiln {prec.upper()} "
                f"{row[f'kiln_{prec}']:.2e}, PyTorch {prec.upper()} {row[f'torch_{prec}']:.2e} "
                f"(relative L2 against ONNX Runtime CPU float32)")
    del m
    if not a.cpu:
        torch.cuda.empty_cache()


def vocab_of(onnx):
    """The rows of the embedding table input_ids index (the first dim of a Gather's data whose
    indices are input_ids), from the ONNX file without its weights' data."""
    import onnx as ox
    m = ox.load(onnx, load_external_data=False)
    dims = {t.name: list(t.dims) for t in m.graph.initializer}
    tables = [dims[n.input[0]] for n in m.graph.node
              if n.op_type == "Gather" and len(n.input) == 2 and n.input[0] in dims and len(dims[n.input[0]]) == 2]
    for n in m.graph.node:
        if n.op_type == "Gather" and len(n.input) == 2 and n.input[1] == "input_ids" and n.input[0] in dims:
            return dims[n.input[0]][0]
    if tables:  # the ids reach it through a Reshape (GPT-2): the largest table (positions have fewer rows)
        return max(t[0] for t in tables)
    raise RuntimeError(f"{onnx}: no Gather from an embedding table")


def kiln_outputs(a, engine, feeds, tag):
    """`kiln run`'s outputs of `engine` on `feeds`, by name."""
    out = os.path.join(a.work, f"out_{tag}")
    cmd = [a.kiln, "run", "--engine", engine, "--save-outputs", out]
    for name, v in feeds.items():
        path = os.path.join(a.work, f"in_{tag}_{name}.npy")
        np.save(path, v)
        cmd += ["--input", f"{name}={path}"]
    run(cmd)
    return {f[:-4]: np.load(os.path.join(out, f)) for f in sorted(os.listdir(out)) if f.endswith(".npy")}


def part_precisions(a, model, res):
    """Per batch: kiln's engines at each of --precisions, timed, each checked against a strict
    FP32 engine (--no-tf32) on held-out random sequences (relative L2 of every output; for a
    language model's logits also how often the top-1 token agrees); INT8 calibrated on
    --calib-batches batches of random token sequences (.npy per input, `kiln build --calib`,
    the cache kept in --work); PyTorch FP32 and FP16 eager and FP16 torch.compile beside them."""
    if model in VISION:
        log(f"{MODELS[model]}: precisions skipped: token models only (calibration on sequences)")
        return
    exporter = first_exporter(a, model, "precisions")
    if exporter is None:
        return
    path = onnx_path(a, model, exporter)
    vocab = vocab_of(path)
    flags = dict(PRECISION_FLAGS)
    for p in a.precisions:
        if a.cpu and p in ("fp16", "best"):
            log(f"{MODELS[model]}: {p} skipped: the cpu backend has no FP16 kernels")
    precisions = [p for p in a.precisions if not (a.cpu and p in ("fp16", "best"))]
    backend = ["--backend", "cpu"] if a.cpu else []
    for batch in a.batches:
        shape = shapes(model, batch, a.seq)
        calib = os.path.join(a.work, f"calib_{model}_b{batch}")
        rng = np.random.default_rng(2)
        for i in range(a.calib_batches):
            for name, v in inputs(model, batch, a.seq, vocab, rng).items():
                os.makedirs(os.path.join(calib, name), exist_ok=True)
                np.save(os.path.join(calib, name, f"{i:03d}.npy"), v)
        calib_flags = ["--calib"] + [f"{n}={os.path.join(calib, n)}" for n in ("input_ids", "attention_mask")] + \
            ["--calib-cache", os.path.join(a.work, f"calib_{model}_b{batch}.cache")]
        held_out = inputs(model, batch, a.seq, vocab, np.random.default_rng(3))
        ref_engine = os.path.join(a.work, f"{model}_b{batch}_strict.kiln")
        run([a.kiln, "build", "--onnx", path, "--save-engine", ref_engine, "--shapes", shape, "--no-tf32"]
            + backend)
        ref = kiln_outputs(a, ref_engine, held_out, f"{model}_b{batch}_strict")
        rows = []
        for p in precisions:
            engine = os.path.join(a.work, f"{model}_b{batch}_{p}.kiln")
            secs = build(a.kiln, path, engine, ["--shapes", shape] + flags[p]
                         + (calib_flags if p in ("int8", "best") else []), os.path.join(a.out, "builds.log"),
                         cpu=a.cpu, precision=True)
            ms = kiln_bench(a.kiln, engine, shape, a.iters, os.path.join(a.work, f"bench_{model}_{p}.json"),
                            duration=a.duration, cpu=a.cpu)
            got = kiln_outputs(a, engine, held_out, f"{model}_b{batch}_{p}")
            row = {"model": model, "exporter": exporter, "batch": batch, "seq": a.seq, "precision": p,
                   "kiln_ms": ms, "build_s": secs,
                   "rel_l2": {n: rel_l2(got[n], ref[n]) for n in ref}}
            if "logits" in ref:
                row["top1_agreement"] = float(np.mean(got["logits"].argmax(-1) == ref["logits"].argmax(-1)))
            rows.append(row)
        base = next((r["kiln_ms"] for r in rows if r["precision"] == "fp32"), None)
        for r in rows:
            r["vs_kiln_fp32"] = base / r["kiln_ms"] if base else None
            res["precisions"].append(r)
            log(f"{MODELS[model]} b{batch} {r['precision']}: kiln {r['kiln_ms']:.3f} ms"
                + (f" ({r['vs_kiln_fp32']:.2f}x kiln FP32)" if base else "")
                + f", built in {r['build_s']:.1f} s; against strict FP32: "
                + ", ".join(f"{n} rel L2 {e:.2e}" for n, e in r["rel_l2"].items())
                + (f", top-1 agreement {r['top1_agreement']:.4f}" if "top1_agreement" in r else ""))
        if not a.no_torch and not a.cpu:
            res["precisions_torch"].append(dict(model=model, batch=batch, **torch_fp32_fp16(a, model, batch, vocab)))


def torch_fp32_fp16(a, model, batch, vocab):
    """PyTorch on the same random sequences: FP32 eager, FP16 eager and FP16 torch.compile (ms)."""
    import torch
    m16, _ = torch_model(a, model)
    feeds = inputs(model, batch, a.seq, vocab, np.random.default_rng(3))
    t = torch_times(m16, feeds, a.iters, a.duration or 0.0)
    m32 = m16.float()
    args = tuple(torch.from_numpy(v).cuda() for v in feeds.values())
    fp32 = time_torch(m32, args, a.iters, a.duration or 0.0)
    del m16, m32
    torch.cuda.empty_cache()
    log(f"{MODELS[model]} b{batch} PyTorch: FP32 eager {fp32:.3f} ms, FP16 eager {t['eager']:.3f} ms, "
        f"FP16 torch.compile {t['compile']:.3f} ms")
    return {"eager32_ms": fp32, "eager16_ms": t["eager"], "compile16_ms": t["compile"]}


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--kiln", required=True)
    ap.add_argument("--out", required=True)
    ap.add_argument("--work", default="/tmp/kiln-transformers-work", help="engines and scratch files")
    ap.add_argument("--models", default="bert,gpt2,vit",
                    help="of " + ",".join(MODELS) + " (the module docstring says what each is)")
    ap.add_argument("--parts", default="export,speed,dynamic,accuracy")
    ap.add_argument("--batches", default="1,32")
    ap.add_argument("--seq", type=int, default=128)
    ap.add_argument("--iters", type=int, default=300)
    ap.add_argument("--exporters", default="torchscript,dynamo")
    ap.add_argument("--duration", type=float, default=None,
                    help="speed: time kiln and PyTorch alike for at least this many seconds each "
                         "(and at least --iters runs); default: kiln bench's own 2 s, PyTorch --iters runs")
    ap.add_argument("--rounds", type=int, default=1,
                    help="speed: interleaved rounds of kiln (PDL on, off) and torch.compile; medians of all")
    ap.add_argument("--floor-batches", default="32", help="floor: at these batches")
    ap.add_argument("--fp16-io", action="store_true",
                    help="speed: also an engine with float16 inputs and outputs (--input-io-formats "
                         "and --output-io-formats fp16), as PyTorch's FP16 model has them")
    ap.add_argument("--no-torch", action="store_true",
                    help="speed: kiln's engines alone, without PyTorch eager and torch.compile")
    ap.add_argument("--timm-model", default="vit_small_patch16_224",
                    help="timm_vit: the timm ViT/DeiT (scripts/export_timm_vit.py --model), e.g. "
                         "vit_base_patch16_224, deit_base_patch16_224")
    ap.add_argument("--tiny", action="store_true",
                    help="the export scripts' --tiny models (2 layers, hidden 128), files *_tiny.onnx: "
                         "a quick check of the bench itself")
    ap.add_argument("--cpu", action="store_true",
                    help="accuracy: kiln's CPU engine and PyTorch in float32 on the CPU (no GPU needed)")
    ap.add_argument("--onnx-dir", default=os.path.join(ROOT, "models"), help="where the exports go")
    ap.add_argument("--precisions", default="fp32,fp16,int8,best",
                    help="precisions: the engines to build (" + ",".join(PRECISION_FLAGS) + ")")
    ap.add_argument("--calib-batches", type=int, default=8,
                    help="precisions: batches of random token sequences INT8 is calibrated on")
    a = ap.parse_args()
    a.batches = [int(b) for b in a.batches.split(",")]
    a.floor_batches = [int(b) for b in a.floor_batches.split(",")]
    a.exporters = a.exporters.split(",")
    a.precisions = a.precisions.split(",")
    parts = a.parts.split(",")
    models = a.models.split(",")
    for what, got, known in (("model", models, MODELS), ("part", parts, PARTS),
                             ("precision", a.precisions, PRECISION_FLAGS),
                             ("exporter", a.exporters, ("torchscript", "dynamo"))):
        bad = [x for x in got if x not in known]
        if bad:
            ap.error(f"unknown {what} {','.join(bad)} (known: {','.join(known)})")
    MODELS["timm_vit"] = f"timm {a.timm_model}"
    if a.tiny:
        for k in MODELS:
            MODELS[k] += " (tiny)"
    import torch
    gpu_parts = [p for p in parts if p in ("speed", "dynamic", "floor")
                 or (p in ("accuracy", "precisions") and not a.cpu)]
    if gpu_parts and not torch.cuda.is_available():
        ap.error(f"{','.join(gpu_parts)} need a GPU, and PyTorch sees none (accuracy runs on the CPU with --cpu)")
    os.makedirs(a.out, exist_ok=True)
    os.makedirs(a.work, exist_ok=True)
    res = {"gpu": torch.cuda.get_device_name(0) if torch.cuda.is_available() else None,
           "torch": torch.__version__,
           "cudnn_torch": torch.backends.cudnn.version(), "speed": [], "dynamic": [], "accuracy": [], "floor": [],
           "precisions": [], "precisions_torch": [],
           "skipped": [], "command": " ".join(sys.argv)}
    for model in models:
        try:
            for exporter in a.exporters:
                if exporter not in exporters(a, model):
                    log(f"{MODELS[model]}: {exporter} exporter skipped: {EXPORTERS[model][1]}")
                    res["skipped"].append({"model": model, "exporter": exporter, "why": EXPORTERS[model][1]})
            if "export" in parts:
                for exporter in exporters(a, model):
                    path = onnx_path(a, model, exporter)
                    if not os.path.exists(path):
                        cmd = [sys.executable, os.path.join(ROOT, "scripts", f"export_{model}.py"), path,
                               "--exporter", exporter] + (["--tiny"] if a.tiny else [])
                        if model == "timm_vit":
                            cmd += ["--model", a.timm_model]
                        out, secs = run(cmd)
                        log(out.strip().splitlines()[-1][:160] + f" ({secs:.0f} s)")
            if "speed" in parts:
                part_speed(a, model, res)
            if "dynamic" in parts:
                part_dynamic(a, model, res)
            if "floor" in parts:
                part_floor(a, model, res)
            if "accuracy" in parts:
                part_accuracy(a, model, res)
            if "precisions" in parts:
                part_precisions(a, model, res)
        except Exception as e:  # noqa: BLE001 - one model's failure must not hide the others
            log(f"{MODELS[model]}: FAILED: {e}")
            res.setdefault("failures", []).append(f"{model}: {e}")
        with open(os.path.join(a.out, "transformers.json"), "w") as f:
            json.dump(res, f, indent=1)
    io16 = any(r.get("kiln_fp16io_ms") for r in res["speed"])
    if res["speed"]:
        log("\n| model | batch | kiln |" + (" kiln, FP16 I/O |" if io16 else "") +
            " build | eager | torch.compile | kiln / compile |")
        log("|---|---|---|" + ("---|" if io16 else "") + "---|---|---|---|")
    for r in res["speed"]:
        torch_cols = ("- | - | - |" if r["compile_ms"] is None else
                      f"{r['eager_ms']:.3f} ms | {r['compile_ms']:.3f} ms | {r['compile_ms'] / r['kiln_ms']:.2f}x |")
        io_col = (f" {r['kiln_fp16io_ms']:.3f} ms |" if r.get("kiln_fp16io_ms") else " - |") if io16 else ""
        log(f"| {MODELS[r['model']]} | {r['batch']} | {r['kiln_ms']:.3f} ms |{io_col} {r['build_s']:.1f} s | "
            + torch_cols)
    if res["precisions"]:
        log("\n| model | batch | precision | kiln | x kiln FP32 | rel L2 vs strict FP32 | top-1 agreement | build |")
        log("|---|---|---|---|---|---|---|---|")
        for r in res["precisions"]:
            worst = max(r["rel_l2"].values())
            top1 = f"{r['top1_agreement']:.4f}" if "top1_agreement" in r else "-"
            speed = f"{r['vs_kiln_fp32']:.2f}x" if r["vs_kiln_fp32"] else "-"
            log(f"| {MODELS[r['model']]} | {r['batch']} | {r['precision']} | {r['kiln_ms']:.3f} ms | {speed} | "
                f"{worst:.2e} | {top1} | {r['build_s']:.1f} s |")
    return 1 if res.get("failures") else 0


if __name__ == "__main__":
    sys.exit(main())
