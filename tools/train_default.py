#!/usr/bin/env python3
"""tools/train_default.py — trains atlas's embedded default model from scratch.

A small Llama-architecture model with its own byte-level BPE tokenizer, trained on the King
James Bible (tools/make_corpus.sh: Debian's bible-kjv-text, public domain text). It writes a
normal Hugging Face directory that transformers loads, plus reference.json: what transformers
computes for a few prompts (the oracle of tests/test-default-model.c).

Runs on the GPU machine (torch, transformers, tokenizers there):
    python3 tools/train_default.py --corpus corpus/kjv.txt --out models/default --minutes 6
"""
import argparse
import json
import math
import os
import random
import time

import torch
from tokenizers import Regex, Tokenizer, decoders, models, pre_tokenizers, trainers
from transformers import AutoModelForCausalLM, AutoTokenizer, LlamaConfig, LlamaForCausalLM

SPECIALS = ["<|endoftext|>", "<|im_start|>", "<|im_end|>"]
# The Llama 3 pre-tokenizer split: the engine's tokenizer is tested against it.
SPLIT = (r"(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}{1,3}| ?[^\s\p{L}\p{N}]+[\r\n]*"
         r"|\s*[\r\n]+|\s+(?!\S)|\s+")
CHAT_TEMPLATE = (
    "{% for message in messages %}"
    "{{ '<|im_start|>' + message['role'] + '\\n' + message['content'] + '<|im_end|>' + '\\n' }}"
    "{% endfor %}"
    "{% if add_generation_prompt %}{{ '<|im_start|>assistant\\n' }}{% endif %}")
PROMPTS = ["And it came to pass", "In the beginning", "The LORD is my shepherd",
           "And Jesus said unto them"]


def read_chapters(path):
    text = open(path, encoding="utf-8").read()
    chapters = [c.strip("\n") for c in text.split("\n#\n")]
    return [c for c in chapters if c]


def train_tokenizer(texts, vocab):
    tok = Tokenizer(models.BPE())
    tok.pre_tokenizer = pre_tokenizers.Sequence([
        pre_tokenizers.Split(Regex(SPLIT), behavior="isolated", invert=False),
        pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=False)])
    tok.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(vocab_size=vocab, special_tokens=SPECIALS, min_frequency=2,
                                  initial_alphabet=pre_tokenizers.ByteLevel.alphabet())
    tok.train_from_iterator(texts, trainer)
    return tok


def encode_stream(tok, chapters, eos):
    ids = []
    for enc in tok.encode_batch(chapters):
        ids.extend(enc.ids)
        ids.append(eos)
    return torch.tensor(ids, dtype=torch.long)


def batches(data, batch, seq, gen):
    starts = torch.randint(0, len(data) - seq - 1, (batch,), generator=gen)
    x = torch.stack([data[s:s + seq] for s in starts])
    y = torch.stack([data[s + 1:s + seq + 1] for s in starts])
    return x, y


@torch.no_grad()
def evaluate(model, data, seq, dev):
    model.eval()
    losses = []
    n = (len(data) - 1) // seq
    for i in range(0, n, 64):
        rows = range(i, min(n, i + 64))
        x = torch.stack([data[r * seq:r * seq + seq] for r in rows]).to(dev)
        y = torch.stack([data[r * seq + 1:r * seq + seq + 1] for r in rows]).to(dev)
        with torch.autocast("cuda", dtype=torch.bfloat16):
            logits = model(input_ids=x).logits
        loss = torch.nn.functional.cross_entropy(logits.float().view(-1, logits.size(-1)),
                                                 y.view(-1), reduction="sum")
        losses.append((loss.item(), y.numel()))
    model.train()
    return sum(l for l, _ in losses) / sum(c for _, c in losses)


