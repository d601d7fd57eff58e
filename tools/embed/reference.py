#!/usr/bin/env python3
"""Embedding references from transformers, and atlas checked against them (the GPU machine).

    python3 tools/embed/reference.py make  --out /tmp/emb            # needs torch, transformers
    python3 tools/embed/reference.py check --out /tmp/emb --atlas build/atlas --device cpu
    python3 tools/embed/reference.py check --out /tmp/emb --atlas build/atlas --device cuda

make: for each shape below, a random-weight checkpoint in Qwen3-Embedding's layout (2 layers
of the published width: bf16, tensors named without "model." and no lm_head, as
Qwen/Qwen3-Embedding-* ship their Qwen3Model; config.json says Qwen3ForCausalLM), a
tokenizer.json of 256 byte tokens plus <|endoftext|> (id 151643) that its TemplateProcessing
post-processor appends (as Qwen3-Embedding's tokenizer does), and sentence-transformers'
modules.json, 1_Pooling/config.json and 2_Normalize.  Then the reference: the ids from the
`tokenizers` library (post-processor applied), `AutoModel.from_pretrained(dir,
dtype=torch.float32)` (the bf16 weights upcast; TF32 off), its last_hidden_state (after the
final RMSNorm) for each text alone, pooled HERE (last token, mean or cls, then divided by its
L2 norm where a Normalize module is listed) in float64: sentence-transformers is not on the
device, and the pooling must not come from the code being checked.  Written to
OUT/<name>/reference.json: {"texts", "ids", "vectors"}.

check: runs `atlas serve` on each directory and compares POST /v1/embeddings (all texts in
one request, so they are batched; encoding_format base64) with the reference: the ids'
count against usage.prompt_tokens, cosine >= 0.99999 on the CPU and >= 0.9999 on the GPU,
and the largest absolute difference printed.  Needs only the standard library.
"""
import argparse
import base64
import json
import math
import os
import socket
import struct
import subprocess
import sys
import time
import urllib.request

EOS = 151643
LAYERS = 2
TEXTS = [
    "hello",
    "The capital of France is Paris.",
    "Instruct: Given a web search query, retrieve relevant passages\nQuery: what is a qubit?",
    "数据库索引如何工作？ Comment fonctionne un index ?",
    "a " * 300,  # 600 tokens: several of the engine's prompt chunks at a small budget
    "x",
]
# The published Qwen3-Embedding widths (Qwen/Qwen3-Embedding-0.6B, -4B, -8B), and the small
# one with the other poolings.
SHAPES = {
    "qwen3-embedding-0.6b": dict(hidden_size=1024, intermediate_size=3072,
                                 num_attention_heads=16, num_key_value_heads=8, head_dim=128,
                                 vocab_size=151669, tie_word_embeddings=True, pooling="last",
                                 normalize=True),
    "qwen3-embedding-4b": dict(hidden_size=2560, intermediate_size=9728, num_attention_heads=32,
                               num_key_value_heads=8, head_dim=128, vocab_size=151665,
                               tie_word_embeddings=True, pooling="last", normalize=True),
    "qwen3-embedding-8b": dict(hidden_size=4096, intermediate_size=12288,
                               num_attention_heads=32, num_key_value_heads=8, head_dim=128,
                               vocab_size=151665, tie_word_embeddings=False, pooling="last",
                               normalize=True),
    "qwen3-embedding-0.6b-mean": dict(hidden_size=1024, intermediate_size=3072,
                                      num_attention_heads=16, num_key_value_heads=8,
                                      head_dim=128, vocab_size=151669,
                                      tie_word_embeddings=True, pooling="mean", normalize=False),
    "qwen3-embedding-0.6b-cls": dict(hidden_size=1024, intermediate_size=3072,
                                     num_attention_heads=16, num_key_value_heads=8,
                                     head_dim=128, vocab_size=151669, tie_word_embeddings=True,
                                     pooling="cls", normalize=True),
}
POOL_KEY = {"last": "pooling_mode_lasttoken", "mean": "pooling_mode_mean_tokens",
            "cls": "pooling_mode_cls_token"}


