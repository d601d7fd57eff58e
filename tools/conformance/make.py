#!/usr/bin/env python3
"""Makes the conformance suite's checkpoints and transformers' references (on the GPU machine).

    python3 tools/conformance/make.py --set big --out /tmp/conf [--refs DIR] [--only NAME,..]
    python3 tools/conformance/make.py --set small --out tests/data/small --refs tests/data/small

For each shape of tools/conformance/shapes.py: a random-weight checkpoint (bf16 safetensors,
2 layers or the entry's num_hidden_layers, weights drawn from a fixed seed on the GPU; norms
near 1 (Gemma 3's near 0: it uses them as 1 + w), biases -- q/k/v, o_proj, the MLP's, as
attention_bias and mlp_bias say -- small, MoE routers wide (ROUTER_STD), a MoE model's
experts written one tensor an expert as the Hub has them, whatever layout transformers keeps
them in; gpt-oss's every tensor drawn and written by name as the Hub has it, gpt_oss.py, its
MXFP4 entries with their bf16 dequantization beside them in NAME-float), the config.json
exactly as shapes.py
spells it (classic rope_scaling or transformers-5 rope_parameters), a generation_config.json
and a tokenizer.json (--tok-llama3 / --tok-qwen3 / --tok-llama2 / --tok-gemma3 files, else a byte-level one of 256 tokens
that any vocabulary holds: the suite feeds token ids).  With --refs, the reference too:
`AutoModelForCausalLM.from_pretrained(dir, dtype=torch.float32, attn_implementation="sdpa")`
(the bf16 weights upcast, the RoPE table in float32 as transformers keeps it; TF32 off;
gpt-oss "eager", the one attention of transformers' that has its sinks, on the NAME-float
weights for MXFP4; "eager" also for one KV head: see EAGER_KV_HEADS), for each prompt length the prompt's forward (prefilled in pieces of at
most 8,192 tokens against the cache for long prompts -- the entry's "chunk" where it gives
one: eager attention holds [heads, piece, context] scores -- logits of the last position
only), then FORCED greedy steps with
the KV cache, each feeding the reference's own greedy token (teacher forcing).  Stored in
REFS/<name>/reference.safetensors: per length L, L<L>.prompt [seed, lo, hi], L<L>.forced
[FORCED], L<L>.top_ids / L<L>.top_lp [FORCED + 1, TOPK] (log_softmax in float64, rounded to
float32), L<L>.margin [FORCED + 1] (best minus second logit).

Quantized layouts (--quant fp8-block,awq,...; each tools/quant/quantize.py layout, with its
options after a colon: "gptq:--group 32 --act-order"): every checkpoint made is quantized
into OUT/<name>-<layout> (its float32 dequantization into OUT/<name>-<layout>-float), and the
reference is transformers' float32 forward of the dequantized weights, stored in the
quantized directory (what atlas-conform compares atlas on the quantized files with). With
--quant-native, layouts transformers loads itself (fp8-block: FineGrainedFP8, on the GPU)
get a second reference from transformers' own reading of the quantized files,
reference-native.safetensors: an independent reading of the format (it quantizes the
activations too, so it is compared at the GPU's bound, not the CPU's).

An FP8 KV cache (--kv fp8): a second reference beside each one, reference-kvfp8.safetensors,
made the same way with every key (after RoPE) and value rounded as vLLM's and atlas's FP8
cache stores them, where transformers' cache takes them (Cache.update, so the tokens of the
piece being computed attend to their own rounded K/V, as atlas reads them back from its
cache): e4m3(x / scale) * scale in float32, clamped to +-448 first (torch's cast does not
saturate), ties to even, with each layer's scale the checkpoint's self_attn.k_scale /
v_scale (or k_proj.k_scale, k_proj.output_scale) where it has one, else 1.0.
atlas-conform --kv-cache-dtype fp8 reads it (bench/conformance/run.sh KV=fp8). --kv-only
makes only those, for checkpoints (and their references) already in --out.
"""
import argparse
import json
import math
import os
import re
import shutil
import sys
import time

import torch
from safetensors import safe_open
from safetensors.torch import save_file
from transformers import AutoConfig, AutoModelForCausalLM

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import gpt_oss  # noqa: E402
import shapes  # noqa: E402

