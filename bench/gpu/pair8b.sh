# shellcheck shell=bash
# bench/gpu/pair8b.sh — sourced by the swap benchmarks (kvhost.sh, hosttier.sh) after OUT is
# set: the two random 8B-shaped checkpoints they swap between, A (/tmp/llama8b, seed 1234)
# and B (/tmp/llama8b-b, seed 4321), made when absent (tools/make_checkpoint.py), with the
# Llama 3 tokenizer beside them, and read once so that their loads start from the page cache.
for d in /tmp/llama8b:1234 /tmp/llama8b-b:4321; do
  dir=${d%:*}
  [ -f "$dir/config.json" ] || timeout 300 python3 tools/make_checkpoint.py --shape 8b \
    --seed "${d#*:}" --out "$dir" > "$OUT/make-$(basename "$dir").log" 2>&1
  for f in tokenizer.json tokenizer_config.json; do
    [ -f "$dir/$f" ] || cp "tests/data/tiny-llama3/$f" "$dir/"
  done
  cat "$dir"/*.safetensors > /dev/null
done
