#!/usr/bin/env python3
"""Quantizes a small bf16/f16/f32 Hugging Face checkpoint into a published quantized layout,
and writes beside it the same weights dequantized (float32), for atlas's tests.

  python3 tools/quant/quantize.py --layout fp8-block --src tests/data/small/qk-norm \\
      --out /tmp/q --dequant /tmp/q-float [--block 128 128] [--group 128] [--act-order]

Layouts, each written as its published format says (not as atlas reads it):
  fp8-block   quant_method fp8 (Qwen3-*-FP8, DeepSeek): e4m3 weight, float32
              weight_scale_inv [ceil(out/br), ceil(in/bc)] = amax(block) / 448, multiplied
  ct-tensor   compressed-tensors float-quantized, strategy tensor: weight_scale [1]
  ct-channel  ... strategy channel: weight_scale [out, 1] (bf16)
  ct-block    ... strategy block: weight_scale [ceil(out/br), ceil(in/bc)]
  fbgemm      quant_method fbgemm_fp8 (FbgemmFp8Config): e4m3 weight, float32 weight_scale
              [out, 1] = amax(row) / 448, multiplied; modules_to_not_convert ["lm_head"]
  awq         AutoAWQ version gemm: qweight int32 [in, out/8] and qzeros [in/g, out/8] with
              AWQ's nibble order (nibble i holds column 8j + [0,2,4,6,1,3,5,7][i]), float16
              scales [in/g, out]; asymmetric, w = (q - z) * s
  gptq        AutoGPTQ 4-bit, checkpoint_format gptq: qweight int32 [in/8, out] (input 8i+k in
              nibble k), qzeros [groups, out/8] holding zero - 1, float16 scales, int32 g_idx;
              --sym (zero 8) or asymmetric, --act-order (desc_act: a permuted g_idx)
  gptq-v2     the same with checkpoint_format gptq_v2 (zeros as they are)
  mxfp4       quant_method mxfp4 (gpt-oss, OCP MX): uint8 weight_blocks [out, in/32, 16], two
              e2m1 codes a byte (the even column in the low nibble), uint8 e8m0 weight_scales
              [out, in/32] = floor(log2(amax)) - 2 + 127; w = e2m1 * 2^(scale - 127)
  nvfp4       ModelOpt quant_algo NVFP4: uint8 weight [out, in/2] packed as above, e4m3
              weight_scale [out, in/16] = amax(block) / 6 / weight_scale_2, float32
              weight_scale_2 = amax(tensor) / (6 * 448), float32 input_scale (W4A4's, unused
              weight-only); w = e2m1 * (e4m3(scale) * weight_scale_2)
  ct-nvfp4    compressed-tensors nvfp4-pack-quantized: weight_packed, weight_scale and
              weight_global_scale = 6 * 448 / amax(tensor), which divides:
              w = e2m1 * (e4m3(scale) / weight_global_scale)
  modelopt-fp8     ModelOpt quant_algo FP8 in config.json's quantization_config (the form
              ModelOpt's convert_hf_quant_config_format writes: config_groups, "ignore",
              quant_method modelopt): e4m3 weight, float32 weight_scale [] = amax(tensor) /
              448, multiplied, and float32 input_scale [] (static activations, W8A8)
  modelopt-fp8-hf  the same tensors with config.json untouched and hf_quant_config.json
              beside it: {"producer": {"name": "modelopt"}, "quantization": {"quant_algo":
              "FP8", "kv_cache_quant_algo": "FP8", "exclude_modules": ["lm_head",
              "*.mlp.down_proj"]}} (fnmatch patterns: down_proj stays unquantized), with the
              FP8 KV cache's float32 self_attn.k_proj.k_scale and v_proj.v_scale []
  ct-int4     compressed-tensors pack-quantized, 4-bit integers (W4A16): signed values q in
              [-8, 7] stored as q + 8, eight to an int32, weight_packed [out, ceil(in/8)]
              (column 8j+k in nibble k), bf16 weight_scale [out, groups], int64 weight_shape
              [2]; asymmetric: weight_zero_point [ceil(out/8), groups] packed the same way
              along the output rows (row 8i+k in nibble k); symmetric scale = amax / 7.5,
              asymmetric (max - min) / 15 with zero round(-min / scale) - 8;
              w = (q - zero) * scale; --group -1: strategy channel; --act-order: actorder
              group with int32 weight_g_idx [in]
Rounding is round-to-nearest (GPTQ's and AWQ's searches choose other values, not another
layout). The dequantized checkpoint holds, in float32, exactly what each format's formula
gives: e4m3(code) * scale, or (q - zero) * scale with the stored float16 scale. Pure Python
(struct): meant for small widths (CI); it takes seconds on the tests' models."""
import argparse
import bisect
import fnmatch
import json
import math
import os
import random
import shutil
import struct

