#!/usr/bin/env bash
# tests/install/check.sh [REPO] — what a user gets from an install, checked with nothing of the
# source left (CI step 2, .ci/run):
#   1. a fresh clone of REPO (default: this checkout's repository) configured CPU-only and
#      built (only the installed targets), installed into a temporary prefix P, and packaged
#      by CPack (.deb); then the clone and its build are deleted;
#   2. from another directory: P/bin/atlas --version, `atlas run` and `atlas info` on the
#      embedded default model; the soname, the headers, atlas.pc, the man page, the license;
#   3. examples/embed.c (installed under P/share/doc/atlas/examples) compiled and linked
#      through `pkg-config --cflags --libs atlas`, shared and static, and run with no
#      LD_LIBRARY_PATH (atlas.pc's rpath finds P/lib, as README's Install says) on the model
#      that `atlas export` writes out, twice into one directory (README's first block);
#   4. the .deb: Depends covers every library the binaries need, `dpkg -i` installs it,
#      /usr/bin/atlas runs, the example builds against /usr, `dpkg -r` removes every file and
#      `dpkg -P` the package's record.
#      Needs root (or sudo) and dpkg; skipped with a message where neither is there.
# Prints the seconds each phase took.  Exit status 0 when every check passed.
set -euo pipefail
repo=${1:-$(git -C "$(dirname "$0")" rev-parse --show-toplevel)}
T=$(mktemp -d /tmp/inst-check-XXXXXX)
P=$T/prefix
trap 'rm -rf "$T"' EXIT
fail() { echo "FAIL: $*" >&2; exit 1; }
t0=$(date +%s)
phase() { local now; now=$(date +%s); echo "== $1 ($((now - t0)) s so far)"; }

# --- 1. clone, build, install, package, delete --------------------------------------------
phase "clone and build (CPU-only, -j2)"
git clone -q "$repo" "$T/src"
# the soname carries the API version (include/atlas/version.h)
SONAME=libatlas.so.$(sed -n 's/^#define ATLAS_API_VERSION \([0-9][0-9]*\).*/\1/p' \
  "$T/src/include/atlas/version.h")
[ "$SONAME" != libatlas.so. ] || fail "no ATLAS_API_VERSION in include/atlas/version.h"
cmake -S "$T/src" -B "$T/build" -DATLAS_CUDA=OFF -DCMAKE_SKIP_INSTALL_ALL_DEPENDENCY=ON >"$T/configure.log" 2>&1 ||
  { cat "$T/configure.log"; fail "configure"; }
cmake --build "$T/build" -j2 --target atlas atlas_shared atlas_lib >"$T/build.log" 2>&1 ||
  { tail -50 "$T/build.log"; fail "build"; }
phase "install into $P and cpack -G DEB"
cmake --install "$T/build" --prefix "$P" >"$T/install.log" || fail "cmake --install"
(cd "$T/build" && cpack -G DEB >"$T/cpack.log" 2>&1) || { cat "$T/cpack.log"; fail "cpack"; }
deb=$(ls "$T"/build/atlas_*.deb)
mv "$deb" "$T/" && deb=$T/$(basename "$deb")
rm -rf "$T/src" "$T/build"
[ ! -e "$T/src" ] && [ ! -e "$T/build" ] || fail "the source and build trees are still there"

# --- 2. the installed tree ----------------------------------------------------------------
phase "the installed command, from another directory"
mkdir "$T/elsewhere" && cd "$T/elsewhere"
"$P/bin/atlas" --version | tee "$T/version.txt"
grep -q "^atlas [0-9]*\.[0-9]*\.[0-9]* (commit [0-9a-f]*)" "$T/version.txt" || fail "--version"
out=$("$P/bin/atlas" run -p "And it came to pass" -n 16 --temp 0)
echo "$out"
[ "$(printf '%s' "$out" | wc -w)" -ge 3 ] || fail "atlas run printed no text"
"$P/bin/atlas" info --device cpu | tee "$T/info.txt"
grep -q "^model: .*embedded" "$T/info.txt" || fail "atlas info does not name the embedded model"
grep -q "^architecture:  LlamaForCausalLM" "$T/info.txt" || fail "atlas info: architecture"
[ -z "$(ls -A "$T/elsewhere")" ] || fail "atlas wrote files into the working directory"

