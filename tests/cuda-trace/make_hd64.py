#!/usr/bin/env python3
"""tests/cuda-trace/make_hd64.py DIR — a 2-layer Llama checkpoint of head_dim 64 (the tiny test
models have 8 and 16), so that the trace reaches the decode attention kernels of real head
sizes (warp-per-key and cluster). Weights are a fixed bf16 pattern: the trace never reads them."""
import json, os, struct, sys

d = sys.argv[1]
os.makedirs(d, exist_ok=True)
H, K, hd, hidden, inter, vocab, layers = 2, 1, 64, 128, 256, 64, 2
cfg = {"architectures": ["LlamaForCausalLM"], "model_type": "llama", "hidden_size": hidden,
       "intermediate_size": inter, "num_attention_heads": H, "num_key_value_heads": K,
       "num_hidden_layers": layers, "vocab_size": vocab, "max_position_embeddings": 2048,
       "rms_norm_eps": 1e-5, "rope_theta": 10000.0, "tie_word_embeddings": True,
       "torch_dtype": "bfloat16", "bos_token_id": 1, "eos_token_id": 2}
json.dump(cfg, open(os.path.join(d, "config.json"), "w"), indent=1)
shapes = {"model.embed_tokens.weight": [vocab, hidden], "model.norm.weight": [hidden]}
for l in range(layers):
    p = f"model.layers.{l}."
    shapes.update({p + "input_layernorm.weight": [hidden],
                   p + "self_attn.q_proj.weight": [H * hd, hidden],
                   p + "self_attn.k_proj.weight": [K * hd, hidden],
                   p + "self_attn.v_proj.weight": [K * hd, hidden],
                   p + "self_attn.o_proj.weight": [hidden, H * hd],
                   p + "post_attention_layernorm.weight": [hidden],
                   p + "mlp.gate_proj.weight": [inter, hidden],
                   p + "mlp.up_proj.weight": [inter, hidden],
                   p + "mlp.down_proj.weight": [hidden, inter]})
header, off = {}, 0
for name, shape in shapes.items():
    n = 2
    for s in shape:
        n *= s
    header[name] = {"dtype": "BF16", "shape": shape, "data_offsets": [off, off + n]}
    off += n
h = json.dumps(header).encode()
h += b" " * (-len(h) % 8)
with open(os.path.join(d, "model.safetensors"), "wb") as f:
    f.write(struct.pack("<Q", len(h)) + h + b"\x00\x3c" * (off // 2))
