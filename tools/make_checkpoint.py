#!/usr/bin/env python3
"""Makes a random checkpoint (Hugging Face layout, bf16 safetensors, sharded) for atlas's GPU
tests and benchmarks.

  python3 tools/make_checkpoint.py --shape 8b   --out /tmp/llama8b   # Llama-3.1-8B shape
  python3 tools/make_checkpoint.py --shape test --out /tmp/llama-test # hidden 2048, 16 layers, GQA
  python3 tools/make_checkpoint.py --shape qwen3-30b-a3b --layers 12 --out /dev/shm/q30
  python3 tools/make_checkpoint.py --shape llama3.3-70b --quant gptq --out /dev/shm/l70

"8b" and "test" are Llama models made by transformers, on the GPU when there is one.  Every
other shape is a published model of tools/conformance/shapes.py (BIG, at its published depth
here unless --layers says otherwise; gemma3-12b is added here) written tensor by tensor in the
Hub's layout, without transformers: Phi-4's fused qkv_proj / gate_up_proj, Gemma 3's four
norms a layer, Qwen3-MoE's and Mixtral's one tensor an expert, gpt-oss's stacked experts in
MXFP4 (random e2m1 codes under a scale that gives the conformance draw's spread) or bf16.
--quant gptq writes a dense family's decoder linears as AutoGPTQ's 4-bit layout (symmetric,
groups of 128: random codes under one scale that gives the same spread), the rest bf16: a
checkpoint too large to make in bf16 first (Llama-3.3-70B's 141 GB) written at its 4-bit size.
That is fast enough for full-size MoE models (the data is drawn on the GPU and several shards
are written at once) and needs only the standard library with --fill zeros, which writes
sparse files: the headers are real (`atlas info` checks every tensor), the weights zero.

Weights are drawn at random (seeded): linear weights normal with std 1/sqrt(fan-in) so that
activations keep their scale through the layers and logits are far from uniform; norm
weights near 1 (Gemma 3's near 0: it applies 1 + w), MoE routers wider (ROUTER_STD) so that
tokens spread over the experts. No tokenizer is written (atlas bench and the tests feed token
ids)."""
import argparse
import concurrent.futures
import json
import math
import os
import sys
import time

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "conformance"))
import gpt_oss  # noqa: E402
import shapes  # noqa: E402

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

# google/gemma-3-12b-it's text model: gemma3-27b's entry at 12B's widths (16 / 8 heads of 256)
# meta-llama/Llama-3.3-70B-Instruct: llama3.1-8b's entry at 70B's widths (64 / 8 heads of 128)
EXTRA = {"gemma3-12b": dict(shapes.BIG["gemma3-27b"], hidden_size=3840, intermediate_size=15360,
                            num_attention_heads=16, num_key_value_heads=8, head_dim=256,
                            query_pre_attn_scalar=256),
         "llama3.3-70b": dict(shapes.BIG["llama3.1-8b"], hidden_size=8192, intermediate_size=28672,
                              num_attention_heads=64, num_key_value_heads=8)}

# The published models' depths (shapes.py keeps a few layers for the conformance references).
PUBLISHED_LAYERS = {"llama3.1-8b": 32, "llama3.2-1b": 16, "llama2-7b": 32, "mistral-7b-v0.3": 32,
                    "qwen2.5-0.5b": 24, "qwen2.5-7b": 28, "qwen3-0.6b": 28, "qwen3-8b": 36,
                    "phi-4": 40, "phi-4-mini": 32, "gemma3-1b": 26, "gemma3-12b": 48,
                    "gemma3-27b": 62, "qwen3-30b-a3b": 48, "mixtral-8x7b": 32,
                    "gpt-oss-20b": 24, "gpt-oss-20b-bf16": 24, "mistral-7b-v0.1-sw": 32,
                    "llama3.3-70b": 80}