def tokenizer_json():
    """GPT-2's byte-level alphabet (id = the byte), no merges, <|endoftext|> appended."""
    bs = list(range(ord("!"), ord("~") + 1)) + list(range(0xA1, 0xAD)) + list(range(0xAE, 0x100))
    cs, n = bs[:], 0
    for b in range(256):
        if b not in bs:
            bs.append(b)
            cs.append(256 + n)
            n += 1
    vocab = {chr(cs[bs.index(b)]): b for b in range(256)}
    eos = {"SpecialToken": {"id": "<|endoftext|>", "type_id": 0}}
    return {"version": "1.0", "truncation": None, "padding": None,
            "added_tokens": [{"id": EOS, "content": "<|endoftext|>", "single_word": False,
                              "lstrip": False, "rstrip": False, "normalized": False,
                              "special": True}],
            "normalizer": None,
            "pre_tokenizer": {"type": "ByteLevel", "add_prefix_space": False,
                              "trim_offsets": True, "use_regex": True},
            "post_processor": {"type": "Sequence", "processors": [
                {"type": "ByteLevel", "add_prefix_space": False, "trim_offsets": False,
                 "use_regex": True},
                {"type": "TemplateProcessing",
                 "single": [{"Sequence": {"id": "A", "type_id": 0}}, eos],
                 "pair": [{"Sequence": {"id": "A", "type_id": 0}}, eos,
                          {"Sequence": {"id": "B", "type_id": 1}}, eos],
                 "special_tokens": {"<|endoftext|>": {"id": "<|endoftext|>", "ids": [EOS],
                                                      "tokens": ["<|endoftext|>"]}}}]},
            "decoder": {"type": "ByteLevel", "add_prefix_space": True, "trim_offsets": True,
                        "use_regex": True},
            "model": {"type": "BPE", "dropout": None, "unk_token": None,
                      "continuing_subword_prefix": None, "end_of_word_suffix": None,
                      "fuse_unk": False, "byte_fallback": False, "ignore_merges": False,
                      "vocab": vocab, "merges": []}}


def seed_of(name):
    return sum((i + 1) * ord(c) for i, c in enumerate(name)) % 100003


def make_checkpoint(name, spec, d):
    import torch
    from safetensors.torch import save_file
    from transformers import AutoConfig, AutoModel
    os.makedirs(os.path.join(d, "1_Pooling"), exist_ok=True)
    cfg = {k: v for k, v in spec.items() if k not in ("pooling", "normalize")}
    cfg.update(num_hidden_layers=LAYERS, max_position_embeddings=32768, rope_theta=1000000.0,
               rms_norm_eps=1e-6, bos_token_id=EOS, eos_token_id=EOS, torch_dtype="bfloat16")
    config = AutoConfig.for_model("qwen3", **cfg)
    torch.manual_seed(seed_of(name))
    with torch.device("cuda"):
        model = AutoModel.from_config(config, dtype=torch.bfloat16)  # Qwen3Model: no head
    g = torch.Generator(device="cuda").manual_seed(seed_of(name))
    with torch.no_grad():
        for pname, p in model.named_parameters():
            if p.dim() == 1:
                p.copy_(1.0 + 0.1 * torch.randn(p.shape, generator=g, device="cuda"))
            else:
                p.copy_(torch.randn(p.shape, generator=g, device="cuda") / math.sqrt(p.shape[1]))
    # Qwen3Model's own names (embed_tokens.weight, layers.0...), as Qwen3-Embedding ships them
    tensors = {k: v.contiguous().cpu() for k, v in model.state_dict().items()}
    save_file(tensors, os.path.join(d, "model.safetensors"), metadata={"format": "pt"})
    del model
    torch.cuda.empty_cache()
    with open(os.path.join(d, "config.json"), "w") as f:
        json.dump(dict(cfg, architectures=["Qwen3ForCausalLM"], model_type="qwen3"), f, indent=2)
    with open(os.path.join(d, "tokenizer.json"), "w") as f:
        json.dump(tokenizer_json(), f)
    modules = [{"idx": 0, "name": "0", "path": "", "type": "sentence_transformers.models.Transformer"},
               {"idx": 1, "name": "1", "path": "1_Pooling",
                "type": "sentence_transformers.models.Pooling"}]
    if spec["normalize"]:
        os.makedirs(os.path.join(d, "2_Normalize"), exist_ok=True)
        modules.append({"idx": 2, "name": "2", "path": "2_Normalize",
                        "type": "sentence_transformers.models.Normalize"})
    with open(os.path.join(d, "modules.json"), "w") as f:
        json.dump(modules, f, indent=2)
    pool = {k: False for k in ("pooling_mode_cls_token", "pooling_mode_mean_tokens",
                               "pooling_mode_max_tokens", "pooling_mode_mean_sqrt_len_tokens",
                               "pooling_mode_weightedmean_tokens", "pooling_mode_lasttoken")}
    pool[POOL_KEY[spec["pooling"]]] = True
    with open(os.path.join(d, "1_Pooling", "config.json"), "w") as f:
        json.dump(dict(pool, word_embedding_dimension=spec["hidden_size"], include_prompt=True),
                  f, indent=2)