LINEARS = ("q_proj", "k_proj", "v_proj", "o_proj", "gate_proj", "up_proj", "down_proj")


# ---- safetensors -------------------------------------------------------------------------
def read_st(path):
    with open(path, "rb") as f:
        n = struct.unpack("<Q", f.read(8))[0]
        head = json.loads(f.read(n))
        data = f.read()
    out = {}
    for name, t in head.items():
        if name == "__metadata__":
            continue
        b, e = t["data_offsets"]
        raw = data[b:e]
        dt = t["dtype"]
        if dt == "BF16":
            vals = [struct.unpack("<f", struct.pack("<I", h << 16))[0]
                    for h in struct.unpack("<%dH" % (len(raw) // 2), raw)]
        elif dt == "F16":
            vals = list(struct.unpack("<%de" % (len(raw) // 2), raw))
        elif dt == "F32":
            vals = list(struct.unpack("<%df" % (len(raw) // 4), raw))
        else:
            raise SystemExit("%s: %s: dtype %s" % (path, name, dt))
        out[name] = (t["shape"], vals)
    return out


def write_st(path, tensors):
    """tensors: name -> (dtype, shape, bytes)"""
    head, blobs, off = {}, [], 0
    for name in sorted(tensors):
        dt, shape, raw = tensors[name]
        head[name] = {"dtype": dt, "shape": shape, "data_offsets": [off, off + len(raw)]}
        blobs.append(raw)
        off += len(raw)
    h = json.dumps(head, separators=(",", ":")).encode()
    h += b" " * (-len(h) % 8)
    with open(path, "wb") as f:
        f.write(struct.pack("<Q", len(h)) + h + b"".join(blobs))


def f32(x):
    return struct.unpack("<f", struct.pack("<f", x))[0]


def f16(x):
    return struct.unpack("<e", struct.pack("<e", x))[0]


def bf16(x):
    u = struct.unpack("<I", struct.pack("<f", x))[0]
    u = (u + 0x7FFF + ((u >> 16) & 1)) >> 16
    return struct.unpack("<f", struct.pack("<I", u << 16))[0]


def pack(fmt, vals):
    return struct.pack("<%d%s" % (len(vals), fmt), *vals)


def pack_bf16(vals):
    return pack("H", [struct.unpack("<I", struct.pack("<f", bf16(v)))[0] >> 16 for v in vals])


# ---- e4m3 (OCP FP8: bias 7, no infinities, 0x7F NaN, max 448) -----------------------------
def e4m3_value(c):
    s = -1.0 if c & 0x80 else 1.0
    e, m = (c >> 3) & 0xF, c & 7
    if e == 0xF and m == 7:
        return math.nan
    if e == 0:
        return s * m / 8.0 * 2.0 ** -6
    return s * (1 + m / 8.0) * 2.0 ** (e - 7)


POS = [(e4m3_value(c), c) for c in range(0x7F)]  # 0 .. 448, increasing with the code
POS_V = [v for v, _ in POS]


def e4m3_round(x):
    """Nearest code, ties to the even code; saturates at 448."""
    a = min(abs(x), 448.0)
    i = bisect.bisect_left(POS_V, a)
    if i == len(POS_V):
        i -= 1
    elif i > 0 and (a - POS_V[i - 1] < POS_V[i] - a or
                    (a - POS_V[i - 1] == POS_V[i] - a and POS[i - 1][1] % 2 == 0)):
        i -= 1
    c = POS[i][1]
    return c | 0x80 if x < 0 and c else c


# ---- layouts ------------------------------------------------------------------------------
def fp8(w, rows, cols, br, bc):
    """codes [rows*cols], scales [ceil(rows/br) * ceil(cols/bc)], dequantized [rows*cols]"""
    gr, gc = -(-rows // br), -(-cols // bc)
    scales = []
    for i in range(gr):
        for j in range(gc):
            amax = max(abs(w[r * cols + c]) for r in range(i * br, min(rows, i * br + br))
                       for c in range(j * bc, min(cols, j * bc + bc)))
            scales.append(f32(amax / 448.0) if amax > 0 else 1.0)
    codes, deq = [], []
    for r in range(rows):
        for c in range(cols):
            s = scales[(r // br) * gc + c // bc]
            code = e4m3_round(w[r * cols + c] / s)
            codes.append(code)
            deq.append(f32(e4m3_value(code) * s))
    return codes, scales, deq


def int4_groups(w, rows, cols, gidx, n_groups, sym):
    """per (row, group): float16 scale and integer zero; q [rows*cols]; dequantized"""
    scale, zero = [[0.0] * n_groups for _ in range(rows)], [[0] * n_groups for _ in range(rows)]
    for r in range(rows):
        for g in range(n_groups):
            vals = [w[r * cols + c] for c in range(cols) if gidx[c] == g]
            lo, hi = min(min(vals), 0.0), max(max(vals), 0.0)
            if sym:
                amax = max(-lo, hi)
                s, z = f16(max(2 * amax / 15.0, 1e-5)), 8
            else:
                s = f16(max((hi - lo) / 15.0, 1e-5))
                z = min(15, max(1, round(-lo / s)))  # >= 1: gptq's "zero - 1" stays a nibble
            scale[r][g], zero[r][g] = s, z
    q, deq = [], []
    for r in range(rows):
        for c in range(cols):
            g = gidx[c]
            v = min(15, max(0, round(w[r * cols + c] / scale[r][g]) + zero[r][g]))
            q.append(v)
            deq.append(f32((v - zero[r][g]) * scale[r][g]))
    return scale, zero, q, deq


# ---- e2m1 (OCP FP4: sign, 2 exponent bits bias 1, 1 mantissa bit) -------------------------
E2M1 = [0.0, 0.5, 1.0, 1.5, 2.0, 3.0, 4.0, 6.0]


def e2m1_value(c):
    return -E2M1[c & 7] if c & 8 else E2M1[c & 7]


def e2m1_round(x):
    """Nearest code, ties to the even code; saturates at 6."""
    a = min(abs(x), 6.0)
    i = bisect.bisect_left(E2M1, a)
    if i == len(E2M1):
        i -= 1
    elif i > 0 and (a - E2M1[i - 1] < E2M1[i] - a or
                    (a - E2M1[i - 1] == E2M1[i] - a and (i - 1) % 2 == 0)):
        i -= 1
    return i | 8 if x < 0 and i else i


def fp4(w, rows, cols, layout):
    """codes [rows*cols], raw block scales [rows * cols/bs], global scale (or None),
    dequantized [rows*cols]"""
    bs = 32 if layout == "mxfp4" else 16
    amax_t = max(abs(v) for v in w) or 1.0
    g = None
    if layout == "nvfp4":
        g = f32(amax_t / (6.0 * 448.0))
    elif layout == "ct-nvfp4":
        g = f32(6.0 * 448.0 / amax_t)
    raw, block_scale = [], []
    for r in range(rows):
        for j in range(0, cols, bs):
            amax = max(abs(w[r * cols + c]) for c in range(j, j + bs))
            if layout == "mxfp4":
                e = math.floor(math.log2(amax)) - 2 if amax > 0 else 0
                e = max(-127, min(127, e))
                raw.append(e + 127)
                block_scale.append(2.0 ** e)
                continue
            code = e4m3_round(amax / 6.0 / g if layout == "nvfp4" else amax / 6.0 * g)
            raw.append(code)
            v = e4m3_value(code)
            block_scale.append(f32(v * g) if layout == "nvfp4" else f32(v / g))
    codes, deq = [], []
    for r in range(rows):
        for c in range(cols):
            s = block_scale[r * (cols // bs) + c // bs]
            code = e2m1_round(w[r * cols + c] / s) if s else 0
            codes.append(code)
            deq.append(f32(e2m1_value(code) * s))
    return codes, raw, g, deq


def pack_nibbles(codes):
    return bytes(codes[i] | (codes[i + 1] << 4) for i in range(0, len(codes), 2))


def words(nibbles):
    return [sum(n << (4 * i) for i, n in enumerate(nibbles[k:k + 8])) - (1 << 32)
            if nibbles[k + 7] >= 8 else sum(n << (4 * i) for i, n in enumerate(nibbles[k:k + 8]))
            for k in range(0, len(nibbles), 8)]


AWQ_ORDER = [0, 2, 4, 6, 1, 3, 5, 7]


def awq_pack(mat, n_rows, n_cols):
    """mat[i][j] (i: input or group, j: output) -> int32 [n_rows, n_cols/8], AWQ's order"""
    out = []
    for i in range(n_rows):
        for j in range(0, n_cols, 8):
            out += words([mat[i][j + AWQ_ORDER[k]] for k in range(8)])
    return out


def ct_int4(w, rows, cols, gidx, n_groups, sym):
    """compressed-tensors' calculate_qparams for 4-bit integers (range [-8, 7]): per (row,
    group) a bf16 scale and a signed zero; signed q [rows*cols]; dequantized"""
    scale, zero = [[0.0] * n_groups for _ in range(rows)], [[0] * n_groups for _ in range(rows)]
    for r in range(rows):
        for g in range(n_groups):
            vals = [w[r * cols + c] for c in range(cols) if gidx[c] == g]
            lo, hi = min(min(vals), 0.0), max(max(vals), 0.0)
            if sym:
                s, z = bf16(max(max(-lo, hi) / 7.5, 2.0 ** -23)), 0
            else:
                s = bf16(max((hi - lo) / 15.0, 2.0 ** -23))
                z = min(7, max(-8, round(-8 - lo / s)))
            scale[r][g], zero[r][g] = s, z
    q, deq = [], []
    for r in range(rows):
        for c in range(cols):
            g = gidx[c]
            v = min(7, max(-8, round(w[r * cols + c] / scale[r][g] + zero[r][g])))
            q.append(v)
            deq.append(f32((v - zero[r][g]) * scale[r][g]))
    return scale, zero, q, deq


def pack_int32(mat, n_rows, n_cols, dim):
    """compressed-tensors' pack_to_int32: signed 4-bit mat[i][j] + 8, eight to a word along
    dim (1: the columns of a row, 0: the rows of a column), zero-padded"""
    out = []
    if dim == 1:
        for i in range(n_rows):
            row = [mat[i][j] + 8 for j in range(n_cols)] + [0] * (-n_cols % 8)
            out += words(row)
        return out
    padded = [[mat[i][j] + 8 for j in range(n_cols)] for i in range(n_rows)]
    padded += [[0] * n_cols] * (-n_rows % 8)
    for i in range(0, len(padded), 8):
        for j in range(n_cols):
            out += words([padded[i + k][j] for k in range(8)])
    return out


def quantize_ct_int4(a, name, w, rows, cols, out, deq):
    g = a.group if a.group > 0 else cols
    n_groups = cols // g
    gidx = [c // g for c in range(cols)]
    if a.act_order:
        perm = list(range(cols))
        random.Random(name).shuffle(perm)
        for pos, c in enumerate(perm):
            gidx[c] = pos // g
        out[name + ".weight_g_idx"] = ("I32", [cols], pack("i", gidx))
    scale, zero, q, d = ct_int4(w, rows, cols, gidx, n_groups, a.sym)
    deq[name + ".weight"] = d
    qm = [[q[r * cols + c] for c in range(cols)] for r in range(rows)]
    out[name + ".weight_packed"] = ("I32", [rows, -(-cols // 8)],
                                    pack("i", pack_int32(qm, rows, cols, 1)))
    flat = [scale[r][gg] for r in range(rows) for gg in range(n_groups)]
    out[name + ".weight_scale"] = ("BF16", [rows, n_groups], pack_bf16(flat))
    out[name + ".weight_shape"] = ("I64", [2], pack("q", [rows, cols]))
    if not a.sym:
        out[name + ".weight_zero_point"] = ("I32", [-(-rows // 8), n_groups],
                                            pack("i", pack_int32(zero, rows, n_groups, 0)))


def quantize_linear(a, name, w, rows, cols, out, deq):
    L = a.layout
    if L == "ct-int4":
        return quantize_ct_int4(a, name, w, rows, cols, out, deq)
    if L.startswith("modelopt-fp8"):  # one float32 scale a tensor, static input scale
        codes, scales, d = fp8(w, rows, cols, rows, cols)
        out[name + ".weight"] = ("F8_E4M3", [rows, cols], bytes(codes))
        out[name + ".weight_scale"] = ("F32", [], pack("f", scales))
        out[name + ".input_scale"] = ("F32", [], pack("f", [f32(4.0 / 448.0)]))
        deq[name + ".weight"] = d
        return
    if L in ("mxfp4", "nvfp4", "ct-nvfp4"):
        codes, raw, g, d = fp4(w, rows, cols, L)
        deq[name + ".weight"] = d
        if L == "mxfp4":
            out[name + ".weight_blocks"] = ("U8", [rows, cols // 32, 16], pack_nibbles(codes))
            out[name + ".weight_scales"] = ("U8", [rows, cols // 32], bytes(raw))
            return
        ct = L == "ct-nvfp4"
        out[name + (".weight_packed" if ct else ".weight")] = ("U8", [rows, cols // 2],
                                                               pack_nibbles(codes))
        out[name + ".weight_scale"] = ("F8_E4M3", [rows, cols // 16], bytes(raw))
        out[name + (".weight_global_scale" if ct else ".weight_scale_2")] = (
            "F32", [1] if ct else [], pack("f", [g]))
        out[name + (".input_global_scale" if ct else ".input_scale")] = (
            "F32", [1] if ct else [], pack("f", [1.0]))
        return
    if L.startswith("fp8") or L.startswith("ct-") or L == "fbgemm":
        strategy = {"fp8-block": "block", "ct-block": "block", "ct-tensor": "tensor",
                    "ct-channel": "channel", "fbgemm": "channel"}[L]
        br, bc = {"block": a.block, "tensor": (rows, cols), "channel": (1, cols)}[strategy]
        codes, scales, d = fp8(w, rows, cols, br, bc)
        out[name + ".weight"] = ("F8_E4M3", [rows, cols], bytes(codes))
        if L == "fp8-block":
            out[name + ".weight_scale_inv"] = ("F32", [-(-rows // br), -(-cols // bc)],
                                               pack("f", scales))
        elif strategy == "tensor":
            out[name + ".weight_scale"] = ("F32", [1], pack("f", scales))
        elif L == "fbgemm":  # FbgemmFp8Linear: weight_scale float32 [out, 1]
            out[name + ".weight_scale"] = ("F32", [rows, 1], pack("f", scales))
        elif strategy == "channel":
            out[name + ".weight_scale"] = ("BF16", [rows, 1], pack_bf16(scales))
            # bf16 scales: the dequantized weights use the stored (rounded) scale
            d = [f32(e4m3_value(c) * bf16(scales[i // cols])) for i, c in enumerate(codes)]
        else:
            out[name + ".weight_scale"] = ("F32", [-(-rows // br), -(-cols // bc)],
                                           pack("f", scales))
        deq[name + ".weight"] = d
        return
    g = a.group if a.group > 0 else cols
    n_groups = cols // g
    gidx = [c // g for c in range(cols)]
    if a.act_order:
        perm = list(range(cols))
        random.Random(name).shuffle(perm)
        for pos, c in enumerate(perm):
            gidx[c] = pos // g
    scale, zero, q, d = int4_groups(w, rows, cols, gidx, n_groups, a.sym)
    deq[name + ".weight"] = d
    scales_t = [scale[r][gg] for gg in range(n_groups) for r in range(rows)]  # [groups, out]
    out[name + ".scales"] = ("F16", [n_groups, rows], pack("e", scales_t))
    if L == "awq":
        qt = [[q[r * cols + c] for r in range(rows)] for c in range(cols)]  # [in][out]
        zt = [[zero[r][gg] for r in range(rows)] for gg in range(n_groups)]
        out[name + ".qweight"] = ("I32", [cols, rows // 8], pack("i", awq_pack(qt, cols, rows)))
        out[name + ".qzeros"] = ("I32", [n_groups, rows // 8], pack("i", awq_pack(zt, n_groups, rows)))
        return
    qw = []
    for i in range(0, cols, 8):  # [in/8, out]: input 8i+k in nibble k
        for r in range(rows):
            qw += words([q[r * cols + i + k] for k in range(8)])
    off = 1 if L == "gptq" else 0
    qz = []
    for gg in range(n_groups):
        nib = [zero[r][gg] - off for r in range(rows)]
        qz += words(nib)
    out[name + ".qweight"] = ("I32", [cols // 8, rows], pack("i", qw))
    out[name + ".qzeros"] = ("I32", [n_groups, rows // 8], pack("i", qz))
    out[name + ".g_idx"] = ("I32", [cols], pack("i", gidx))


MODELOPT_PRODUCER = {"name": "modelopt", "version": "0.29.0"}
MODELOPT_HF_EXCLUDE = ["lm_head", "*.mlp.down_proj"]


def quant_config(a):
    L = a.layout
    if L == "modelopt-fp8":  # ModelOpt's convert_hf_quant_config_format
        f8 = {"dynamic": False, "num_bits": 8, "type": "float"}
        return {"config_groups": {"group_0": {"input_activations": f8, "weights": f8,
                                              "targets": ["Linear"]}},
                "ignore": ["lm_head"], "quant_algo": "FP8", "producer": MODELOPT_PRODUCER,
                "quant_method": "modelopt"}
    if L == "ct-int4":
        w = {"num_bits": 4, "type": "int", "symmetric": a.sym, "dynamic": False,
             "strategy": "group" if a.group > 0 else "channel",
             "group_size": a.group if a.group > 0 else None,
             "actorder": "group" if a.act_order else None, "observer": "minmax"}
        return {"quant_method": "compressed-tensors", "format": "pack-quantized",
                "quantization_status": "compressed", "kv_cache_scheme": None,
                "config_groups": {"group_0": {"targets": ["Linear"], "weights": w,
                                              "input_activations": None,
                                              "output_activations": None}},
                "ignore": ["lm_head"]}
    if L == "mxfp4":  # gpt-oss's, with a glob as it writes them
        return {"quant_method": "mxfp4",
                "modules_to_not_convert": ["model.layers.*.mlp.router", "model.embed_tokens",
                                           "lm_head"]}
    if L == "nvfp4":
        return {"quant_method": "modelopt", "quant_algo": "NVFP4", "group_size": 16,
                "kv_cache_quant_algo": None, "exclude_modules": ["lm_head"]}
    if L == "ct-nvfp4":
        w = {"num_bits": 4, "type": "float", "symmetric": True, "dynamic": False,
             "strategy": "tensor_group", "group_size": 16}
        i = dict(w, dynamic="local")
        return {"quant_method": "compressed-tensors", "format": "nvfp4-pack-quantized",
                "quantization_status": "compressed",
                "config_groups": {"group_0": {"targets": ["Linear"], "weights": w,
                                              "input_activations": i}},
                "ignore": ["lm_head"]}
    if L == "fp8-block":
        return {"quant_method": "fp8", "fmt": "e4m3", "activation_scheme": "dynamic",
                "weight_block_size": list(a.block)}
    if L.startswith("ct-"):
        w = {"num_bits": 8, "type": "float", "symmetric": True, "dynamic": False,
             "strategy": L[3:]}
        if L == "ct-block":
            w["block_structure"] = list(a.block)
        return {"quant_method": "compressed-tensors", "format": "float-quantized",
                "quantization_status": "compressed",
                "config_groups": {"group_0": {"targets": ["Linear"], "weights": w,
                                              "input_activations": None}},
                "ignore": [] if a.lm_head else ["lm_head"]}
    if L == "fbgemm":  # transformers' FbgemmFp8Config
        return {"quant_method": "fbgemm_fp8", "activation_scale_ub": 1200.0,
                "modules_to_not_convert": ["lm_head"]}
    if L == "awq":
        return {"quant_method": "awq", "version": "gemm", "bits": 4, "group_size": a.group,
                "zero_point": True}
    return {"quant_method": "gptq", "bits": 4, "group_size": a.group, "desc_act": a.act_order,
            "sym": a.sym, "checkpoint_format": "gptq" if L == "gptq" else "gptq_v2"}


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--layout", required=True, choices=["fp8-block", "ct-tensor", "ct-channel",
                                                         "ct-block", "awq", "gptq", "gptq-v2",
                                                         "mxfp4", "nvfp4", "ct-nvfp4", "fbgemm",
                                                         "modelopt-fp8", "modelopt-fp8-hf",
                                                         "ct-int4"])
    ap.add_argument("--src", required=True)
    ap.add_argument("--out", required=True)
    ap.add_argument("--dequant", required=True)
    ap.add_argument("--block", type=int, nargs=2, default=(128, 128))
    ap.add_argument("--group", type=int, default=128, help="INT4 group (-1: one a row)")
    ap.add_argument("--sym", action="store_true",
                    help="GPTQ, ct-int4: symmetric (no zero points stored)")
    ap.add_argument("--act-order", action="store_true", help="GPTQ: desc_act with a g_idx")
    ap.add_argument("--lm-head", action="store_true",
                    help="compressed-tensors: quantize lm_head too (untied models)")
    a = ap.parse_args()
    cfg = json.load(open(os.path.join(a.src, "config.json")))
    src = read_st(os.path.join(a.src, "model.safetensors"))
    out, deq, dense = {}, {}, {}
    for name, (shape, vals) in src.items():
        module = name[:-len(".weight")] if name.endswith(".weight") else None
        lin = module and (module.split(".")[-1] in LINEARS or (module == "lm_head" and a.lm_head))
        if lin and a.layout == "modelopt-fp8-hf":  # exclude_modules: fnmatch patterns
            lin = not any(fnmatch.fnmatchcase(module, p) for p in MODELOPT_HF_EXCLUDE)
        if lin and len(shape) == 2:
            quantize_linear(a, module, vals, shape[0], shape[1], out, deq)
        else:
            dense[name] = (shape, vals)
    for name, (shape, vals) in dense.items():
        out[name] = ("F32", shape, pack("f", vals))
    if a.layout == "modelopt-fp8-hf":  # the FP8 KV cache's scales, per layer
        for name in list(out):
            if name.endswith(".self_attn.k_proj.weight"):
                attn = name[:-len(".k_proj.weight")]
                out[attn + ".k_proj.k_scale"] = ("F32", [], pack("f", [f32(2.0 / 448.0)]))
                out[attn + ".v_proj.v_scale"] = ("F32", [], pack("f", [f32(3.0 / 448.0)]))
    for d in (a.out, a.dequant):
        os.makedirs(d, exist_ok=True)
        for f in os.listdir(a.src):
            if f not in ("config.json", "model.safetensors") and not f.startswith("reference"):
                shutil.copy(os.path.join(a.src, f), d)
    write_st(os.path.join(a.out, "model.safetensors"), out)
    full = {n: ("F32", s, pack("f", v)) for n, (s, v) in dense.items()}
    for n, v in deq.items():
        full[n] = ("F32", src[n][0], pack("f", v))
    write_st(os.path.join(a.dequant, "model.safetensors"), full)
    json.dump(cfg, open(os.path.join(a.dequant, "config.json"), "w"), indent=1)
    if a.layout == "modelopt-fp8-hf":  # ModelOpt's older export: config.json untouched
        hf = {"producer": MODELOPT_PRODUCER,
              "quantization": {"quant_algo": "FP8", "kv_cache_quant_algo": "FP8",
                               "exclude_modules": MODELOPT_HF_EXCLUDE}}
        json.dump(hf, open(os.path.join(a.out, "hf_quant_config.json"), "w"), indent=4)
    else:
        cfg["quantization_config"] = quant_config(a)
    json.dump(cfg, open(os.path.join(a.out, "config.json"), "w"), indent=1)


if __name__ == "__main__":
    main()
