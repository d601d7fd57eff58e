#!/bin/sh
# bench/tokenizer/make-corpus.sh [OUTDIR] — builds the tokenizer benchmark corpus from files
# that a Debian machine has: English (the licenses in /usr/share/common-licenses and the
# King James Bible of package bible-kjv), C code (/usr/include headers) and, as a third
# file, the translated manual pages (Japanese, Korean, Chinese, Russian, Ukrainian, Polish,
# Turkish, German, French...: other scripts and NFC work).  Each file is cut
# at a line boundary near 3 MB so that both machines time the same bytes: build it once and
# carry the folder (default: corpus/tokenizer, ignored by git).
set -eu
out=${1:-corpus/tokenizer}
limit=${LIMIT:-3000000}
mkdir -p "$out"
export LC_ALL=C

# Keeps files that are valid UTF-8 (HF tokenizers only takes str) and stops near $limit.
collect() {
    total=0
    while IFS= read -r f; do
        [ -f "$f" ] || continue
        iconv -f UTF-8 -t UTF-8 "$f" >/dev/null 2>&1 || continue
        cat "$f"
        total=$((total + $(wc -c <"$f")))
        [ "$total" -lt "$limit" ] || break
    done
}

cut_at_line() { head -c "$limit" | sed '$d'; }

{
    find /usr/share/common-licenses -type f | sort | collect
    if command -v bible >/dev/null 2>&1; then
        bible "Gen1:1-Rev22:21" 2>/dev/null || true
    else
        echo "make-corpus.sh: bible-kjv not installed; English is licenses + copyright files" >&2
        find /usr/share/doc -name copyright | sort | collect
    fi
} | cut_at_line >"$out/english.txt"

find /usr/include -maxdepth 2 -name '*.h' | sort | collect | cut_at_line >"$out/code.txt"

# Manual pages are gzip'd troff: the text between the macros is the translation.
for lang in ja ko zh_CN zh_TW ru uk pl tr cs de fr es it; do
    [ -d "/usr/share/man/$lang" ] || continue
    find "/usr/share/man/$lang" -name '*.gz' | sort | while IFS= read -r f; do
        zcat "$f" 2>/dev/null | iconv -f UTF-8 -t UTF-8 2>/dev/null || true
    done
done | cut_at_line >"$out/multilingual.txt"

wc -c "$out"/english.txt "$out"/code.txt "$out"/multilingual.txt
