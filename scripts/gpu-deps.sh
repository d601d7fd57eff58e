#!/usr/bin/env bash
# scripts/gpu-deps.sh — the Debian libraries atlas builds against, for a GPU machine that has
# nvcc/cmake but not these -dev packages and cannot download (the device tool's machines).
#   here:   scripts/gpu-deps.sh fetch            # apt-get download into .carry/debs (ignored),
#                                                # the same files less static libraries and
#                                                # docs into .carry/dev.tar.xz, the fixture
#                                                # tokenizers into .carry/tok.tar.xz
#   here:   scripts/gpu-deps.sh fetch-node       # Node.js and the SDKs into .carry-node/
#                                                # (scripts/gpu-node.sh)
#   there:  source scripts/gpu-deps.sh install   # unpack the tokenizers, the packages into
#                                                # /tmp/dep (once), set
#                                                # PKG_CONFIG_PATH, LD_LIBRARY_PATH (with
#                                                # cuBLASLt's directory) and PATH (nvcc, node)
# Carry .carry (the checkout's 49 MiB and it stay under the device tool's 64 MiB a call), or for
# the README's walk .carry/dev.tar.xz (0.8 MiB: the packages less static libraries and docs)
# and .carry-node (13 MiB), which do not fit beside .carry/debs and the tokenizers: Node kept
# out of .carry so that carrying .carry stays small. Node (scripts/gpu-node.sh): node.tar.xz,
# and node-ssl.tar.xz on a machine without OpenSSL 3; install puts node on PATH only if it
# runs, and the SDKs into tests/server/node_modules (where tests/readme/walk.sh and
# tests/server/run.sh look).
# Every bench/gpu script sources it, so the environment is set up in this one place.
# libmicrohttpd's .pc requires gnutls's, which such machines lack: Requires.private is
# dropped (atlas links dynamically and needs only the public flags).
pkgs="libjansson-dev libjansson4 libpcre2-dev libpcre2-8-0 libpcre2-16-0 libpcre2-32-0
      libpcre2-posix3 libutf8proc-dev libutf8proc2 libmicrohttpd-dev libmicrohttpd12
      libedit-dev libedit2 libbsd0 libmd0 libtinfo6"
case "${1:-}" in
fetch)
  mkdir -p .carry/debs && (cd .carry/debs && apt-get download $pkgs) || exit 1
  # The fixture tokenizers (scripts/setup.sh fetches them; git ignores them) as one small
  # archive: the raw files would push a carried tree past the device tool's 64 MiB.
  toks=$(ls tests/data/tiny-*/tokenizer.json tests/data/spm/llama2/tokenizer*.json 2> /dev/null)
  if [ -n "$toks" ]; then tar cJf .carry/tok.tar.xz $toks; else
    echo "gpu-deps.sh: no tokenizer.json fixtures here (run scripts/setup.sh first)" >&2; fi
  d=$(mktemp -d) && for f in .carry/debs/*.deb; do dpkg -x "$f" "$d"; done &&
    tar -C "$d" -cf - --sort=name --exclude='*.a' --exclude=./usr/share . |
    xz -9e -T1 >.carry/dev.tar.xz && rm -rf "$d" || exit 1
  ;;
fetch-node)
  mkdir -p .carry-node && scripts/gpu-node.sh pack .carry-node || exit 1
  ;;
install)
  if [ -f .carry/tok.tar.xz ]; then tar xJf .carry/tok.tar.xz --skip-old-files; fi
  P=/tmp/dep
  PC=$P/usr/lib/x86_64-linux-gnu/pkgconfig
  # Without carried packages (a machine that has them installed) only the CUDA paths are set.
  if [ ! -f $P/.unpacked ] && ls .carry/debs/*.deb > /dev/null 2>&1; then
    mkdir -p $P
    for f in .carry/debs/*.deb; do dpkg -x "$f" $P; done
  elif [ ! -f $P/.unpacked ] && [ -f .carry/dev.tar.xz ]; then
    mkdir -p $P && tar -C $P -xJf .carry/dev.tar.xz
  fi
  if [ ! -f $P/.unpacked ] && [ -d $PC ]; then
    sed -i "s|^prefix=.*|prefix=$P/usr|; /^Requires.private/d" $PC/*.pc
    touch $P/.unpacked
  fi
  # Node: libnode reads its builtins from $P/node/lib (scripts/gpu-node.sh), so it goes there.
  if [ -f .carry-node/node.tar.xz ] && ! command -v node > /dev/null; then
    if [ ! -x $P/node/bin/node ]; then mkdir -p $P && tar -C $P -xJf .carry-node/node.tar.xz node; fi
    if [ -f .carry-node/node-ssl.tar.xz ] && [ ! -f $P/node/lib/libssl.so.3 ]; then
      tar -C $P -xJf .carry-node/node-ssl.tar.xz
    fi
    if [ ! -d tests/server/node_modules/openai ]; then
      mkdir -p tests/server && tar -C tests/server -xJf .carry-node/node.tar.xz node_modules
    fi
    if v=$($P/node/bin/node -e 'process.stdout.write(process.version)' 2>&1); then
      export PATH=$P/node/bin:$PATH
    else
      echo "gpu-deps.sh: the carried node does not run, left off PATH: $v" >&2
      case $v in *libssl*|*libcrypto*)
        echo "gpu-deps.sh: no OpenSSL 3 here: carry .carry-node/node-ssl.tar.xz too" >&2 ;; esac
    fi
  fi
  # Puts $2 in the path list named $1, at the front with a third argument, unless it is there
  # already (so that sourcing twice is harmless).
  gpu_deps_path_add() {
    case ":${!1:-}:" in
      *":$2:"*) ;;
      *) if [ -n "${3:-}" ]; then export "$1=$2${!1:+:${!1}}"; else export "$1=${!1:+${!1}:}$2"; fi ;;
    esac
  }
  if [ -f $P/.unpacked ]; then
    export PKG_CONFIG_PATH=$PC
    gpu_deps_path_add LD_LIBRARY_PATH $P/usr/lib/x86_64-linux-gnu front
  fi
  # GPU_DEPS_CUBLASLT: the cuBLASLt found (empty if none), for the scripts' logs.
  GPU_DEPS_CUBLASLT=$(find /usr/local/cuda*/lib64 /usr/local/cuda*/targets /opt /usr/lib \
         -name 'libcublasLt.so.1[23]' 2> /dev/null | head -1)
  if [ -n "$GPU_DEPS_CUBLASLT" ]; then
    gpu_deps_path_add LD_LIBRARY_PATH "$(dirname "$GPU_DEPS_CUBLASLT")"
  fi
  if [ -d /usr/local/cuda/bin ]; then gpu_deps_path_add PATH /usr/local/cuda/bin; fi
  ;;
*) echo "usage: scripts/gpu-deps.sh fetch | source scripts/gpu-deps.sh install" >&2 ;;
esac