# --quant gptq: AutoGPTQ's 4-bit layout, symmetric (zero 8, stored minus one in every nibble of
# qzeros), groups of GPTQ_GROUP columns in order (g_idx = column / group, desc_act off); the
# families whose decoder linears are all named *_proj (Mixtral's experts and gpt-oss are not).
GPTQ_GROUP = 128
GPTQ_CONFIG = {"quant_method": "gptq", "bits": 4, "group_size": GPTQ_GROUP, "desc_act": False,
               "sym": True, "checkpoint_format": "gptq"}
GPTQ_FAMILIES = (shapes.LLAMA, shapes.MISTRAL, shapes.QWEN2, shapes.QWEN3, shapes.PHI3,
                 shapes.GEMMA3)
# the rms of q - 8 over uniform codes q in 0..15: sqrt(344 / 16)
GPTQ_CODE_RMS = math.sqrt(21.5)

# A router's weights drawn with this std times 1/sqrt(hidden), as tools/conformance/make.py
# draws them: logits spread over ~8, so that tokens go to different experts.
ROUTER_STD = 8.0


def direct_shapes():
    return {**{k: v for k, v in shapes.BIG.items() if k in PUBLISHED_LAYERS}, **EXTRA}


def config_of(name, layers, quant=None):
    """config.json for a direct shape at a depth (its published one when layers is None)."""
    spec = direct_shapes()[name]
    arch = spec["architectures"][0]
    cfg = dict(shapes.config_json(spec), torch_dtype="bfloat16", model_type=shapes.MODEL_TYPE[arch])
    cfg["num_hidden_layers"] = layers or PUBLISHED_LAYERS[name]
    if arch == shapes.GPT_OSS:  # gpt-oss alternates a sliding and a full layer
        cfg["layer_types"] = [("sliding_attention", "full_attention")[i % 2]
                              for i in range(cfg["num_hidden_layers"])]
        if spec.get("experts") == "mxfp4":
            cfg["quantization_config"] = gpt_oss.MXFP4_CONFIG
    if arch == shapes.GEMMA3 and "layer_types" in cfg:
        del cfg["layer_types"]  # sliding_window_pattern says it at any depth
    if quant == "gptq":
        if arch not in GPTQ_FAMILIES or cfg.get("num_experts"):
            raise SystemExit(f"make_checkpoint: --quant gptq: {name} is not a dense family "
                             f"whose linears are all *_proj")
        cfg["quantization_config"] = dict(GPTQ_CONFIG)
    return cfg


def lin(name, rows, cols, std_scale=1.0):
    return (name, (rows, cols), "BF16", ("normal", std_scale / math.sqrt(cols), 0.0))


def norm(name, n, base):
    return (name, (n,), "BF16", ("normal", 0.1, base))


def is_moe_layer(cfg, layer):
    n_exp = cfg.get("num_experts") or cfg.get("num_local_experts") or 0
    step = cfg.get("decoder_sparse_step") or 1
    return n_exp > 0 and layer not in (cfg.get("mlp_only_layers") or []) and (layer + 1) % step == 0


