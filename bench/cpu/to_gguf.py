#!/usr/bin/env python3
"""bench/cpu/to_gguf.py GGUF_PY_DIR SRC_DIR OUT.gguf — writes a Qwen3 checkpoint (config.json
and unquantized safetensors, one file or shards, such as bench/cpu/make_qwen3.py makes) as a
GGUF file that llama.cpp's qwen3 architecture loads, so llama.cpp and atlas can be timed on
the same weights (bench/cpu/vs_llama.sh).

GGUF_PY_DIR is llama.cpp's gguf-py folder (its writer needs numpy alone; llama.cpp's own
convert_hf_to_gguf.py needs torch and transformers). Matrices keep their type (bf16 stays
bf16) and norm vectors become float32, as llama.cpp's converter writes them; q and k are not
permuted (Qwen3's rope is the NEOX layout, which llama.cpp's converter leaves as it is); a
tied lm_head is left out (llama.cpp then reads token_embd). The vocabulary is written as
tokenizer.ggml.model "none" with the checkpoint's vocab size: llama-bench feeds random token
ids and never tokenizes, and the benchmark checkpoint has no tokenizer to convert."""
import json
import os
import struct
import sys

import numpy as np

LAYER = {"input_layernorm": "attn_norm", "post_attention_layernorm": "ffn_norm",
         "self_attn.q_proj": "attn_q", "self_attn.k_proj": "attn_k",
         "self_attn.v_proj": "attn_v", "self_attn.o_proj": "attn_output",
         "self_attn.q_norm": "attn_q_norm", "self_attn.k_norm": "attn_k_norm",
         "mlp.gate_proj": "ffn_gate", "mlp.up_proj": "ffn_up", "mlp.down_proj": "ffn_down"}
TOP = {"model.embed_tokens": "token_embd", "model.norm": "output_norm", "lm_head": "output"}
DTYPES = {"BF16": np.uint16, "F16": np.float16, "F32": np.float32}


def gguf_name(hf):
    """the GGUF tensor name of a Hugging Face Qwen3 tensor name, or None when it has none"""
    base, dot, kind = hf.rpartition(".")
    if kind not in ("weight", "bias"):
        return None
    if base in TOP:
        return TOP[base] + "." + kind
    parts = base.split(".")
    if len(parts) > 3 and parts[0] == "model" and parts[1] == "layers":
        sub = ".".join(parts[3:])
        if sub in LAYER:
            return "blk.%s.%s.%s" % (parts[2], LAYER[sub], kind)
    return None


def safetensors(path):
    """(name, dtype string, shape, memory-mapped array) of each tensor in one file"""
    with open(path, "rb") as f:
        n = struct.unpack("<Q", f.read(8))[0]
        header = json.loads(f.read(n))
    for name, t in header.items():
        if name == "__metadata__":
            continue
        if t["dtype"] not in DTYPES:
            raise SystemExit("to_gguf: %s: %s is %s; only BF16, F16 and F32 are converted"
                             % (path, name, t["dtype"]))
        begin, end = t["data_offsets"]
        count = (end - begin) // np.dtype(DTYPES[t["dtype"]]).itemsize
        a = np.memmap(path, dtype=DTYPES[t["dtype"]], mode="r", offset=8 + n + begin,
                      shape=(count,))
        yield name, t["dtype"], t["shape"], a.reshape(t["shape"])


def main():
    if len(sys.argv) != 4:
        raise SystemExit(__doc__.split("\n\n")[0])
    sys.path.insert(0, sys.argv[1])
    import gguf
    src, out = sys.argv[2], sys.argv[3]
    cfg = json.load(open(os.path.join(src, "config.json")))
    if cfg.get("model_type") != "qwen3":
        raise SystemExit("to_gguf: %s: model_type %r; only qwen3 is converted"
                         % (src, cfg.get("model_type")))
    heads = cfg["num_attention_heads"]
    head_dim = cfg.get("head_dim") or cfg["hidden_size"] // heads
    w = gguf.GGUFWriter(out, "qwen3")
    w.add_name(os.path.basename(os.path.normpath(src)))
    w.add_context_length(cfg["max_position_embeddings"])
    w.add_embedding_length(cfg["hidden_size"])
    w.add_block_count(cfg["num_hidden_layers"])
    w.add_feed_forward_length(cfg["intermediate_size"])
    w.add_head_count(heads)
    w.add_head_count_kv(cfg.get("num_key_value_heads", heads))
    w.add_key_length(head_dim)
    w.add_value_length(head_dim)
    w.add_rope_freq_base(float(cfg.get("rope_theta", 10000.0)))
    w.add_layer_norm_rms_eps(float(cfg["rms_norm_eps"]))
    w.add_vocab_size(cfg["vocab_size"])
    w.add_tokenizer_model("none")
    files = sorted(f for f in os.listdir(src) if f.endswith(".safetensors"))
    if not files:
        raise SystemExit("to_gguf: %s: no .safetensors files" % src)
    types = set()
    for f in files:
        for name, dtype, shape, a in safetensors(os.path.join(src, f)):
            g = gguf_name(name)
            if g is None:
                raise SystemExit("to_gguf: %s: tensor %s has no qwen3 GGUF name" % (f, name))
            if g.startswith("output.") and cfg.get("tie_word_embeddings"):
                continue
            if len(shape) == 1:  # norms in float32, as llama.cpp's converter keeps them
                a = (a.astype(np.uint32) << 16).view(np.float32) if dtype == "BF16" \
                    else a.astype(np.float32)
                w.add_tensor(g, a)
            elif dtype == "BF16":
                w.add_tensor(g, a, raw_dtype=gguf.GGMLQuantizationType.BF16)
                types.add("BF16")
            else:
                w.add_tensor(g, a)
                types.add(dtype)
    ftype = {"BF16": gguf.LlamaFileType.MOSTLY_BF16, "F16": gguf.LlamaFileType.MOSTLY_F16,
             "F32": gguf.LlamaFileType.ALL_F32}
    if len(types) == 1:
        w.add_file_type(ftype[types.pop()])
    w.write_header_to_file()
    w.write_kv_data_to_file()
    w.write_tensors_to_file(progress=False)
    w.close()
    print("%s: %s" % (out, "%.2f GB" % (os.path.getsize(out) / 1e9)))


if __name__ == "__main__":
    main()