def write_hf_files(out, tok, eos, bos):
    tok.save(os.path.join(out, "tokenizer.json"))
    added = {str(tok.token_to_id(s)): {"content": s, "lstrip": False, "normalized": False,
                                       "rstrip": False, "single_word": False, "special": True}
             for s in SPECIALS}
    cfg = {"added_tokens_decoder": added, "bos_token": "<|endoftext|>",
           "eos_token": "<|endoftext|>", "pad_token": "<|endoftext|>",
           "clean_up_tokenization_spaces": False, "model_max_length": 1024,
           "tokenizer_class": "PreTrainedTokenizerFast", "chat_template": CHAT_TEMPLATE}
    json.dump(cfg, open(os.path.join(out, "tokenizer_config.json"), "w"), indent=2)
    gen = {"bos_token_id": bos, "eos_token_id": [eos, tok.token_to_id("<|im_end|>")],
           "do_sample": True, "temperature": 0.8, "top_p": 0.95}
    json.dump(gen, open(os.path.join(out, "generation_config.json"), "w"), indent=2)


@torch.no_grad()
def make_reference(out, n_new=32):
    """What transformers computes from the saved checkpoint, fp32 arithmetic on the bf16
    weights: the oracle for atlas's CPU backend."""
    try:
        tok = AutoTokenizer.from_pretrained(out)
        print("AutoTokenizer loads the directory:", type(tok).__name__, flush=True)
    except Exception as e:  # the reference must still be made: tokenizers is the oracle
        print("AutoTokenizer failed:", e, flush=True)
        raw = Tokenizer.from_file(os.path.join(out, "tokenizer.json"))

        class Tok:
            def __call__(self, text, add_special_tokens=False):
                return {"input_ids": raw.encode(text, add_special_tokens=add_special_tokens).ids}

            def decode(self, ids):
                return raw.decode(ids, skip_special_tokens=False)
        tok = Tok()
    model = AutoModelForCausalLM.from_pretrained(out, dtype=torch.float32).eval()
    cases = []
    for p in PROMPTS:
        ids = tok(p, add_special_tokens=False)["input_ids"]
        x = torch.tensor([ids])
        last = model(input_ids=x).logits[0, -1]
        greedy, margins = [], []
        cur = x
        for _ in range(n_new):
            logits = model(input_ids=cur).logits[0, -1]
            top2 = torch.topk(logits, 2)
            greedy.append(int(top2.indices[0]))
            margins.append(float(top2.values[0] - top2.values[1]))
            cur = torch.cat([cur, top2.indices[:1].view(1, 1)], dim=1)
        top = torch.topk(last, 16)
        cases.append({"prompt": p, "ids": ids, "greedy_ids": greedy, "greedy_margins": margins,
                      "greedy_text": tok.decode(greedy), "last_top_ids": top.indices.tolist(),
                      "last_top_logits": top.values.tolist()})
    json.dump({"made_with": "transformers %s, torch %s, fp32 on the bf16 weights" % (
        __import__("transformers").__version__, torch.__version__), "cases": cases},
        open(os.path.join(out, "reference.json"), "w"), indent=1)
    return cases


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--corpus", default="corpus/kjv.txt")
    ap.add_argument("--out", default="models/default")
    ap.add_argument("--minutes", type=float, default=6.0)
    ap.add_argument("--vocab", type=int, default=4096)
    ap.add_argument("--hidden", type=int, default=256)
    ap.add_argument("--layers", type=int, default=8)
    ap.add_argument("--heads", type=int, default=8)
    ap.add_argument("--kv-heads", type=int, default=4)
    ap.add_argument("--ffn", type=int, default=704)
    ap.add_argument("--seq", type=int, default=256)
    ap.add_argument("--batch", type=int, default=64)
    ap.add_argument("--lr", type=float, default=2e-3)
    ap.add_argument("--seed", type=int, default=1234)
    args = ap.parse_args()
    t_start = time.time()
    torch.manual_seed(args.seed)
    random.seed(args.seed)
    dev = "cuda"

    chapters = read_chapters(args.corpus)
    rng = random.Random(args.seed)
    rng.shuffle(chapters)
    n_val = max(1, len(chapters) // 20)  # 5% of chapters held out
    val_ch, train_ch = chapters[:n_val], chapters[n_val:]
    tok = train_tokenizer(train_ch, args.vocab)
    eos = tok.token_to_id("<|endoftext|>")
    train = encode_stream(tok, train_ch, eos)
    val = encode_stream(tok, val_ch, eos)
    print(f"corpus: {len(chapters)} chapters, train {len(train)} tokens, val {len(val)} tokens,"
          f" vocab {tok.get_vocab_size()}", flush=True)

    cfg = LlamaConfig(vocab_size=args.vocab, hidden_size=args.hidden,
                      intermediate_size=args.ffn, num_hidden_layers=args.layers,
                      num_attention_heads=args.heads, num_key_value_heads=args.kv_heads,
                      max_position_embeddings=1024, rms_norm_eps=1e-5,
                      tie_word_embeddings=True, bos_token_id=eos, eos_token_id=eos)
    model = LlamaForCausalLM(cfg).to(dev)
    n_params = sum(p.numel() for p in model.parameters())
    print(f"model: {n_params / 1e6:.2f} M parameters", flush=True)
    decay = [p for n, p in model.named_parameters() if p.dim() >= 2]
    no_decay = [p for n, p in model.named_parameters() if p.dim() < 2]
    opt = torch.optim.AdamW([{"params": decay, "weight_decay": 0.1},
                             {"params": no_decay, "weight_decay": 0.0}],
                            lr=args.lr, betas=(0.9, 0.95), fused=True)
    gen = torch.Generator().manual_seed(args.seed)
    train_dev = train.to(dev)
    budget = args.minutes * 60 - (time.time() - t_start) - 45  # leave time to save + reference
    best, best_state, step, warmup = float("inf"), None, 0, 200
    t0 = time.time()
    est_steps = None
    while True:
        elapsed = time.time() - t0
        if elapsed > budget:
            break
        if step == 100:
            est_steps = int(budget / (elapsed / 100))
        total = est_steps or 10000
        lr = args.lr * min(1.0, (step + 1) / warmup) * (
            0.1 + 0.9 * 0.5 * (1 + math.cos(math.pi * min(1.0, step / total))))
        for g in opt.param_groups:
            g["lr"] = lr
        starts = torch.randint(0, len(train) - args.seq - 1, (args.batch,), generator=gen).to(dev)
        idx = starts[:, None] + torch.arange(args.seq + 1, device=dev)[None, :]
        chunk = train_dev[idx]
        x, y = chunk[:, :-1], chunk[:, 1:]
        with torch.autocast("cuda", dtype=torch.bfloat16):
            logits = model(input_ids=x).logits
        loss = torch.nn.functional.cross_entropy(logits.float().view(-1, args.vocab), y.reshape(-1))
        opt.zero_grad(set_to_none=True)
        loss.backward()
        torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
        opt.step()
        step += 1
        if step % 250 == 0:
            vl = evaluate(model, val, args.seq, dev)
            print(f"step {step} lr {lr:.2e} train {loss.item():.3f} val {vl:.3f} "
                  f"ppl {math.exp(vl):.1f} ({time.time() - t0:.0f} s)", flush=True)
            if vl < best:
                best = vl
                best_state = {k: v.detach().clone() for k, v in model.state_dict().items()}
    if best_state is not None:
        model.load_state_dict(best_state)
    vl = evaluate(model, val, args.seq, dev)
    print(f"final: {step} steps, {step * args.batch * args.seq / 1e6:.0f} M tokens seen, "
          f"val loss {vl:.4f}, perplexity {math.exp(vl):.2f}", flush=True)

    os.makedirs(args.out, exist_ok=True)
    model.to(torch.bfloat16).save_pretrained(args.out, safe_serialization=True)
    write_hf_files(args.out, tok, eos, eos)
    cases = make_reference(args.out)
    for c in cases:
        print(f"sample: {c['prompt']!r} -> {c['greedy_text']!r}", flush=True)
    summary = {"val_loss": vl, "val_perplexity": math.exp(vl), "steps": step,
               "tokens_seen": step * args.batch * args.seq, "params": n_params,
               "train_tokens": len(train), "val_tokens": len(val),
               "seconds": time.time() - t_start, "args": vars(args)}
    json.dump(summary, open(os.path.join(args.out, "training.json"), "w"), indent=1)
    print(json.dumps(summary), flush=True)


if __name__ == "__main__":
    main()