MOE = (shapes.QWEN3_MOE, shapes.MIXTRAL)
# A router's weights drawn with this std times 1/sqrt(hidden): logits spread over ~8, so the
# probability of the k-th expert is small beside the first's wherever the k-th and the next
# are near a tie that bf16 may flip, and a flip moves the output by that small weight only.
ROUTER_STD = 8.0
LAYERS = 2
# Shapes with this many KV heads get eager attention: PyTorch's efficient SDPA kernel reads a
# single KV head broadcast to every query head (a stride-0 view) wrong when the key length is
# 1 mod 32 and a mask is given (pytorch/pytorch#191937): gemma3-1b's sdpa reference at 513
# tokens (a sliding-window mask) was no model's output. Eager's pieces are bounded to
# EAGER_CHUNK tokens, as its scores are [heads, piece, context].
EAGER_KV_HEADS = 1
EAGER_CHUNK = 4096


def byte_level_tokenizer():
    """GPT-2's byte-level alphabet as a BPE of 256 tokens and no merges."""
    bs = list(range(ord("!"), ord("~") + 1)) + list(range(0xA1, 0xAD)) + list(range(0xAE, 0x100))
    cs, n = bs[:], 0
    for b in range(256):
        if b not in bs:
            bs.append(b)
            cs.append(256 + n)
            n += 1
    vocab = {chr(cs[bs.index(b)]): b for b in range(256)}  # id = the byte
    return {"version": "1.0", "truncation": None, "padding": None, "added_tokens": [],
            "normalizer": None,
            "pre_tokenizer": {"type": "ByteLevel", "add_prefix_space": False, "trim_offsets": True,
                              "use_regex": True},
            "post_processor": {"type": "ByteLevel", "add_prefix_space": True,
                               "trim_offsets": False, "use_regex": True},
            "decoder": {"type": "ByteLevel", "add_prefix_space": True, "trim_offsets": True,
                        "use_regex": True},
            "model": {"type": "BPE", "dropout": None, "unk_token": None,
                      "continuing_subword_prefix": None, "end_of_word_suffix": None,
                      "fuse_unk": False, "byte_fallback": False, "ignore_merges": False,
                      "vocab": vocab, "merges": []}}


def seed_of(name):
    return sum((i + 1) * ord(c) for i, c in enumerate(name)) % 100003


def check_biases(name, spec, model):
    """The biases the shape asks for are parameters of the model made: a transformers that
    ignored attention_bias or mlp_bias would make checkpoint and reference without them."""
    keys = set(model.state_dict())
    want = []
    if spec.get("attention_bias"):
        want += [f"model.layers.0.self_attn.{p}_proj.bias" for p in "qkvo"]
    if spec.get("mlp_bias"):
        want += [f"model.layers.0.mlp.{p}_proj.bias" for p in ("gate", "up", "down")]
    missing = [k for k in want if k not in keys]
    if missing:
        import transformers
        sys.exit(f"{name}: transformers {transformers.__version__} made no {', '.join(missing)}")


def hub_layout(spec, sd):
    """A MoE model's state dict as the Hub publishes it: one tensor an expert's projection
    (Qwen3-MoE mlp.experts.E.gate_proj/up_proj/down_proj, Mixtral
    block_sparse_moe.experts.E.w1/w3/w2, its router block_sparse_moe.gate). transformers 5
    keeps a layer's experts fused in memory ([E, 2f, d] gate|up, [E, d, f] down) and names
    Mixtral's block mlp; transformers 4 has the published names already."""
    mixtral = spec["architectures"][0] == shapes.MIXTRAL
    block = "block_sparse_moe" if mixtral else "mlp"
    proj = ("w1", "w3", "w2") if mixtral else ("gate_proj", "up_proj", "down_proj")
    out = {}
    for k, v in sd.items():
        if spec.get("tie_word_embeddings") and k == "lm_head.weight":
            continue
        m = re.match(r"(model\.layers\.\d+)\.(?:mlp|block_sparse_moe)\.(experts\.(?:gate_up|down)_proj"
                     r"|gate\.weight)$", k)
        if m and m.group(2) == "gate.weight":
            out[f"{m.group(1)}.{block}.gate.weight"] = v.contiguous()
        elif m:
            for e in range(v.shape[0]):
                pre = f"{m.group(1)}.{block}.experts.{e}"
                if m.group(2).endswith("gate_up_proj"):
                    gate, up = v[e].chunk(2, dim=0)
                    out[f"{pre}.{proj[0]}.weight"] = gate.contiguous()
                    out[f"{pre}.{proj[1]}.weight"] = up.contiguous()
                else:
                    out[f"{pre}.{proj[2]}.weight"] = v[e].contiguous()
        else:
            out[k] = v.contiguous()
    return out


