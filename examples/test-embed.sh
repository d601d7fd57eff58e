#!/bin/sh
# examples/test-embed.sh BINARY MODEL_DIR — ctest `example-embed`: the example must exit 0,
# print generated text after the prompt, and its closing line.
out=$("$1" "$2" "And it came to pass")
rc=$?
echo "$out"
[ "$rc" -eq 0 ] || { echo "FAIL: exit status $rc"; exit 1; }
echo "$out" | head -n 1 | grep -q '^And it came to pass..' || { echo "FAIL: no text"; exit 1; }
echo "$out" | grep -q '^\[finish: [a-z]*, prompt [0-9]* tokens, generated [1-9][0-9]*\]$' ||
    { echo "FAIL: no finish line"; exit 1; }
echo "PASS"
