#!/usr/bin/env bash
# scripts/gpu-node.sh pack DIR — Debian 12's Node.js and the Node SDKs the README calls, packed
# for the GPU machine (no node, no apt, no npm registry there) into DIR/node.tar.xz and
# DIR/node-ssl.tar.xz (scripts/gpu-deps.sh fetch-node makes them in .carry-node; its install
# unpacks them).
#
# The packages as they are would be 23 MB, and the device tool's 64 MiB a call leaves about 15
# next to the 49 MiB checkout, so node.tar.xz (about 13 MiB) holds only the files node runs
# with, made to work from /tmp/dep/node:
#   node/bin/node               Debian's nodejs (its RUNPATH is $ORIGIN/../lib)
#   node/lib/lib*.so.N          libnode108 and the libraries it needs beyond glibc, libstdc++
#                               and OpenSSL (ICU 72, libuv, c-ares, nghttp2, brotli, zlib), with
#                               RUNPATH $ORIGIN, so that none of them goes on the
#                               LD_LIBRARY_PATH that atlas, curl and python share
#   node/lib/libicudata.so.72   ICU's data for root and English alone (icupkg), 31 -> 4 MB
#   node/lib/{undici,acorn,...} the JavaScript that Debian's libnode loads from
#                               /usr/share/nodejs (fetch, the ESM lexer): libnode's paths are
#                               rewritten to /tmp/dep/node/lib, the same length
#   node_modules/               openai, @anthropic-ai/sdk, ollama and their dependencies from
#                               tests/server/package-lock.json (npm ci), JavaScript and JSON only
# node-ssl.tar.xz (1.5 MiB) holds Debian's libssl.so.3 and libcrypto.so.3 (node/lib), for a
# machine without OpenSSL 3: carried both do not fit beside the checkout and .carry/dev.tar.xz.
# Needs apt-get, npm, node, gcc, python3 and xz here (Debian 12, x86-64).
set -euo pipefail
[ "${1:-}" = pack ] && [ $# -eq 2 ] || { echo "usage: scripts/gpu-node.sh pack DIR" >&2; exit 2; }
out=$(realpath -m "$2")
src=$(cd "$(dirname "$0")/.." && pwd)
W=$(mktemp -d /tmp/gpu-node-XXXXXX)
trap 'rm -rf "$W"' EXIT
chmod 755 "$W"  # apt-get download writes as _apt where it can
cd "$W"

# Debian's own version, not another repository's (NodeSource's nodejs may be installed here).
v=$(apt-cache madison libnode108 | awk '$3 ~ /deb12/ { print $3; exit }')
[ -n "$v" ] || { echo "gpu-node.sh: no Debian 12 libnode108 in apt's lists" >&2; exit 1; }
mkdir debs tools
(cd debs && apt-get download -q "nodejs=$v" "libnode108=$v" node-undici node-acorn \
   node-cjs-module-lexer libicu72 libuv1 libc-ares2 libnghttp2-14 libbrotli1 libssl3 zlib1g) \
   >/dev/null
(cd tools && apt-get download -q icu-devtools patchelf) >/dev/null
for f in debs/*.deb; do dpkg -x "$f" root; done
for f in tools/*.deb; do dpkg -x "$f" tools; done
L=root/usr/lib/x86_64-linux-gnu
patchelf=tools/usr/bin/patchelf

mkdir -p pkg/node/bin pkg/node/lib
cp root/usr/bin/node pkg/node/bin/node
for so in libnode.so.108 libicui18n.so.72 libicuuc.so.72 libuv.so.1 libcares.so.2 \
          libnghttp2.so.14 libbrotlicommon.so.1 libbrotlidec.so.1 libbrotlienc.so.1 \
          libssl.so.3 libcrypto.so.3 libz.so.1; do
  cp -L "$L/$so" pkg/node/lib/ 2>/dev/null || cp -L "root/lib/x86_64-linux-gnu/$so" pkg/node/lib/
done

# ICU's data: the common data that libicudata.so carries as the symbol icudt72_dat, less the
# locales other than root and English, the break dictionaries, transliterators and legacy
# converters (node needs none of them to run the SDKs), back in a libicudata.so.72 of its own.
python3 - "$L/libicudata.so.72" icudt72l.dat <<'EOF'
import subprocess, sys
so, dat = sys.argv[1], sys.argv[2]
sym = [l.split() for l in subprocess.run(['objdump', '-T', so], capture_output=True,
       text=True, check=True).stdout.splitlines() if l.endswith(' icudt72_dat')]
addr, size = int(sym[0][0], 16), int(sym[0][-2], 16)
for l in subprocess.run(['readelf', '-SW', so], capture_output=True, text=True,
                        check=True).stdout.splitlines():
    f = l.split(']')[-1].split()
    if f and f[0] == '.rodata':
        off = addr - int(f[2], 16) + int(f[3], 16)
data = open(so, 'rb').read()[off:off + size]
assert data[2:4] == b'\xda\x27', 'not ICU common data'
open(dat, 'wb').write(data)
EOF
icupkg() { LD_LIBRARY_PATH=$W/$L tools/usr/sbin/icupkg "$@"; }
icupkg -l icudt72l.dat | python3 -c '
import re, sys
locale = re.compile(r"^[a-z]{2,3}(_[A-Za-z0-9]+)*\.res$")
keep = re.compile(r"^(root|en|en_US|en_US_POSIX|en_001|res_index|pool)\.res$")
for item in sys.stdin.read().split():
    parts = item.split("/"); base = parts[-1]
    if len(parts) == 1:
        drop = (locale.match(base) and not keep.match(base)) or base.endswith(".cnv")
    elif parts[0] in ("translit", "brkitr"):
        drop = not base.endswith(".brk")
    else:
        drop = base.endswith(".res") and not keep.match(base)
    if drop: print(item)' >drop.txt
mkdir trim && cp icudt72l.dat trim/ && icupkg -r drop.txt trim/icudt72l.dat
cat >icudata.S <<EOF
  .section .rodata
  .globl icudt72_dat
  .type icudt72_dat, @object
  .balign 16
icudt72_dat:
  .incbin "$W/trim/icudt72l.dat"
  .size icudt72_dat, . - icudt72_dat
  .section .note.GNU-stack, "", @progbits
EOF
gcc -shared -nostdlib -Wl,-soname,libicudata.so.72 -o pkg/node/lib/libicudata.so.72 icudata.S

# The builtins libnode reads at run time, and its paths to them: "/usr/share/nodejs" and
# "/tmp/dep/node/lib" are both 17 bytes, so the rewrite moves no other byte.
S=root/usr/share/nodejs
for d in undici acorn acorn-walk cjs-module-lexer; do
  mkdir -p "pkg/node/lib/$d" && cp -r "$S/$d/." "pkg/node/lib/$d/"
done
find pkg/node/lib -name '*.d.ts' -delete
sed -i 's|/usr/share/nodejs/|/tmp/dep/node/lib/|g' pkg/node/lib/libnode.so.108
! grep -q /usr/share/nodejs/ pkg/node/lib/libnode.so.108 ||
  { echo "gpu-node.sh: libnode still names /usr/share/nodejs" >&2; exit 1; }

# node's own RUNPATH ($ORIGIN/../lib) finds libnode; each library finds its own the same way
# (libicudata needs nothing).
for so in pkg/node/lib/*.so.*; do
  case $so in */libicudata.so.72) ;; *) $patchelf --set-rpath '$ORIGIN' "$so" ;; esac