phase "the libraries, headers, atlas.pc, man page, license"
so=$(readelf -d "$P"/lib*/libatlas.so | sed -n 's/.*(SONAME).*\[\(.*\)\]/\1/p')
[ "$so" = "$SONAME" ] || fail "soname '$so', want $SONAME (include/atlas/version.h)"
for f in lib/libatlas.so lib/libatlas.a lib/pkgconfig/atlas.pc include/atlas/atlas.h \
         include/atlas/memdir.h share/man/man1/atlas.1 share/doc/atlas/LICENSE \
         share/doc/atlas/examples/embed.c; do
  [ -e "$P/$f" ] || fail "$P/$f is not installed"
done
[ -L "$P/lib/libatlas.so" ] && [ -L "$P/lib/$so" ] || fail "the .so links are not links"
# the file behind the soname starts with it (libatlas.so.N -> libatlas.so.N.M.P), as ldconfig
# names the link it makes from the file's soname
real=$(readlink "$P/lib/$so")
[[ $real == "$SONAME".* ]] || fail "$so links to $real, a name that disagrees with the soname"
[ "$(readelf -d "$P/lib/$real" | sed -n 's/.*(SONAME).*\[\(.*\)\]/\1/p')" = "$SONAME" ] ||
  fail "$real's soname is not $SONAME"
grep -q "^MIT License" "$P/share/doc/atlas/LICENSE" || fail "LICENSE"
# (outputs kept in variables: grep -q ending a pipe early fails it under pipefail)
members=$(ar t "$P/lib/libatlas.a")
grep -q "^engine.c.o$" <<<"$members" || fail "libatlas.a has no engine"
exports=$(nm -D --defined-only "$P/lib/libatlas.so")
grep -q " T atlas_memdir_add$" <<<"$exports" || fail "libatlas.so does not export the API"
others=$(grep " T " <<<"$exports" | grep -v " T atlas_" || true)
[ -z "$others" ] || fail "libatlas.so exports symbols outside atlas_*: $others"
if command -v man >/dev/null; then
  man_out=$(MANWIDTH=80 man --warnings -l "$P/share/man/man1/atlas.1" 2>&1 >/dev/null) ||
    fail "man: $man_out"
  [ -z "$man_out" ] || fail "man page warnings: $man_out"
fi
for c in run chat serve bench tokenize template info export; do
  grep -q "^\.B atlas $c\b" "$P/share/man/man1/atlas.1" || fail "the man page lacks '$c'"
done

phase "examples/embed.c through pkg-config, shared and static"
"$P/bin/atlas" export "$T/model" >/dev/null
"$P/bin/atlas" export "$T/model" >/dev/null || fail "atlas export into its own directory again"
export PKG_CONFIG_PATH=$P/lib/pkgconfig
flags=$(pkg-config --cflags --libs atlas)
echo "pkg-config --cflags --libs atlas: $flags"
cc -O1 -o "$T/embed" "$P/share/doc/atlas/examples/embed.c" $flags
check_embed() { # BINARY [env...]
  local out
  out=$(env "${@:2}" "$1" "$T/model" "And it came to pass") || fail "$1 failed"
  echo "$out"
  echo "$out" | head -n 1 | grep -q '^And it came to pass..' || fail "$1: no text"
  echo "$out" | grep -q '^\[finish: [a-z]*, prompt [0-9]* tokens, generated [1-9][0-9]*\]$' ||
    fail "$1: no finish line"
}
# no extra setting: the rpath that atlas.pc adds under a prefix other than /usr
check_embed "$T/embed" -u LD_LIBRARY_PATH
grep -q "$SONAME => $P/lib/$SONAME" <<<"$(env -u LD_LIBRARY_PATH ldd "$T/embed")" ||
  fail "embed does not load $P/lib/$SONAME by itself"