def make_reference(spec, d):
    import torch
    from tokenizers import Tokenizer
    from transformers import AutoModel
    torch.backends.cuda.matmul.allow_tf32 = False
    torch.backends.cudnn.allow_tf32 = False
    tok = Tokenizer.from_file(os.path.join(d, "tokenizer.json"))
    model = AutoModel.from_pretrained(d, dtype=torch.float32).cuda().eval()
    ids, vectors = [], []
    for text in TEXTS:
        t = tok.encode(text).ids  # the post-processor appends <|endoftext|>
        assert t[-1] == EOS, "the tokenizer did not append <|endoftext|>"
        with torch.no_grad():
            h = model(input_ids=torch.tensor([t], device="cuda")).last_hidden_state[0]
        h = h.double().cpu()
        v = {"last": h[-1], "cls": h[0], "mean": h.mean(dim=0)}[spec["pooling"]]
        if spec["normalize"]:
            v = v / max(v.norm().item(), 1e-12)
        ids.append(t)
        vectors.append([float(x) for x in v])
    with open(os.path.join(d, "reference.json"), "w") as f:
        json.dump({"texts": TEXTS, "ids": ids, "vectors": vectors}, f)


def free_port():
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def post(port, path, body):
    req = urllib.request.Request(f"http://127.0.0.1:{port}{path}", json.dumps(body).encode(),
                                 {"content-type": "application/json"})
    with urllib.request.urlopen(req, timeout=600) as r:
        return json.load(r)


def check(name, d, atlas, device):
    with open(os.path.join(d, "reference.json")) as f:
        ref = json.load(f)
    port = free_port()
    srv = subprocess.Popen([atlas, "serve", "--port", str(port), "--device", device,
                            "--model", f"{name}={d}"], stderr=subprocess.PIPE, text=True)
    try:
        for _ in range(600):
            try:
                urllib.request.urlopen(f"http://127.0.0.1:{port}/health", timeout=1)
                break
            except OSError:
                time.sleep(0.5)
        r = post(port, "/v1/embeddings", {"model": name, "input": ref["texts"],
                                          "encoding_format": "base64"})
    finally:
        srv.terminate()
        srv.wait()
    want_tokens = sum(len(t) for t in ref["ids"])
    ok = r["usage"]["prompt_tokens"] == want_tokens
    if not ok:
        print(f"{name}: prompt_tokens {r['usage']['prompt_tokens']}, the tokenizer gives {want_tokens}")
    bound = 0.99999 if device == "cpu" else 0.9999
    for i, (item, want) in enumerate(zip(r["data"], ref["vectors"])):
        raw = base64.b64decode(item["embedding"])
        got = struct.unpack(f"<{len(raw) // 4}f", raw)
        dot = sum(a * b for a, b in zip(got, want))
        cos = dot / (math.sqrt(sum(a * a for a in got)) * math.sqrt(sum(b * b for b in want)))
        diff = max(abs(a - b) for a, b in zip(got, want))
        good = len(got) == len(want) and cos >= bound
        ok &= good
        print(f"{name} [{device}] text {i} ({len(ref['ids'][i])} tokens): cosine {cos:.7f}, "
              f"max |diff| {diff:.3g}{'' if good else f'  FAIL (want cosine >= {bound})'}")
    return ok


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("what", choices=["make", "check"])
    ap.add_argument("--out", required=True)
    ap.add_argument("--only", default="", help="comma-separated shape names")
    ap.add_argument("--atlas", default="build/atlas")
    ap.add_argument("--device", default="cpu", choices=["cpu", "cuda"])
    a = ap.parse_args()
    names = [n for n in SHAPES if not a.only or n in a.only.split(",")]
    ok = True
    for name in names:
        d = os.path.join(a.out, name)
        if a.what == "make":
            make_checkpoint(name, SHAPES[name], d)
            make_reference(SHAPES[name], d)
            print(f"{name}: {d}")
        else:
            ok &= check(name, d, a.atlas, a.device)
    sys.exit(0 if ok else 1)


if __name__ == "__main__":
    main()
