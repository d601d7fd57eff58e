#!/usr/bin/env bash
# tools/make_corpus.sh OUT — the training corpus of the default model: the King James Bible
# from Debian's bible-kjv-text package (the 1611 translation's copyright has expired; the
# package's data file is "provided for unrestricted use", see
# /usr/share/doc/bible-kjv-text/copyright). One chapter a paragraph block, verse numbers
# removed, chapters separated by a blank line and a line "#".
set -euo pipefail
out=${1:-corpus/kjv.txt}
mkdir -p "$(dirname "$out")"
if ! command -v bible >/dev/null; then
  sudo=""; [ "$(id -u)" -eq 0 ] || sudo="sudo"
  $sudo apt-get install -y -qq bible-kjv bible-kjv-text >/dev/null
fi
bible -l100000 "Gen1:1-Rev22:21" | awk '
  /^[A-Z0-9][A-Za-z0-9 ]* [0-9]+$/ { if (n) print "#"; n++; next }   # chapter heading
  /^$/ { next }
  { sub(/^ *[0-9]+ /, ""); print }' > "$out"
echo "corpus: $(wc -c < "$out") bytes, $(grep -c '^#$' "$out") chapter breaks -> $out"
