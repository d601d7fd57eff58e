#!/usr/bin/env python3
"""bench/cpu/to_gptq.py SRC_DIR OUT_DIR [--group G] [--sym] [--lm-head] — quantizes a
checkpoint of unquantized safetensors (one file, such as bench/cpu/make_qwen3.py writes) to
AutoGPTQ's 4-bit layout (checkpoint_format gptq) with numpy, for CPU benchmarks at real widths
(bench/cpu/vs_llama.sh).

The rules are tools/quant/quantize_torch.py's (round to nearest even, groups of G along the
input, float16 scales; asymmetric unless --sym), and its config.json entry is
tools/quant/quantize.py's: quantize.py is pure Python and takes hours on 0.6 B weights,
quantize_torch.py needs torch, which a CPU machine may not have. The q/k/v/o and
gate/up/down projections are quantized; embeddings, norms and lm_head are kept, unless
--lm-head: the output head quantized too, as GPTQModel's lm_head option publishes it (a tied
head becomes lm_head.* beside the bf16 embedding, and the config unties them)."""
import argparse
import json
import os
import shutil
import struct
import sys

import numpy as np

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "..",
                                "tools", "quant"))
from quantize import LINEARS, quant_config  # noqa: E402

DTYPES = {"BF16": np.uint16, "F16": np.float16, "F32": np.float32, "I32": np.int32}


def read_st(path):
    """{name: (dtype string, shape, memory-mapped array)} of one safetensors file"""
    with open(path, "rb") as f:
        n = struct.unpack("<Q", f.read(8))[0]
        header = json.loads(f.read(n))
    out = {}
    for name, t in header.items():
        if name == "__metadata__":
            continue
        if t["dtype"] not in DTYPES:
            raise SystemExit("to_gptq: %s: %s is %s" % (path, name, t["dtype"]))
        b, e = t["data_offsets"]
        dt = np.dtype(DTYPES[t["dtype"]])
        a = np.memmap(path, dtype=dt, mode="r", offset=8 + n + b, shape=((e - b) // dt.itemsize,))
        out[name] = (t["dtype"], t["shape"], a.reshape(t["shape"]))
    return out


def as_f32(dtype, a):
    if dtype == "BF16":
        return (a.astype(np.uint32) << 16).view(np.float32)
    return a.astype(np.float32)


def words(q):
    """[..., 8] values 0..15 -> int32 words, value k in bits 4k"""
    w = np.zeros(q.shape[:-1], dtype=np.uint32)
    for k in range(8):
        w |= q[..., k].astype(np.uint32) << np.uint32(4 * k)
    return w.view(np.int32)


def gptq(w, g, sym):
    """w float32 [out, in] -> qweight [in/8, out], qzeros [in/g, out/8] (zero - 1), scales"""
    rows, cols = w.shape
    if cols % g or cols % 8 or rows % 8:
        raise SystemExit("to_gptq: a %dx%d matrix does not split into groups of %d" % (rows, cols, g))
    wg = w.reshape(rows, cols // g, g)
    lo = np.minimum(wg.min(-1), 0.0)
    hi = np.maximum(wg.max(-1), 0.0)
    if sym:
        s = np.maximum(np.maximum(-lo, hi) * 2 / np.float32(15.0), np.float32(1e-5))
    else:
        s = np.maximum((hi - lo) / np.float32(15.0), np.float32(1e-5))
    s = s.astype(np.float16).astype(np.float32)
    z = np.full_like(s, 8.0) if sym else np.clip(np.round(-lo / s), 1, 15)
    q = np.clip(np.round(wg / s[..., None]) + z[..., None], 0, 15).astype(np.uint8)
    q = q.reshape(rows, cols)
    qweight = words(q.T.reshape(cols // 8, 8, rows).transpose(0, 2, 1))
    qzeros = words((z.T.astype(np.uint8) - 1).reshape(cols // g, rows // 8, 8))
    g_idx = (np.arange(cols) // g).astype(np.int32)
    return qweight, qzeros, np.ascontiguousarray(s.T).astype(np.float16), g_idx


def write_st(path, tensors):
    """tensors: list of (name, dtype string, array) written in that order"""
    header, off = {}, 0
    for name, dt, a in tensors:
        header[name] = {"dtype": dt, "shape": list(a.shape), "data_offsets": [off, off + a.nbytes]}
        off += a.nbytes
    hb = json.dumps(header, separators=(",", ":")).encode()
    hb += b" " * (-len(hb) % 8)
    with open(path, "wb") as f:
        f.write(struct.pack("<Q", len(hb)) + hb)
        for _, _, a in tensors:
            np.ascontiguousarray(a).tofile(f)


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("src")
    ap.add_argument("out")
    ap.add_argument("--group", type=int, default=128)
    ap.add_argument("--sym", action="store_true")
    ap.add_argument("--lm-head", action="store_true", help="quantize the output head as well")
    a = ap.parse_args()
    a.layout, a.act_order = "gptq", False
    files = sorted(f for f in os.listdir(a.src) if f.endswith(".safetensors")
                   and not f.startswith("reference"))
    if len(files) != 1:
        raise SystemExit("to_gptq: %s: expected one .safetensors file, found %d" % (a.src, len(files)))
    src = read_st(os.path.join(a.src, files[0]))
    out = []
    cfg = json.load(open(os.path.join(a.src, "config.json")))
    if a.lm_head:  # the head's tensors, from the embedding when the checkpoint ties them
        head = "lm_head.weight" if "lm_head.weight" in src else "model.embed_tokens.weight"
        dt, _, t = src[head]
        qw, qz, s, gi = gptq(as_f32(dt, t), a.group, a.sym)
        out += [("lm_head.qweight", "I32", qw), ("lm_head.qzeros", "I32", qz),
                ("lm_head.scales", "F16", s), ("lm_head.g_idx", "I32", gi)]
        cfg["tie_word_embeddings"] = False
    for name, (dt, shape, t) in src.items():
        if a.lm_head and name == "lm_head.weight":
            continue
        module = name[:-len(".weight")] if name.endswith(".weight") else None
        if module and module.split(".")[-1] in LINEARS and len(shape) == 2:
            qw, qz, s, gi = gptq(as_f32(dt, t), a.group, a.sym)
            out += [(module + ".qweight", "I32", qw), (module + ".qzeros", "I32", qz),
                    (module + ".scales", "F16", s), (module + ".g_idx", "I32", gi)]
        else:
            out.append((name, dt, t))
    os.makedirs(a.out, exist_ok=True)
    for f in os.listdir(a.src):  # tokenizer and generation files travel with the weights
        if not f.endswith(".safetensors") and f != "config.json":
            shutil.copy(os.path.join(a.src, f), a.out)
    write_st(os.path.join(a.out, "model.safetensors"), out)
    cfg["quantization_config"] = dict(quant_config(a), lm_head=a.lm_head)
    with open(os.path.join(a.out, "config.json"), "w") as f:
        json.dump(cfg, f, indent=1)
    print("%s: gptq g%d %s%s, %.2f GB" % (a.out, a.group, "sym" if a.sym else "asym",
                                          ", lm_head too" if a.lm_head else "",
                                          os.path.getsize(os.path.join(a.out, "model.safetensors")) / 1e9))


if __name__ == "__main__":
    main()
