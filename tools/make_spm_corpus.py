#!/usr/bin/env python3
"""Writes tests/data/spm/corpus.json: 2,400 strings for checking SentencePiece-style
tokenizers against Hugging Face `tokenizers` (tools/refs/tokenizer_refs.py makes the reference
ids on a machine that has it).  Deterministic: fixed pieces, then seeded random mixtures."""
import json
import random
import sys

PIECES = [
    "", " ", "  ", "   ", "\t", "\n", "\n\n", " \n ", "\r\n", "\t\t x", "Hello world", " Hello",
    "Hello  world", "Hello world ", "  leading", "trailing  ", "The quick brown fox jumps over the lazy dog.",
    "It's a dog's life, isn't it?", "don't", "I'm", "we'll", "3.14159", "1,000,000", "2026-12-04",
    "12345678901234567890", "0x1F4A9", "$100.00", "50%", "a+b=c", "(x)", "[INST]", "[/INST]", "<s>", "</s>",
    "<unk>", "<0x41>", "<0x0A>", "<s>Hello</s>", "Hi<s>there", "<pad>", "<bos>", "<eos>",
    "<start_of_turn>user", "<end_of_turn>", "▁", "▁▁", "a▁b", "_underscore_", "snake_case_name",
    "CamelCaseWord", "ALLCAPS", "naïve café", "Ångström", "façade", "São Paulo", "Zürich", "Ελληνικά",
    "Русский текст", "Українська", "日本語のテキスト", "中文文本测试", "한국어 텍스트", "العربية", "עברית",
    "हिन्दी", "ภาษาไทย", "Tiếng Việt", "e\u0301", "a\u0308\u0301", "\u200b", "\u200d", "\ufeff",
    "👍", "👩‍👩‍👧‍👦", "👋🏽", "🇫🇷", "❤️", "𝄞", "𠀀", "𪚥", "\U0010fffd", "\ue000", "\u00a0",
    "\u3000", "Ω≈ç√∫", "→←↑↓", "™©®", "½¼¾", "ﬁ", "Ⅻ", "ℕ", "\x7f", "\x01\x02", "tab\tsep",
    "line1\nline2", "def f(x):\n    return x * 2\n", "if (a && b) { c(); }", "<html><body>",
    "SELECT * FROM t;", "https://example.com/a?b=c", "user@example.com", "@mention #tag",
    "supercalifragilisticexpialidocious", "Pneumonoultramicroscopicsilicovolcanoconiosis",
    "aaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaa", "ab" * 40, "🙂" * 10, "\n" * 7,
    " " * 17, "x" + " " * 5 + "y", "..." , "?!", "—", "–", "«quotes»", "„Zitat“", "“smart”",
]

WORDS = ["the", "of", "and", "token", "model", "Llama", "Mistral", "Gemma", "world", "data",
         "über", "niño", "東京", "서울", "مرحبا", "שלום", "नमस्ते", "สวัสดี", "🙂", "🚀", "42", "007",
         "x", "I", "a", "é", "ß", "œ", "ğ", "ł", "ñ", "ø", "日", "한", "ا", "<s>", "</s>", "▁"]
SEPS = [" ", "  ", "", "\n", "\t", ", ", ". ", " - ", "\u3000", "\u00a0"]


def main():
    out = list(PIECES)
    r = random.Random(20261204)
    while len(out) < 2400:
        kind = r.random()
        if kind < 0.5:
            n = r.randint(1, 12)
            s = "".join(r.choice(WORDS) + r.choice(SEPS) for _ in range(n))
        elif kind < 0.7:
            s = "".join(chr(r.choice([r.randint(0x20, 0x7e), r.randint(0xa0, 0x24f),
                                      r.randint(0x370, 0x52f), r.randint(0x4e00, 0x9fff),
                                      r.randint(0xac00, 0xd7a3), r.randint(0x1f300, 0x1f64f),
                                      r.randint(0x20000, 0x2a6df), r.randint(0xe000, 0xf8ff)]))
                        for _ in range(r.randint(1, 20)))
        elif kind < 0.85:
            s = r.choice(PIECES) + r.choice(SEPS) + r.choice(PIECES)
        else:
            s = r.choice(SEPS) * r.randint(1, 4) + r.choice(WORDS) + r.choice(SEPS) * r.randint(0, 4)
        s = "".join(c for c in s if not 0xd800 <= ord(c) <= 0xdfff)
        out.append(s)
    json.dump(out, sys.stdout, ensure_ascii=False, indent=0)
    sys.stdout.write("\n")


if __name__ == "__main__":
    main()
