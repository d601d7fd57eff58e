#!/usr/bin/env python3
"""Makes a random Llama checkpoint (Hugging Face layout, bf16 safetensors, sharded) with
transformers, on the GPU when there is one, for atlas's GPU tests and benchmarks.

  python3 tools/make_checkpoint.py --shape 8b   --out /tmp/llama8b   # Llama-3.1-8B shape
  python3 tools/make_checkpoint.py --shape test --out /tmp/llama-test # hidden 2048, 16 layers, GQA

Weights are drawn at random (seeded): linear weights normal with std 1/sqrt(fan-in) so that
activations keep their scale through the layers and logits are far from uniform; norm
weights near 1. No tokenizer is written (atlas bench and the tests feed token ids)."""
import argparse
import json
import math
import os
import time

import torch
from transformers import LlamaConfig, LlamaForCausalLM

SHAPES = {
    # meta-llama/Llama-3.1-8B's config.json
    "8b": dict(hidden_size=4096, intermediate_size=14336, num_hidden_layers=32,
               num_attention_heads=32, num_key_value_heads=8, vocab_size=128256,
               max_position_embeddings=131072, rope_theta=500000.0, rms_norm_eps=1e-5,
               tie_word_embeddings=False,
               rope_scaling={"rope_type": "llama3", "factor": 8.0, "low_freq_factor": 1.0,
                             "high_freq_factor": 4.0, "original_max_position_embeddings": 8192}),
    # the larger test shape: GQA 16/4 heads of 128, untied, a 32k vocabulary
    "test": dict(hidden_size=2048, intermediate_size=5632, num_hidden_layers=16,
                 num_attention_heads=16, num_key_value_heads=4, vocab_size=32000,
                 max_position_embeddings=8192, rope_theta=500000.0, rms_norm_eps=1e-5,
                 tie_word_embeddings=False),
}


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--shape", choices=sorted(SHAPES), required=True)
    ap.add_argument("--out", required=True)
    ap.add_argument("--seed", type=int, default=1234)
    ap.add_argument("--shard", default="5GB", help="max shard size for save_pretrained")
    ap.add_argument("--layers", type=int, help="num_hidden_layers instead of the shape's (a "
                    "shape's matrices at a few layers: quick to make, for timing kernels)")
    a = ap.parse_args()

    t0 = time.time()
    shape = dict(SHAPES[a.shape])
    if a.layers:
        shape["num_hidden_layers"] = a.layers
    cfg = LlamaConfig(bos_token_id=128000, eos_token_id=128001, **shape)
    dev = "cuda" if torch.cuda.is_available() else "cpu"
    torch.manual_seed(a.seed)
    with torch.device(dev):
        model = LlamaForCausalLM(cfg).to(torch.bfloat16)
    g = torch.Generator(device=dev).manual_seed(a.seed)
    with torch.no_grad():
        for name, p in model.named_parameters():
            if p.dim() == 1:  # norms: near 1
                p.copy_(1.0 + 0.1 * torch.randn(p.shape, generator=g, device=dev, dtype=torch.float32))
            else:
                fan_in = p.shape[1]
                std = 1.0 if "embed_tokens" in name else 1.0 / math.sqrt(fan_in)
                p.copy_(torch.randn(p.shape, generator=g, device=dev, dtype=torch.float32) * std)
    made = time.time()
    os.makedirs(a.out, exist_ok=True)
    model.save_pretrained(a.out, max_shard_size=a.shard)
    n = sum(p.numel() for p in model.parameters())
    print(json.dumps({"shape": a.shape, "out": a.out, "params": n, "device": dev,
                      "make_s": round(made - t0, 1), "save_s": round(time.time() - made, 1)}))


if __name__ == "__main__":
    main()