def layer_tensors(cfg, layer):
    """One decoder layer's tensors of a Llama-like family: (name, shape, dtype, init)."""
    arch = cfg["architectures"][0]
    d, f = cfg["hidden_size"], cfg["intermediate_size"]
    H, K = cfg["num_attention_heads"], cfg["num_key_value_heads"]
    hd = cfg.get("head_dim") or d // H
    p = f"model.layers.{layer}."
    base = 0.0 if arch == shapes.GEMMA3 else 1.0
    out = [norm(p + "input_layernorm.weight", d, base),
           norm(p + "post_attention_layernorm.weight", d, base)]
    if arch == shapes.GEMMA3:
        out += [norm(p + "pre_feedforward_layernorm.weight", d, base),
                norm(p + "post_feedforward_layernorm.weight", d, base)]
    if arch == shapes.PHI3:
        out.append(lin(p + "self_attn.qkv_proj.weight", (H + 2 * K) * hd, d))
    else:
        out += [lin(p + f"self_attn.{n}_proj.weight", r * hd, d) for n, r in (("q", H), ("k", K), ("v", K))]
    if arch == shapes.QWEN2:
        out += [(p + f"self_attn.{n}_proj.bias", (r * hd,), "BF16", ("normal", 0.1, 0.0))
                for n, r in (("q", H), ("k", K), ("v", K))]
    out.append(lin(p + "self_attn.o_proj.weight", d, H * hd))
    if arch in (shapes.QWEN3, shapes.QWEN3_MOE, shapes.GEMMA3):
        out += [norm(p + "self_attn.q_norm.weight", hd, base), norm(p + "self_attn.k_norm.weight", hd, base)]
    if arch == shapes.MIXTRAL:
        out.append(lin(p + "block_sparse_moe.gate.weight", cfg["num_local_experts"], d, ROUTER_STD))
        for e in range(cfg["num_local_experts"]):
            q = f"{p}block_sparse_moe.experts.{e}."
            out += [lin(q + "w1.weight", f, d), lin(q + "w3.weight", f, d), lin(q + "w2.weight", d, f)]
    elif is_moe_layer(cfg, layer):
        fe = cfg["moe_intermediate_size"]
        out.append(lin(p + "mlp.gate.weight", cfg["num_experts"], d, ROUTER_STD))
        for e in range(cfg["num_experts"]):
            q = f"{p}mlp.experts.{e}."
            out += [lin(q + "gate_proj.weight", fe, d), lin(q + "up_proj.weight", fe, d),
                    lin(q + "down_proj.weight", d, fe)]
    elif arch == shapes.PHI3:
        out += [lin(p + "mlp.gate_up_proj.weight", 2 * f, d), lin(p + "mlp.down_proj.weight", d, f)]
    else:
        out += [lin(p + f"mlp.{n}_proj.weight", f, d) for n in ("gate", "up")]
        out.append(lin(p + "mlp.down_proj.weight", d, f))
    return out


def mxfp4_scale(std):
    """The e8m0 scale byte under which uniform random e2m1 codes (rms 2.93) have about std."""
    rms = math.sqrt(sum(v * v for v in gpt_oss.FP4_VALUES) / 16)
    return 127 + round(math.log2(std / rms))


