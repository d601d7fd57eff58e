"""gpt-oss checkpoints for the conformance suite, in the Hub's tensor layout (make.py uses it).

transformers keeps gpt-oss's experts in memory in a layout of its own, which its versions
change (and MXFP4 is dequantized or swizzled at load), so the suite writes the tensors as
openai/gpt-oss-20b publishes them, by name, and lets from_pretrained read them back:

- attention: q/k/v/o_proj weight and bias, self_attn.sinks [H];
- mlp.router.weight [E, d] and .bias [E];
- the experts of a layer stacked: mlp.experts.gate_up_proj [E, d, 2f] (x @ W; gate and up
  interleaved in the even and odd columns) and .gate_up_proj_bias [E, 2f], down_proj
  [E, f, d] and .down_proj_bias [E, d], in bf16; or, MXFP4, gate_up_proj_blocks
  [E, 2f, d/32, 16] with gate_up_proj_scales [E, 2f, d/32] and down_proj_blocks
  [E, d, f/32, 16] with down_proj_scales [E, d, f/32]: [out, in] rows of e2m1 codes, the even
  column in a byte's low nibble, one e8m0 scale (2^(s - 127)) per 32 inputs, as
  transformers' integrations/mxfp4.py convert_moe_packed_tensors reads them.

An MXFP4 checkpoint comes with its dequantization written as a bf16 one (exact: an e2m1 code
times a power of two has at most two significant bits), which is what the reference reads, so
that atlas on the MXFP4 files and transformers see the same weights.
"""
import math

FP4_VALUES = [0.0, 0.5, 1.0, 1.5, 2.0, 3.0, 4.0, 6.0,
              -0.0, -0.5, -1.0, -1.5, -2.0, -3.0, -4.0, -6.0]

# The modules gpt-oss leaves unquantized, as openai/gpt-oss-20b's config.json lists them.
MXFP4_CONFIG = {"quant_method": "mxfp4",
                "modules_to_not_convert": ["model.layers.*.self_attn", "model.layers.*.mlp.router",
                                           "model.embed_tokens", "lm_head"]}

# The experts' gate|up weights drawn with this std times 1/sqrt(hidden): gate values of
# about N(0, 3.5^2) reach swiglu_limit 7 a few times in a hundred, so that both clamps are
# exercised at every width; down_proj is scaled down to keep the residual stream O(1).
GATE_STD = 3.5
DOWN_STD = 0.25


def layout(cfg, router_std=1.0):
    """Every tensor of cfg's GptOssForCausalLM with bf16 experts, in the Hub's order:
    (name, shape, std, base) of the normal draw that makes it."""
    d, f, E = cfg["hidden_size"], cfg["intermediate_size"], cfg["num_local_experts"]
    H, K = cfg["num_attention_heads"], cfg["num_key_value_heads"]
    hd, V = cfg.get("head_dim", 64), cfg["vocab_size"]
    out = [("model.embed_tokens.weight", (V, d), 1.0, 0.0)]
    for layer in range(cfg["num_hidden_layers"]):
        p = f"model.layers.{layer}."
        out += [(p + "input_layernorm.weight", (d,), 0.1, 1.0),
                (p + "post_attention_layernorm.weight", (d,), 0.1, 1.0)]
        for n, rows in (("q", H * hd), ("k", K * hd), ("v", K * hd)):
            out += [(p + f"self_attn.{n}_proj.weight", (rows, d), 1 / math.sqrt(d), 0.0),
                    (p + f"self_attn.{n}_proj.bias", (rows,), 0.1, 0.0)]
        out += [(p + "self_attn.o_proj.weight", (d, H * hd), 1 / math.sqrt(H * hd), 0.0),
                (p + "self_attn.o_proj.bias", (d,), 0.1, 0.0),
                (p + "self_attn.sinks", (H,), 1.0, 0.0),
                (p + "mlp.router.weight", (E, d), router_std / math.sqrt(d), 0.0),
                (p + "mlp.router.bias", (E,), 0.1, 0.0),
                (p + "mlp.experts.gate_up_proj", (E, d, 2 * f), GATE_STD / math.sqrt(d), 0.0),
                (p + "mlp.experts.gate_up_proj_bias", (E, 2 * f), 0.1, 0.0),
                (p + "mlp.experts.down_proj", (E, f, d), DOWN_STD / math.sqrt(f), 0.0),
                (p + "mlp.experts.down_proj_bias", (E, d), 0.1, 0.0)]
    out += [("model.norm.weight", (d,), 0.1, 1.0), ("lm_head.weight", (V, d), 1 / math.sqrt(d), 0.0)]
    return out


