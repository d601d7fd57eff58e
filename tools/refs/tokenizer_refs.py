#!/usr/bin/env python3
"""Reference ids for SentencePiece-style tokenizers, from Hugging Face `tokenizers` (run where
it is installed, e.g. the GPU machine):

    python3 tools/refs/tokenizer_refs.py --corpus tests/data/spm/corpus.json \\
        --llama2 tests/data/spm/llama2/tokenizer.json --gemma3 tests/data/spm/gemma3/tokenizer.json \\
        --out DIR

Writes DIR/NAME/reference.json for NAME in llama2, gemma3 and llama2-metaspace (the
repository keeps each gzipped, `gzip -9 -n`, as reference.json.gz: scripts/setup.sh unpacks
it): for every
corpus string {text, ids, ids_with_special, decoded} (encode with add_special_tokens False
and True; decode of ids keeping special tokens).  llama2-metaspace is the llama2 file with its
Prepend + Replace normalizer replaced by a Metaspace pre-tokenizer (prepend_scheme "first",
split false, as Mistral v0.3 ships it) and its decoder by ByteFallback + Metaspace; it is
written to DIR/llama2-metaspace/tokenizer.json.gz, and the strings where it tokenizes
differently from the original are counted (text after an added token: "first" prepends
only where the text begins, the Prepend normalizer to every segment)."""
import argparse
import gzip
import json
import os

import tokenizers
from tokenizers import Tokenizer


def metaspace_variant(path):
    d = json.load(open(path, encoding="utf-8"))
    ms = {"type": "Metaspace", "replacement": "\u2581", "prepend_scheme": "first", "split": False}
    d["normalizer"] = None
    d["pre_tokenizer"] = dict(ms)
    d["decoder"] = {"type": "Sequence", "decoders": [{"type": "ByteFallback"}, dict(ms)]}
    return d


def refs(tok, corpus):
    out = []
    for t in corpus:
        ids = tok.encode(t, add_special_tokens=False).ids
        out.append({"text": t, "ids": ids,
                    "ids_with_special": tok.encode(t, add_special_tokens=True).ids,
                    "decoded": tok.decode(ids, skip_special_tokens=False)})
    return out


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--corpus", required=True)
    ap.add_argument("--llama2", required=True)
    ap.add_argument("--gemma3", required=True)
    ap.add_argument("--out", required=True)
    a = ap.parse_args()
    corpus = json.load(open(a.corpus, encoding="utf-8"))
    variant = metaspace_variant(a.llama2)
    toks = {"llama2": Tokenizer.from_file(a.llama2), "gemma3": Tokenizer.from_file(a.gemma3),
            "llama2-metaspace": Tokenizer.from_str(json.dumps(variant))}
    for name, tok in toks.items():
        os.makedirs(os.path.join(a.out, name), exist_ok=True)
        r = refs(tok, corpus)
        with open(os.path.join(a.out, name, "reference.json"), "w", encoding="utf-8") as f:
            json.dump(r, f, ensure_ascii=False)
        print(f"{name}: {len(r)} strings, {sum(len(x['ids']) for x in r)} ids "
              f"(tokenizers {tokenizers.__version__})")
    with gzip.open(os.path.join(a.out, "llama2-metaspace", "tokenizer.json.gz"), "wt",
                   encoding="utf-8") as f:
        json.dump(variant, f, ensure_ascii=False)
    a2 = json.load(open(os.path.join(a.out, "llama2", "reference.json"), encoding="utf-8"))
    v2 = json.load(open(os.path.join(a.out, "llama2-metaspace", "reference.json"), encoding="utf-8"))
    diff = [x["text"] for x, y in zip(a2, v2) if x["ids"] != y["ids"]]
    print(f"llama2-metaspace: {len(diff)} strings tokenized differently from llama2, e.g. "
          f"{diff[:3]!r}")


if __name__ == "__main__":
    main()
