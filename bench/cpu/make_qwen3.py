#!/usr/bin/env python3
"""bench/cpu/make_qwen3.py OUT_DIR [LAYERS] — a random bf16 checkpoint of Qwen3-0.6B's shape
(hidden 1024, 16/8 heads of 128, ffn 3072, vocab 151936, tied, q/k norms; 28 layers unless
LAYERS says) for CPU benchmarks, with the Python standard library alone (no numpy, no torch).

Values are drawn once into a 4 MiB pool of bf16 (normal, std 1/sqrt(fan-in) as a trained
model's are near) and each tensor is that pool read from a different offset: every byte of
the file is its own memory when loaded, which is all a speed measurement needs, and the
1.2 GB are written in seconds. Norm weights are 1 + small noise."""
import json, os, random, struct, sys

H, HEADS, KV, HD, F, V = 1024, 16, 8, 128, 3072, 151936
POOL = 1 << 21  # bf16 values in the pool


def bf16_bytes(values):
    raw = struct.pack("<%df" % len(values), *values)
    # the upper half of each float32, round to nearest even
    out = bytearray(len(values) * 2)
    for i in range(len(values)):
        u = int.from_bytes(raw[4 * i:4 * i + 4], "little")
        u += 0x7FFF + ((u >> 16) & 1)
        out[2 * i:2 * i + 2] = ((u >> 16) & 0xFFFF).to_bytes(2, "little")
    return bytes(out)


def main():
    out = sys.argv[1]
    layers = int(sys.argv[2]) if len(sys.argv) > 2 else 28
    rng = random.Random(1234)
    pool = bf16_bytes([rng.gauss(0.0, 1.0) for _ in range(POOL)])
    scaled = {}  # fan-in -> pool scaled by 1/sqrt(fan-in): exponent shift only, exact enough

    def pool_for(fan_in):
        if fan_in not in scaled:
            s = fan_in ** -0.5
            vals = struct.unpack("<%dH" % POOL, pool)
            f = [struct.unpack("<f", struct.pack("<I", v << 16))[0] * s for v in vals]
            scaled[fan_in] = bf16_bytes(f)
        return scaled[fan_in]

    norm = bf16_bytes([1.0 + 0.1 * rng.gauss(0.0, 1.0) for _ in range(H)])
    qk_norm = bf16_bytes([1.0 + 0.1 * rng.gauss(0.0, 1.0) for _ in range(HD)])
    tensors = [("model.embed_tokens.weight", [V, H], H), ("model.norm.weight", [H], 0)]
    for l in range(layers):
        p = "model.layers.%d." % l
        tensors += [(p + "input_layernorm.weight", [H], 0),
                    (p + "post_attention_layernorm.weight", [H], 0),
                    (p + "self_attn.q_proj.weight", [HEADS * HD, H], H),
                    (p + "self_attn.k_proj.weight", [KV * HD, H], H),
                    (p + "self_attn.v_proj.weight", [KV * HD, H], H),
                    (p + "self_attn.o_proj.weight", [H, HEADS * HD], HEADS * HD),
                    (p + "self_attn.q_norm.weight", [HD], -1),
                    (p + "self_attn.k_norm.weight", [HD], -1),
                    (p + "mlp.gate_proj.weight", [F, H], H),
                    (p + "mlp.up_proj.weight", [F, H], H),
                    (p + "mlp.down_proj.weight", [H, F], F)]
    header, off = {}, 0
    for name, shape, _ in tensors:
        n = 1
        for d in shape: n *= d
        header[name] = {"dtype": "BF16", "shape": shape, "data_offsets": [off, off + 2 * n]}
        off += 2 * n
    hb = json.dumps(header, separators=(",", ":")).encode()
    hb += b" " * (-len(hb) % 8)
    os.makedirs(out, exist_ok=True)
    with open(os.path.join(out, "model.safetensors"), "wb") as f:
        f.write(struct.pack("<Q", len(hb)) + hb)
        start = 0
        for name, shape, fan_in in tensors:
            if fan_in == 0: f.write(norm); continue
            if fan_in < 0: f.write(qk_norm); continue
            n = 2 * shape[0] * shape[1]
            src = pool_for(fan_in)
            while n > 0:  # the pool from a new odd offset each time (even byte, whole values)
                start = (start + 2 * 40503) % len(src)
                chunk = src[start:start + min(n, len(src) - start)]
                f.write(chunk)
                n -= len(chunk)
    cfg = {"architectures": ["Qwen3ForCausalLM"], "model_type": "qwen3", "attention_bias": False,
           "bos_token_id": 151643, "eos_token_id": 151645, "head_dim": HD, "hidden_act": "silu",
           "hidden_size": H, "intermediate_size": F, "max_position_embeddings": 40960,
           "num_attention_heads": HEADS, "num_hidden_layers": layers, "num_key_value_heads": KV,
           "rms_norm_eps": 1e-6, "rope_theta": 1000000.0, "tie_word_embeddings": True,
           "torch_dtype": "bfloat16", "vocab_size": V}
    with open(os.path.join(out, "config.json"), "w") as f:
        json.dump(cfg, f, indent=1)
    print("%s: %d layers, %.2f GB" % (out, layers, off / 1e9))


if __name__ == "__main__":
    main()