def write_side_files(d, spec, cfg_json, toks):
    """config.json as shapes.py spells it, generation_config.json and tokenizer.json."""
    with open(os.path.join(d, "config.json"), "w") as f:
        json.dump(cfg_json, f, indent=2)
    gen = {k: spec[k] for k in ("bos_token_id", "eos_token_id") if k in spec}
    with open(os.path.join(d, "generation_config.json"), "w") as f:
        json.dump(gen, f)
    tok = toks.get(spec.get("tok"))
    if tok:
        shutil.copy(tok, os.path.join(d, "tokenizer.json"))
    else:
        with open(os.path.join(d, "tokenizer.json"), "w") as f:
            json.dump(byte_level_tokenizer(), f)


def float_dir(out, name, spec):
    """Where an MXFP4 gpt-oss entry's bf16 dequantization goes (OUT-float/NAME, outside the
    set: tests/data/small holds only what atlas-conform runs); None for the others."""
    if spec["architectures"][0] != shapes.GPT_OSS or spec.get("experts") != "mxfp4":
        return None
    out = os.path.abspath(out)
    return os.path.join(os.path.dirname(out), os.path.basename(out) + "-float", name)


def make_gpt_oss(name, spec, d, cfg_json, toks, fd):
    """gpt-oss written by name in the Hub's layout (gpt_oss.py); MXFP4 experts (the entry's
    experts="mxfp4") with their bf16 dequantization in fd for the reference."""
    sd = gpt_oss.tensors(cfg_json, seed_of(name), ROUTER_STD)
    if spec.get("experts") != "mxfp4":
        save_file(sd, os.path.join(d, "model.safetensors"), metadata={"format": "pt"})
        write_side_files(d, spec, cfg_json, toks)
        return
    q, dq = gpt_oss.mxfp4(sd)
    save_file(q, os.path.join(d, "model.safetensors"), metadata={"format": "pt"})
    write_side_files(d, spec, dict(cfg_json, quantization_config=gpt_oss.MXFP4_CONFIG), toks)
    os.makedirs(fd, exist_ok=True)
    save_file(dq, os.path.join(fd, "model.safetensors"), metadata={"format": "pt"})
    write_side_files(fd, spec, cfg_json, toks)


def make_model(name, spec, out, toks, keep):
    d = os.path.join(out, name)
    done = os.path.join(out, f".made-{name}")
    if keep and os.path.exists(done):
        return d
    os.makedirs(d, exist_ok=True)
    cfg_json = dict(shapes.config_json(spec), torch_dtype="bfloat16",
                    model_type=shapes.MODEL_TYPE[spec["architectures"][0]])
    cfg_json.setdefault("num_hidden_layers", LAYERS)
    if spec["architectures"][0] == shapes.GPT_OSS:
        make_gpt_oss(name, spec, d, cfg_json, toks, float_dir(out, name, spec))
        if keep:
            open(done, "w").close()
        return d
    one_plus_w = spec["architectures"][0] == shapes.GEMMA3
    kw = {k: v for k, v in cfg_json.items() if k not in ("architectures", "model_type")}
    config = AutoConfig.for_model(cfg_json["model_type"], **kw)
    torch.manual_seed(seed_of(name))
    with torch.device("cuda"):
        model = AutoModelForCausalLM.from_config(config, dtype=torch.bfloat16)
    check_biases(name, spec, model)
    g = torch.Generator(device="cuda").manual_seed(seed_of(name))
    with torch.no_grad():
        for pname, p in model.named_parameters():
            if p.dim() == 1:  # norms near 1 (as used), biases small
                base = 0.0 if pname.endswith("bias") or one_plus_w else 1.0
                p.copy_(base + 0.1 * torch.randn(p.shape, generator=g, device="cuda"))
            else:
                # a tied embedding is also the output head: scaled like one, so that logits
                # stay O(1) as in real models (std 1 gave logit gaps of ~1,000); fused experts
                # [E, out, in] by their in-features too
                tied = spec.get("tie_word_embeddings")
                std = 1.0 if "embed_tokens" in pname and not tied else 1.0 / math.sqrt(p.shape[-1])
                if re.search(r"\.(mlp|block_sparse_moe)\.gate\.weight$", pname):
                    std *= ROUTER_STD
                p.copy_(torch.randn(p.shape, generator=g, device="cuda") * std)
    if spec["architectures"][0] in MOE:  # the Hub's per-expert tensors, written directly
        save_file(hub_layout(spec, model.state_dict()), os.path.join(d, "model.safetensors"),
                  metadata={"format": "pt"})
    else:
        model.save_pretrained(d, safe_serialization=True, max_shard_size="20GB")
    del model
    torch.cuda.empty_cache()
    write_side_files(d, spec, cfg_json, toks)  # the spelling shapes.py chose
    if keep:
        open(done, "w").close()
    return d


