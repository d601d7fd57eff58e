#!/usr/bin/env python3
"""Quantizes a Hugging Face checkpoint of any size (sharded bf16 safetensors) with torch, on
the GPU when there is one: the layouts of tools/quant/quantize.py that benchmarks and
real-width conformance checks need, by the same published rules, vectorised.

  python3 tools/quant/quantize_torch.py --layout gptq --src /tmp/llama8b --out /tmp/8b-gptq \\
      [--dequant DIR] [--group 128] [--sym] [--block 128 128]

Layouts (each as quantize.py's docstring says): fp8-block, awq, gptq, gptq-v2 (no act-order
here), mxfp4, nvfp4, modelopt-fp8, ct-int4 (no act-order here). The q/k/v/o and gate/up/down projections are quantized; the embeddings,
norms and lm_head are kept as they are. Rounding is round-to-nearest-even as in quantize.py
(arithmetic in float32 rather than Python's double: a code can differ where a value falls
within a rounding error of a boundary, which changes no format rule). --dequant writes the
weights as the format dequantizes them, in float32, for transformers' reference."""
import argparse
import json
import os
import shutil
import sys

import torch
from safetensors.torch import load_file, save_file

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from quantize import LINEARS, quant_config  # noqa: E402

E2M1 = [0.0, 0.5, 1.0, 1.5, 2.0, 3.0, 4.0, 6.0]
AWQ_ORDER = [0, 2, 4, 6, 1, 3, 5, 7]


def e2m1_codes(x):
    """nearest e2m1 code of each element (ties to the even code), saturating at 6"""
    a = x.abs().clamp(max=6.0)
    mags = torch.tensor(E2M1, device=x.device)
    mids = (mags[1:] + mags[:-1]) / 2
    i = torch.bucketize(a, mids)  # mids[i-1] < a <= mids[i]
    tie = (i < 7) & (a == mids[i.clamp(max=6)]) & (i % 2 == 1)
    i = i + tie.long()
    return torch.where((x < 0) & (i > 0), i + 8, i).to(torch.uint8)


def e2m1_value(c):
    mags = torch.tensor(E2M1, device=c.device)
    v = mags[(c & 7).long()]
    return torch.where(c >= 8, -v, v)


def nibbles(codes):
    """[..., 2n] codes 0..15 -> [..., n] bytes, the even column in the low nibble"""
    return (codes[..., 0::2] | (codes[..., 1::2] << 4)).to(torch.uint8)


def words(q):
    """[..., 8] nibbles -> int32 words, nibble k in bits 4k"""
    shifts = torch.arange(0, 32, 4, device=q.device, dtype=torch.int64)
    w = (q.to(torch.int64) << shifts).sum(-1)
    return torch.where(w >= 2**31, w - 2**32, w).to(torch.int32)