def tensors(cfg, seed, router_std):
    """Every tensor of layout(cfg) drawn on the GPU from seed, bf16 on the CPU."""
    import torch
    g = torch.Generator(device="cuda").manual_seed(seed)
    sd = {}
    for name, shape, std, base in layout(cfg, router_std):
        x = base + std * torch.randn(shape, generator=g, device="cuda")
        sd[name] = x.to(torch.bfloat16).cpu().contiguous()
    return sd


def _mxfp4_one(x):
    """One expert [out, in] (float32, on the GPU): codes [out, in] (int64), exponents
    [out, in/32, 1] and the dequantized values [out, in]."""
    import torch
    out, n_in = x.shape
    b = x.reshape(out, n_in // 32, 32)
    amax = b.abs().amax(-1, keepdim=True).clamp(min=2.0 ** -126)
    exp = torch.ceil(torch.log2(amax / 6.0)).clamp(-127, 127)
    exp = torch.where(amax / torch.exp2(exp) > 6.0, exp + 1, exp)  # log2's rounding
    q = b / torch.exp2(exp)
    lut = torch.tensor(FP4_VALUES, device=x.device)
    mag = (q.abs().unsqueeze(-1) - lut[:8]).abs().argmin(-1)
    code = mag + 8 * (q < 0).long()
    deq = (lut[code] * torch.exp2(exp)).reshape(out, n_in)
    return code.reshape(out, n_in), exp, deq


def to_mxfp4(w):
    """An expert stack [E, in, out] (x @ W) as MXFP4: blocks [E, out, in/32, 16] and scales
    [E, out, in/32] (uint8), and its exact dequantization [E, in, out] in bf16. Each block of
    32 takes the smallest power of two that brings its largest magnitude within 6, and each
    value the nearest e2m1 code (the lower magnitude on a tie). One expert at a time on the
    GPU: a whole stack's intermediates would not fit at real widths."""
    import torch
    E, n_in, out = w.shape
    assert n_in % 32 == 0, f"{n_in} inputs are not whole MXFP4 blocks"
    blocks = torch.empty(E, out, n_in // 32, 16, dtype=torch.uint8)
    scales = torch.empty(E, out, n_in // 32, dtype=torch.uint8)
    deq = torch.empty(E, n_in, out, dtype=torch.bfloat16)
    for e in range(E):
        x = w[e].to("cuda", torch.float32).t().contiguous()  # [out, in]
        code, exp, d = _mxfp4_one(x)
        assert torch.equal(d.to(torch.bfloat16).float(), d), "MXFP4 value not exact in bf16"
        pairs = code.reshape(out, n_in // 32, 16, 2)
        blocks[e] = (pairs[..., 0] | (pairs[..., 1] << 4)).to(torch.uint8).cpu()
        scales[e] = (exp.squeeze(-1) + 127).to(torch.uint8).cpu()
        deq[e] = d.t().to(torch.bfloat16).cpu()
    return blocks, scales, deq


def mxfp4(sd):
    """sd with its experts in MXFP4 (the Hub's _blocks / _scales), and sd with them
    dequantized (bf16, the reference's)."""
    q, dq = {}, {}
    for k, v in sd.items():
        if k.endswith(".mlp.experts.gate_up_proj") or k.endswith(".mlp.experts.down_proj"):
            blocks, scales, deq = to_mxfp4(v)
            q[k + "_blocks"], q[k + "_scales"], dq[k] = blocks, scales, deq
        else:
            q[k] = dq[k] = v
    return q, dq


def check_loaded(name, info):
    """from_pretrained's loading info: every tensor written was read and nothing is missing
    (a transformers that renamed or dropped one would make a reference of another model)."""
    bad = {k: sorted(v) for k, v in info.items() if k != "error_msgs" and v}
    if bad or info.get("error_msgs"):
        raise SystemExit(f"{name}: transformers did not read the gpt-oss checkpoint as written: "
                         f"{bad} {info.get('error_msgs')}")