def kv_scales(d):
    """{(layer, "k" | "v"): scale} from d's safetensors: an FP8 KV cache's scalar scales in the
    spellings model/kv_scale.c reads; the layers without one are left out (1.0)."""
    pat = re.compile(r"model\.layers\.(\d+)\.self_attn\.(?:([kv])_scale|([kv])_proj\.\3_scale"
                     r"|([kv])_proj\.output_scale)$")
    out = {}
    for f in sorted(os.listdir(d)):
        if not f.endswith(".safetensors") or f.startswith("reference"):
            continue
        with safe_open(os.path.join(d, f), "pt") as st:
            for key in st.keys():
                m = pat.match(key)
                if m:
                    kv = m.group(2) or m.group(3) or m.group(4)
                    out[(int(m.group(1)), kv)] = float(st.get_tensor(key).float().reshape(-1)[0])
    return out


def fp8_round(x, scale):
    """x as an FP8 e4m3 KV cache gives it back: e4m3(x / scale) * scale, the division in
    float32, saturating at +-448 (torch.float8_e4m3fn's cast rounds to nearest even but
    makes NaN past 448), in x's dtype."""
    y = (x.float() / scale).clamp(-448.0, 448.0).to(torch.float8_e4m3fn)
    return (y.float() * scale).to(x.dtype)


class Fp8KvCache:
    """While active, every transformers cache rounds the keys and values it is given (after
    RoPE: the attention layers hand them over rotated) as fp8_round does, with scales. Each
    Cache class of transformers.cache_utils that defines update is wrapped; a subclass's update
    that calls its parent's rounds twice, which changes nothing (a rounded value is a code
    times the scale)."""

    def __init__(self, scales):
        self.scales, self.saved = scales, []

    def __enter__(self):
        import transformers.cache_utils as cu
        scales = self.scales
        for cls in vars(cu).values():
            # the Cache classes' update(key, value, layer_idx, ...), which the attention layers
            # call; not their layers' (transformers >= 4.56), whose update has no layer index
            if not (isinstance(cls, type) and issubclass(cls, cu.Cache) and "update" in vars(cls)):
                continue
            orig = vars(cls)["update"]

            def update(self_, key_states, value_states, layer_idx, *args, _orig=orig, **kw):
                k = fp8_round(key_states, scales.get((layer_idx, "k"), 1.0))
                v = fp8_round(value_states, scales.get((layer_idx, "v"), 1.0))
                return _orig(self_, k, v, layer_idx, *args, **kw)

            self.saved.append((cls, orig))
            cls.update = update
        if not self.saved:
            sys.exit("transformers.cache_utils has no update to round the KV cache in")
        return self

    def __exit__(self, *exc):
        for cls, orig in self.saved:
            cls.update = orig
        self.saved = []


def top(logits, k):
    lp = torch.log_softmax(logits.double(), dim=-1)
    v, i = torch.topk(lp, k)
    l2 = torch.topk(logits.float(), 2).values
    return i.int().cpu(), v.float().cpu(), float(l2[0] - l2[1])


