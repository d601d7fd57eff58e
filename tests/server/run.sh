#!/bin/sh
# tests/server/run.sh SCRIPT — runs one server test file with node's test runner; exit 77
# (ctest's SKIP) when node or the OpenAI and Anthropic SDKs are missing (scripts/setup.sh installs them),
# and for the chat page's test (page.test.mjs) when Debian's chromium or puppeteer-core is.
dir=$(dirname "$0")
command -v node >/dev/null 2>&1 || { echo "SKIP: node not found"; exit 77; }
[ -d "$dir/node_modules/openai" ] && [ -d "$dir/node_modules/@anthropic-ai/sdk" ] || { echo "SKIP: run scripts/setup.sh (npm install in tests/server)"; exit 77; }
case "$1" in
  *page.test.mjs)
    [ -x /usr/bin/chromium ] || { echo "SKIP: /usr/bin/chromium not found (scripts/setup.sh installs Debian's chromium)"; exit 77; }
    [ -d "$dir/node_modules/puppeteer-core" ] || { echo "SKIP: puppeteer-core missing (scripts/setup.sh: npm install in tests/server)"; exit 77; } ;;
esac
[ -x "$ATLAS_BIN" ] || { echo "ATLAS_BIN ($ATLAS_BIN) is not an executable"; exit 1; }
for m in tiny-llama3 tiny-qwen3; do
  [ -s "$ATLAS_TEST_DATA/$m/tokenizer.json" ] || { echo "SKIP: $m/tokenizer.json missing (scripts/setup.sh)"; exit 77; }
done
exec node --test --test-reporter=spec "$1"
