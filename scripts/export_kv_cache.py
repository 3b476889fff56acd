#!/usr/bin/env python3
"""Export decoders with their KV cache as optimum exports them for deployment (`optimum-cli
export onnx --task text-generation-with-past`): tiny GPT-2 and Llama-architecture models (2
layers, hidden 64, vocabulary 1000, random weights), inputs input_ids, attention_mask,
(position_ids,) past_key_values.N.key/value, outputs logits and present.N.key/value, as skeletons
(scripts/transformer_export.py --skeleton) named

  kvcache_<arch>_optimum<optimum-onnx version>_tf<transformers version>_pt<torch version>.onnx

in OUT (default tests/models/transformers). tests/models/run_transformer_tests.py runs them at
prefill (no past) and decode (one token after a past) against ONNX Runtime. With --bench, the
Llama-architecture decoder bench/kv_decode.py times instead (BENCH_LLAMA: hidden 768, 12 layers,
12 heads with 4 key/value heads, SwiGLU 2048, vocabulary 32000), as tests/models/
transformers/bench/kvcache_llama_bench_<versions>.onnx. Needs torch, transformers < 4.58 and optimum-onnx (pip
install "transformers<4.58" optimum-onnx).

  python3 scripts/export_kv_cache.py [--bench] [OUT]
"""
import os
import sys
import tempfile

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, HERE)
import transformer_export as tx  # noqa: E402


def tiny_models():
    from transformers import GPT2Config, GPT2LMHeadModel, LlamaConfig, LlamaForCausalLM
    return {
        "gpt2": lambda: GPT2LMHeadModel(GPT2Config(n_layer=2, n_embd=64, n_head=4, vocab_size=1000,
                                                   n_positions=128)),
        "llama": lambda: LlamaForCausalLM(LlamaConfig(num_hidden_layers=2, hidden_size=64,
                                                      intermediate_size=128, num_attention_heads=4,
                                                      num_key_value_heads=2, vocab_size=1000,
                                                      max_position_embeddings=128)),
    }


# The decoder bench/kv_decode.py times (its PyTorch side builds the same configuration).
BENCH_LLAMA = dict(num_hidden_layers=12, hidden_size=768, intermediate_size=2048, num_attention_heads=12,
                   num_key_value_heads=4, vocab_size=32000, max_position_embeddings=1024)


def main():
    args = sys.argv[1:]
    bench = "--bench" in args
    args = [a for a in args if a != "--bench"]
    out = args[0] if args else os.path.join(HERE, "..", "tests", "models", "transformers")
    if bench and not args:
        out = os.path.join(HERE, "..", "tests", "models", "transformers", "bench")
    import torch
    import transformers
    from importlib.metadata import version
    from optimum.exporters.onnx import main_export
    tag = (f"optimum{version('optimum-onnx')}_tf{'.'.join(transformers.__version__.split('.')[:2])}"
           f"_pt{'.'.join(torch.__version__.split('+')[0].split('.')[:2])}")
    os.makedirs(out, exist_ok=True)
    models = tiny_models()
    if bench:
        from transformers import LlamaConfig, LlamaForCausalLM
        models = {"llama_bench": lambda: LlamaForCausalLM(LlamaConfig(**BENCH_LLAMA))}
    for arch, build in models.items():
        torch.manual_seed(0)
        with tempfile.TemporaryDirectory() as tmp:
            build().eval().save_pretrained(os.path.join(tmp, "model"))
            main_export(os.path.join(tmp, "model"), output=os.path.join(tmp, "onnx"),
                        task="text-generation-with-past")
            path = os.path.join(out, f"kvcache_{arch}_{tag}.onnx")
            os.replace(os.path.join(tmp, "onnx", "model.onnx"), path)
            tx.skeletonize(path)
            print(f"wrote {path} ({os.path.getsize(path)} bytes)")
    return 0


if __name__ == "__main__":
    sys.exit(main())