def make_refs(name, spec, d, refs, big, kv=None, scales_dir=None):
    """d's references (an MXFP4 gpt-oss entry: d is its float_dir, the same weights
    dequantized; transformers' own MXFP4 path needs triton kernels or dequantizes anyway).
    kv "fp8": with an FP8 KV cache's rounding, the scales read from scales_dir (default d),
    into reference-kvfp8.safetensors."""
    if kv != "fp8":
        return make_refs_in(name, spec, d, refs, big, "reference.safetensors")
    scales = kv_scales(scales_dir or d)
    print(f"  {name}: FP8 KV cache, {len(scales)} scale tensors of the checkpoint", flush=True)
    with Fp8KvCache(scales):
        make_refs_in(name, spec, d, refs, big, "reference-kvfp8.safetensors")


def prefill(model, prompt, chunk):
    """The prompt's forward in pieces of at most chunk tokens against the cache: (the cache,
    the last position's logits)."""
    ids = torch.tensor([prompt], device="cuda")
    past, logits = None, None
    for a in range(0, len(prompt), chunk):
        r = model(input_ids=ids[:, a:a + chunk], past_key_values=past, use_cache=True,
                  logits_to_keep=1)
        past, logits = r.past_key_values, r.logits[0, -1]
    return past, logits


@torch.no_grad()
def make_refs_in(name, spec, d, refs, big, file):
    torch.backends.cuda.matmul.allow_tf32 = False
    torch.backends.cudnn.allow_tf32 = False
    oss = spec["architectures"][0] == shapes.GPT_OSS
    eager = oss or spec.get("num_key_value_heads") == EAGER_KV_HEADS
    model, info = AutoModelForCausalLM.from_pretrained(
        d, dtype=torch.float32, attn_implementation="eager" if eager else "sdpa",
        output_loading_info=True)
    if oss:
        gpt_oss.check_loaded(name, info)
    model = model.cuda().eval()
    chunk = spec.get("chunk", EAGER_CHUNK if eager else 8192)
    lo, hi = shapes.prompt_range(spec)
    out = {}
    for n in shapes.lengths(name, spec, big):
        t0 = time.time()
        seed = n * 7 + 1
        past, logits = prefill(model, shapes.prompt_ids(n, seed, lo, hi), chunk)
        tids, tlps, margins, forced = [], [], [], []
        for j in range(shapes.FORCED + 1):
            i, v, m = top(logits, shapes.TOPK)
            tids.append(i), tlps.append(v), margins.append(m)
            if j == shapes.FORCED:
                break
            tok = int(i[0])
            forced.append(tok)
            r = model(input_ids=torch.tensor([[tok]], device="cuda"), past_key_values=past,
                      use_cache=True)
            past, logits = r.past_key_values, r.logits[0, -1]
        out[f"L{n}.prompt"] = torch.tensor([seed, lo, hi], dtype=torch.int32)
        out[f"L{n}.forced"] = torch.tensor(forced, dtype=torch.int32)
        out[f"L{n}.top_ids"] = torch.stack(tids).contiguous()
        out[f"L{n}.top_lp"] = torch.stack(tlps).contiguous()
        out[f"L{n}.margin"] = torch.tensor(margins, dtype=torch.float32)
        del past
        print(f"  {name} L={n}: {time.time() - t0:.1f} s, first margin {margins[0]:.3f}", flush=True)
    del model
    torch.cuda.empty_cache()
    os.makedirs(os.path.join(refs, name), exist_ok=True)
    import transformers
    save_file(out, os.path.join(refs, name, file),
              metadata={"transformers": transformers.__version__, "torch": torch.__version__,
                        "layers": str(spec.get("num_hidden_layers", LAYERS))})


def quantize(d, spec_arg):
    """d quantized as spec_arg says; returns (quantized dir, float dir)"""
    import shlex
    import subprocess
    layout, _, args = spec_arg.partition(":")
    q, f = d + "-" + layout, d + "-" + layout + "-float"
    tool = os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "quant", "quantize.py")
    subprocess.run([sys.executable, tool, "--layout", layout, "--src", d, "--out", q,
                    "--dequant", f] + shlex.split(args), check=True)
    return layout, q, f