def oss_tensors(cfg):
    """gpt-oss in the Hub's layout (tools/conformance/gpt_oss.py), its experts as MXFP4
    blocks [E, out, in/32, 16] and scales [E, out, in/32] when the config says mxfp4."""
    mx = cfg.get("quantization_config", {}).get("quant_method") == "mxfp4"
    out = []
    for name, shp, std, base in gpt_oss.layout(cfg, ROUTER_STD):
        if mx and name.endswith(("experts.gate_up_proj", "experts.down_proj")):
            E, n_in, n_out = shp
            out += [(name + "_blocks", (E, n_out, n_in // 32, 16), "U8", ("bytes", 0, 255)),
                    (name + "_scales", (E, n_out, n_in // 32), "U8", ("const", mxfp4_scale(std)))]
        else:
            out.append((name, shp, "BF16", ("normal", std, base)))
    return out


def gptq_tensors(t):
    """A bf16 linear (lin's tuple) as AutoGPTQ's 4-bit tensors of the same spread."""
    name, (rows, cols), _, (_, std, _) = t
    if cols % GPTQ_GROUP or rows % 8:
        raise SystemExit(f"make_checkpoint: --quant gptq: {name} [{rows}, {cols}] is not "
                         f"whole groups of {GPTQ_GROUP} by 8 rows")
    m, g = name[:-len(".weight")], cols // GPTQ_GROUP
    return [(m + ".qweight", (cols // 8, rows), "I32", ("bytes", 0, 255)),
            (m + ".qzeros", (g, rows // 8), "I32", ("const", 0x77777777)),
            (m + ".scales", (g, rows), "F16", ("const", std / GPTQ_CODE_RMS)),
            (m + ".g_idx", (cols,), "I32", ("group", GPTQ_GROUP))]


def tensors_of(cfg):
    if cfg["architectures"][0] == shapes.GPT_OSS:
        return oss_tensors(cfg)
    gptq = cfg.get("quantization_config", {}).get("quant_method") == "gptq"
    d, V = cfg["hidden_size"], cfg["vocab_size"]
    tied = cfg.get("tie_word_embeddings")
    out = [("model.embed_tokens.weight", (V, d), "BF16",
            ("normal", 1.0 / math.sqrt(d) if tied else 1.0, 0.0))]
    for layer in range(cfg["num_hidden_layers"]):
        for t in layer_tensors(cfg, layer):
            out += gptq_tensors(t) if gptq and t[0].endswith("_proj.weight") else [t]
    out.append(norm("model.norm.weight", d, 0.0 if cfg["architectures"][0] == shapes.GEMMA3 else 1.0))
    if not tied:
        out.append(lin("lm_head.weight", V, d))
    return out


ELEM = {"BF16": 2, "F16": 2, "I32": 4, "U8": 1}


def nbytes(t):
    return math.prod(t[1]) * ELEM[t[2]]


def shard(tensors, limit):
    """Tensors in files of at most limit bytes (one larger tensor alone), each file's tensors
    by element size, largest first, so that every tensor starts aligned to its element size."""
    files, cur, size = [], [], 0
    for t in tensors:
        if cur and size + nbytes(t) > limit:
            files.append(cur)
            cur, size = [], 0
        cur.append(t)
        size += nbytes(t)
    if cur:
        files.append(cur)
    return [sorted(f, key=lambda t: -ELEM[t[2]]) for f in files]


def header(items):
    h, off = {"__metadata__": {"format": "pt"}}, 0
    for name, shp, dt, _ in items:
        h[name] = {"dtype": dt, "shape": list(shp), "data_offsets": [off, off + nbytes((name, shp, dt))]}
        off += nbytes((name, shp, dt))
    raw = json.dumps(h, separators=(",", ":")).encode()
    return raw + b" " * (-len(raw) % 8), off


def write_file(path, items, fill, seed, dev):
    raw, size = header(items)
    with open(path, "wb") as f:
        f.write(len(raw).to_bytes(8, "little") + raw)
        if fill == "zeros":
            f.truncate(8 + len(raw) + size)
            return size
        import torch
        g = torch.Generator(device=dev).manual_seed(seed)
        chunk = 1 << 27  # elements drawn at once: bounds host and device memory per thread
        kinds = {"BF16": torch.bfloat16, "F16": torch.float16, "I32": torch.int32, "U8": torch.uint8}
        for _, shp, dt, init in items:
            n = math.prod(shp)
            for a in range(0, n, chunk):
                m = min(chunk, n - a)
                if init[0] == "normal":
                    t = torch.empty(m, dtype=kinds[dt], device=dev).normal_(init[2], init[1], generator=g)
                elif init[0] == "bytes":  # every byte of the elements drawn
                    t = torch.randint(init[1], init[2] + 1, (m * ELEM[dt],), dtype=torch.uint8,
                                      device=dev, generator=g)
                elif init[0] == "group":  # g_idx: the element's index / group
                    t = torch.arange(a, a + m, dtype=torch.int64, device=dev).div(
                        init[1], rounding_mode="floor").to(torch.int32)
                else:
                    t = torch.full((m,), init[1], dtype=kinds[dt], device=dev)
                f.write(t.view(torch.uint8).cpu().numpy())
    return size


def make_direct(a):
    """A direct shape written file by file, several at once."""
    t0 = time.time()
    cfg = config_of(a.shape, a.layers, a.quant)
    asked = cfg["num_hidden_layers"]
    while a.max_bytes and cfg["num_hidden_layers"] > 1 and \
            sum(map(nbytes, tensors_of(cfg))) > a.max_bytes:
        cfg = config_of(a.shape, cfg["num_hidden_layers"] - 1, a.quant)
    tensors = tensors_of(cfg)
    files = shard(tensors, parse_size(a.shard))
    names = [f"model-{i + 1:05d}-of-{len(files):05d}.safetensors" for i in range(len(files))]
    os.makedirs(a.out, exist_ok=True)
    dev = "cpu"
    if a.fill == "random":
        import torch
        dev = "cuda" if torch.cuda.is_available() else "cpu"
    with concurrent.futures.ThreadPoolExecutor(max_workers=min(a.threads, len(files))) as ex:
        jobs = [ex.submit(write_file, os.path.join(a.out, n), items, a.fill, a.seed + i, dev)
                for i, (n, items) in enumerate(zip(names, files))]
        total = sum(j.result() for j in jobs)
    index = {"metadata": {"total_size": total},
             "weight_map": {t[0]: n for n, items in zip(names, files) for t in items}}
    with open(os.path.join(a.out, "model.safetensors.index.json"), "w") as f:
        json.dump(index, f, indent=1)
    with open(os.path.join(a.out, "config.json"), "w") as f:
        json.dump(cfg, f, indent=2)
    spec = direct_shapes()[a.shape]
    with open(os.path.join(a.out, "generation_config.json"), "w") as f:
        json.dump({k: spec[k] for k in ("bos_token_id", "eos_token_id") if k in spec}, f)
    s = time.time() - t0
    print(json.dumps({"shape": a.shape, "out": a.out, "layers": cfg["num_hidden_layers"],
                      "layers_asked": asked, "published_layers": PUBLISHED_LAYERS[a.shape],
                      "bytes": total, "files": len(files), "fill": a.fill, "device": dev,
                      "seconds": round(s, 1), "gb_per_s": round(total / 1e9 / s, 2)}))


def parse_size(s):
    s = str(s).upper()
    for suffix, mul in (("GB", 10**9), ("MB", 10**6), ("KB", 10**3)):
        if s.endswith(suffix):
            return int(float(s[:-len(suffix)]) * mul)
    return int(s)


def make_llama(a):
    """The transformers-made Llama shapes (8b, test)."""
    import torch
    from transformers import LlamaConfig, LlamaForCausalLM
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


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--shape", choices=sorted(SHAPES) + sorted(direct_shapes()), required=True)
    ap.add_argument("--out", required=True)
    ap.add_argument("--seed", type=int, default=1234)
    ap.add_argument("--shard", default="5GB", help="max shard size (direct shapes: 2GB unless given)")
    ap.add_argument("--layers", type=int, help="num_hidden_layers instead of the shape's (a "
                    "shape's matrices at a few layers: quick to make, for timing kernels)")
    ap.add_argument("--max-bytes", type=int, help="direct shapes: fewer layers until the "
                    "checkpoint fits in this many bytes (the output says how many)")
    ap.add_argument("--fill", choices=["random", "zeros"], default="random",
                    help="direct shapes: zeros writes sparse files (no torch needed)")
    ap.add_argument("--threads", type=int, default=8, help="direct shapes: files written at once")
    ap.add_argument("--quant", choices=["gptq"], help="direct dense shapes: the decoder's "
                    "linears in AutoGPTQ's 4-bit layout (symmetric, groups of 128)")
    a = ap.parse_args()
    if a.quant and a.shape in SHAPES:
        ap.error(f"--quant: a direct shape (not {a.shape}; llama3.1-8b is the 8b shape's)")
    if a.shape in SHAPES:
        make_llama(a)
    else:
        if a.shard == ap.get_default("shard"):
            a.shard = "2GB"
        make_direct(a)


if __name__ == "__main__":
    main()