def fp8_block(w, br, bc):
    rows, cols = w.shape
    gr, gc = -(-rows // br), -(-cols // bc)
    p = torch.zeros(gr * br, gc * bc, device=w.device)
    p[:rows, :cols] = w
    amax = p.abs().view(gr, br, gc, bc).amax(dim=(1, 3))
    s = torch.where(amax > 0, amax / 448.0, torch.ones_like(amax))
    se = s.repeat_interleave(br, 0).repeat_interleave(bc, 1)[:rows, :cols]
    codes = (w / se).clamp(-448.0, 448.0).to(torch.float8_e4m3fn)
    return codes, s, codes.float() * se


def int4(w, g, sym):
    rows, cols = w.shape
    wg = w.view(rows, cols // g, g)
    lo = wg.amin(-1).clamp(max=0.0)
    hi = wg.amax(-1).clamp(min=0.0)
    if sym:
        s = (torch.maximum(-lo, hi) * 2 / 15.0).clamp(min=1e-5).half().float()
        z = torch.full_like(s, 8.0)
    else:
        s = ((hi - lo) / 15.0).clamp(min=1e-5).half().float()
        z = torch.round(-lo / s).clamp(1, 15)
    q = (torch.round(wg / s[..., None]) + z[..., None]).clamp(0, 15)
    deq = ((q - z[..., None]) * s[..., None]).view(rows, cols)
    return q.view(rows, cols).to(torch.int64), s, z.to(torch.int64), deq


def ct_int4(w, g, sym):
    """compressed-tensors' 4-bit integers: signed q, bf16 scale, signed zero in [-8, 7]"""
    rows, cols = w.shape
    wg = w.view(rows, cols // g, g)
    lo = wg.amin(-1).clamp(max=0.0)
    hi = wg.amax(-1).clamp(min=0.0)
    if sym:
        s = (torch.maximum(-lo, hi) / 7.5).clamp(min=2.0 ** -23).bfloat16().float()
        z = torch.zeros_like(s)
    else:
        s = ((hi - lo) / 15.0).clamp(min=2.0 ** -23).bfloat16().float()
        z = torch.round(-8 - lo / s).clamp(-8, 7)
    q = torch.round(wg / s[..., None] + z[..., None]).clamp(-8, 7)
    deq = ((q - z[..., None]) * s[..., None]).view(rows, cols)
    return q.view(rows, cols).to(torch.int64), s, z.to(torch.int64), deq


def pack_rows(v):
    """[r, c] values 0..15 -> int32 [r, ceil(c/8)], column 8j + k in nibble k (zero-padded)"""
    r, c = v.shape
    p = torch.zeros(r, -(-c // 8) * 8, dtype=torch.int64, device=v.device)
    p[:, :c] = v
    return words(p.view(r, -1, 8))


def fp4(w, layout):
    rows, cols = w.shape
    bs = 32 if layout == "mxfp4" else 16
    wb = w.view(rows, cols // bs, bs)
    amax = wb.abs().amax(-1)
    g = None
    if layout == "mxfp4":
        safe = torch.where(amax > 0, amax, torch.ones_like(amax))
        e = torch.where(amax > 0, torch.floor(torch.log2(safe)) - 2, torch.zeros_like(amax))
        e = e.clamp(-127, 127)
        raw = (e + 127).to(torch.uint8)
        scale = torch.exp2(e)
    else:
        g = float(w.abs().max()) / (6.0 * 448.0) or 1.0
        g = torch.tensor(g, dtype=torch.float32).item()
        raw = (amax / 6.0 / g).clamp(max=448.0).to(torch.float8_e4m3fn)
        scale = raw.float() * g
    safe = torch.where(scale > 0, scale, torch.ones_like(scale))
    codes = torch.where(scale[..., None] > 0, e2m1_codes(wb / safe[..., None]),
                        torch.zeros_like(wb, dtype=torch.uint8))
    deq = (e2m1_value(codes) * scale[..., None]).view(rows, cols)
    return codes.view(rows, cols), raw, g, deq


def quantize_linear(a, name, w, out, deq):
    L = a.layout
    rows, cols = w.shape
    if L == "fp8-block":
        codes, s, d = fp8_block(w, *a.block)
        out[name + ".weight"] = codes
        out[name + ".weight_scale_inv"] = s
    elif L == "modelopt-fp8":  # one float32 scale a tensor, static input scale
        codes, s, d = fp8_block(w, rows, cols)
        out[name + ".weight"] = codes
        out[name + ".weight_scale"] = s.reshape(())
        out[name + ".input_scale"] = torch.tensor(4.0 / 448.0, dtype=torch.float32)
    elif L == "ct-int4":  # values plus 8: weights along the row, zero points along the column
        g = a.group if a.group > 0 else cols
        q, s, z, d = ct_int4(w, g, a.sym)
        out[name + ".weight_packed"] = pack_rows(q + 8)
        out[name + ".weight_scale"] = s.bfloat16()
        out[name + ".weight_shape"] = torch.tensor([rows, cols], dtype=torch.int64)
        if not a.sym:
            out[name + ".weight_zero_point"] = pack_rows((z + 8).t().contiguous()).t().contiguous()
    elif L in ("mxfp4", "nvfp4"):
        codes, raw, g, d = fp4(w, L)
        if L == "mxfp4":
            out[name + ".weight_blocks"] = nibbles(codes).view(rows, cols // 32, 16)
            out[name + ".weight_scales"] = raw
        else:
            out[name + ".weight"] = nibbles(codes)
            out[name + ".weight_scale"] = raw
            out[name + ".weight_scale_2"] = torch.tensor(g, dtype=torch.float32)
            out[name + ".input_scale"] = torch.tensor(1.0, dtype=torch.float32)
    else:
        g = a.group if a.group > 0 else cols
        q, s, z, d = int4(w, g, a.sym)
        out[name + ".scales"] = s.t().contiguous().half()  # [groups, out]
        if L == "awq":  # [in, out/8], word j nibble k: column 8j + AWQ_ORDER[k]
            order = torch.tensor(AWQ_ORDER, device=w.device)
            qt = q.t().contiguous().view(cols, rows // 8, 8)[..., order]
            zt = z.t().contiguous().view(cols // g, rows // 8, 8)[..., order]
            out[name + ".qweight"] = words(qt)
            out[name + ".qzeros"] = words(zt)
        else:  # [in/8, out]: input 8i + k in nibble k; zeros minus one for gptq
            out[name + ".qweight"] = words(q.t().contiguous().view(cols // 8, 8, rows)
                                           .permute(0, 2, 1))
            off = 1 if L == "gptq" else 0
            out[name + ".qzeros"] = words((z.t() - off).contiguous().view(cols // g, rows // 8, 8))
            out[name + ".g_idx"] = (torch.arange(cols, device=w.device) // g).to(torch.int32)
    if deq is not None:
        deq[name + ".weight"] = d.float()


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--layout", required=True,
                    choices=["fp8-block", "awq", "gptq", "gptq-v2", "mxfp4", "nvfp4",
                             "modelopt-fp8", "ct-int4"])
    ap.add_argument("--src", required=True)
    ap.add_argument("--out", required=True)
    ap.add_argument("--dequant")
    ap.add_argument("--block", type=int, nargs=2, default=(128, 128))
    ap.add_argument("--group", type=int, default=128)
    ap.add_argument("--sym", action="store_true")
    a = ap.parse_args()
    a.act_order, a.lm_head = False, False
    dev = "cuda" if torch.cuda.is_available() else "cpu"
    shards = sorted(f for f in os.listdir(a.src) if f.endswith(".safetensors")
                    and not f.startswith("reference"))
    for d in filter(None, (a.out, a.dequant)):
        os.makedirs(d, exist_ok=True)
        for f in os.listdir(a.src):
            if not f.endswith(".safetensors") and f not in ("config.json",
                                                            "model.safetensors.index.json"):
                shutil.copy(os.path.join(a.src, f), d)
    weight_map, dq_map = {}, {}
    for shard in shards:
        src = load_file(os.path.join(a.src, shard))
        out, deq = {}, ({} if a.dequant else None)
        for name, t in src.items():
            module = name[:-len(".weight")] if name.endswith(".weight") else None
            if module and module.split(".")[-1] in LINEARS and t.dim() == 2:
                quantize_linear(a, module, t.to(dev, torch.float32), out, deq)
            else:
                out[name] = t
                if deq is not None:
                    deq[name] = t.float()
        out = {k: v.contiguous().cpu() for k, v in out.items()}
        save_file(out, os.path.join(a.out, shard), metadata={"format": "pt"})
        weight_map.update({k: shard for k in out})
        if deq is not None:
            save_file({k: v.contiguous().cpu() for k, v in deq.items()},
                      os.path.join(a.dequant, shard), metadata={"format": "pt"})
            dq_map.update({k: shard for k in deq})
        print(f"{shard}: {len(out)} tensors", flush=True)
    if len(shards) > 1:
        json.dump({"metadata": {}, "weight_map": weight_map},
                  open(os.path.join(a.out, "model.safetensors.index.json"), "w"), indent=1)
        if a.dequant:
            json.dump({"metadata": {}, "weight_map": dq_map},
                      open(os.path.join(a.dequant, "model.safetensors.index.json"), "w"))
    cfg = json.load(open(os.path.join(a.src, "config.json")))
    if a.dequant:
        json.dump(cfg, open(os.path.join(a.dequant, "config.json"), "w"), indent=1)
    cfg["quantization_config"] = quant_config(a)
    json.dump(cfg, open(os.path.join(a.out, "config.json"), "w"), indent=1)


if __name__ == "__main__":
    main()