def kv_only(name, spec, a, big):
    """--kv-only: the FP8 KV references of a checkpoint made before (OUT/NAME), beside its
    reference.safetensors; an MXFP4 gpt-oss entry needs its float copy, which only a run that
    makes the checkpoint has."""
    d = os.path.join(a.out, name)
    if not os.path.exists(os.path.join(d, "config.json")):
        sys.exit(f"{name}: no checkpoint in {d} (--kv-only takes the ones made before)")
    fd = float_dir(a.out, name, spec)
    if fd and not os.path.isdir(fd):
        print(f"{name}: skipped (MXFP4: its float copy {fd} is not there)", flush=True)
        return
    refs = a.refs or a.out
    make_refs(name, spec, fd or d, refs, big, a.kv, d)
    if os.path.abspath(os.path.join(refs, name)) != os.path.abspath(d):
        shutil.copy(os.path.join(refs, name, "reference-kvfp8.safetensors"), d)


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--set", choices=["big", "small"], required=True)
    ap.add_argument("--out", required=True, help="where the checkpoints go")
    ap.add_argument("--refs", help="where reference.safetensors go (NAME/ under it)")
    ap.add_argument("--only", help="comma-separated names")
    ap.add_argument("--tok-llama3")
    ap.add_argument("--tok-qwen3")
    ap.add_argument("--tok-llama2")
    ap.add_argument("--tok-gemma3", help="e.g. tests/data/spm/gemma3/tokenizer.json")
    ap.add_argument("--quant", help="comma-separated quantized layouts (tools/quant/quantize.py)")
    ap.add_argument("--quant-native", action="store_true",
                    help="also transformers' own loader on the quantized files, where it has one")
    ap.add_argument("--kv", choices=["fp8"],
                    help="also references with an FP8 KV cache (reference-kvfp8.safetensors)")
    ap.add_argument("--kv-only", action="store_true",
                    help="with --kv: only those, for the checkpoints already in --out")
    a = ap.parse_args()
    if a.kv_only and not a.kv:
        sys.exit("--kv-only needs --kv fp8")
    big = a.set == "big"
    table = shapes.BIG if big else shapes.SMALL
    toks = {"llama3": a.tok_llama3, "qwen3": a.tok_qwen3, "llama2": a.tok_llama2,
            "gemma3": a.tok_gemma3}
    names = a.only.split(",") if a.only else list(table)
    for name in names:
        t0 = time.time()
        if a.kv_only:
            kv_only(name, table[name], a, big)
            continue
        d = make_model(name, table[name], a.out, toks, keep=big)
        print(f"{name}: checkpoint {time.time() - t0:.1f} s", flush=True)
        fd = float_dir(a.out, name, table[name])
        if a.refs:
            make_refs(name, table[name], fd or d, a.refs, big)
            if a.kv:
                make_refs(name, table[name], fd or d, a.refs, big, a.kv, d)
            for f in ["reference.safetensors"] + (["reference-kvfp8.safetensors"] if a.kv else []):
                if os.path.abspath(a.refs) != os.path.abspath(a.out):
                    shutil.copy(os.path.join(a.refs, name, f), d)
        if fd and not big:
            shutil.rmtree(fd)
        if a.quant and table[name]["architectures"][0] == shapes.GPT_OSS:
            print(f"{name}: --quant skipped (gpt-oss has its MXFP4 entries)", flush=True)
            continue
        for spec_arg in (a.quant.split(",") if a.quant else []):
            layout, q, f = quantize(d, spec_arg)
            qname = name + "-" + layout
            refs = a.refs or a.out
            make_refs(qname, table[name], f, refs, big)
            if a.kv:  # the quantized checkpoint's KV scales (the float copy has none)
                make_refs(qname, table[name], f, refs, big, a.kv, q)
            for fn in ["reference.safetensors"] + (["reference-kvfp8.safetensors"] if a.kv else []):
                if os.path.abspath(os.path.join(refs, qname)) != os.path.abspath(q):
                    shutil.copy(os.path.join(refs, qname, fn), q)
            if a.quant_native and layout == "fp8-block":
                make_refs(qname + "-native", table[name], q, refs, big)
                shutil.copy(os.path.join(refs, qname + "-native", "reference.safetensors"),
                            os.path.join(q, "reference-native.safetensors"))


if __name__ == "__main__":
    main()