static=$(pkg-config --static --cflags --libs atlas | sed 's/-latlas\b/-l:libatlas.a/')
cc -O1 -o "$T/embed-static" "$P/share/doc/atlas/examples/embed.c" $static
! grep -q libatlas <<<"$(ldd "$T/embed-static")" || fail "embed-static links libatlas.so"
check_embed "$T/embed-static"
unset PKG_CONFIG_PATH

# --- 4. the Debian package ------------------------------------------------------------------
phase "the Debian package $(basename "$deb")"
sudo=""
if [ "$(id -u)" -ne 0 ]; then
  if sudo -n true 2>/dev/null; then sudo="sudo -n"; else
    echo "SKIP: dpkg -i needs root or sudo"; phase "done"; exit 0; fi
fi
command -v dpkg >/dev/null || { echo "SKIP: no dpkg"; phase "done"; exit 0; }
depends=$(dpkg-deb -f "$deb" Depends)
echo "Depends: $depends"
# every library the binaries link directly (NEEDED) must come from a package Depends names
for bin in "$P/bin/atlas" "$P/lib/libatlas.so"; do
  resolved=$(ldd "$bin")
  for needed in $(readelf -d "$bin" | sed -n 's/.*(NEEDED).*\[\(.*\)\]/\1/p'); do
    lib=$(awk -v n="$needed" '$1 == n && $3 ~ /^\// {print $3; exit}
                              substr($1, length($1) - length(n)) == "/" n {print $1; exit}' <<<"$resolved")
    [ -n "$lib" ] || fail "$bin: $needed is not found"
    pkg=$(dpkg -S "$lib" 2>/dev/null || dpkg -S "$(readlink -f "$lib")" 2>/dev/null || true)
    pkg=${pkg%%:*}
    [ -n "$pkg" ] || fail "$lib belongs to no package"
    echo ", $depends" | grep -q ", $pkg\b" || fail "Depends lacks $pkg (for $needed)"
  done
done
for want in libjansson4 libpcre2-8-0 libutf8proc2 libmicrohttpd12; do
  echo ", $depends" | grep -q ", $want\b" || fail "Depends lacks $want"
done
if grep -q "ok installed" <<<"$(dpkg-query -W -f='${Status}' atlas 2>/dev/null)"; then
  fail "a package named atlas is installed already: not touching it"
fi
$sudo dpkg -i "$deb" >/dev/null
files=$(dpkg -L atlas)
cd "$T/elsewhere"
/usr/bin/atlas --version | head -n 1
[ "$(/usr/bin/atlas run -n 8 --temp 0 2>/dev/null | wc -w)" -ge 2 ] || fail "/usr/bin/atlas run"
cc -O1 -o "$T/embed-usr" /usr/share/doc/atlas/examples/embed.c $(pkg-config --cflags --libs atlas)
check_embed "$T/embed-usr"
grep -q "$SONAME " <<<"$(ldconfig -p)" || fail "ldconfig does not know $SONAME"
$sudo dpkg -r atlas >/dev/null
! grep -q "ok installed" <<<"$(dpkg-query -W -f='${Status}' atlas 2>/dev/null)" || fail "still installed"
left=""
while read -r f; do
  [ -d "$f" ] && continue         # directories shared with other packages stay
  [ -e "$f" ] || [ -L "$f" ] && left="$left $f"
done <<<"$files"
[ -z "$left" ] || fail "dpkg -r left:$left"
! grep -q "$SONAME " <<<"$(ldconfig -p)" || fail "ldconfig still lists $SONAME"
# dpkg -r keeps the package's record (its postrm, for the ldconfig trigger) until a purge
$sudo dpkg -P atlas >/dev/null
! dpkg-query -W atlas >/dev/null 2>&1 || fail "dpkg -P left the package's record"
phase "done"
echo "PASS"