done

# The SDKs, at the lock's versions; puppeteer-core (the chat page's test, which needs chromium)
# and what only it needs stay behind.
mkdir npm && cp "$src/tests/server/package.json" "$src/tests/server/package-lock.json" npm/
(cd npm && npm ci --omit=dev --no-audit --no-fund --ignore-scripts --silent)
node - npm/node_modules pkg/node_modules openai @anthropic-ai/sdk ollama <<'EOF'
const fs = require('fs'), path = require('path');
const [from, to, ...roots] = process.argv.slice(2);
const seen = new Set();
const want = (name) => {
  if (seen.has(name)) return;
  seen.add(name);
  const pj = JSON.parse(fs.readFileSync(path.join(from, name, 'package.json')));
  for (const d of Object.keys(pj.dependencies || {})) want(d);
};
roots.forEach(want);
for (const name of seen) fs.cpSync(path.join(from, name), path.join(to, name), { recursive: true });
EOF
find pkg/node_modules -type f ! \( -name '*.js' -o -name '*.mjs' -o -name '*.cjs' \
  -o -name '*.json' \) -delete
find pkg/node_modules -type d -empty -delete

# xz with the x86 filter: a tenth smaller than the .debs' own compression on this code.
packxz() {  # packxz NAME PATH... (relative to pkg)
  local name=$1; shift
  tar -C pkg -cf - --sort=name --owner=0 --group=0 --numeric-owner "$@" |
    xz --x86 --lzma2=preset=9e,dict=64MiB -T1 >"$out/$name.tmp"
  mv "$out/$name.tmp" "$out/$name"
  echo "gpu-node.sh: $out/$name $(du -k "$out/$name" | cut -f1) KiB"
}
mkdir -p "$out"
packxz node-ssl.tar.xz node/lib/libssl.so.3 node/lib/libcrypto.so.3
packxz node.tar.xz --exclude=node/lib/libssl.so.3 --exclude=node/lib/libcrypto.so.3 \
  node node_modules
echo "gpu-node.sh: node $v"
