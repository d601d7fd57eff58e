#!/usr/bin/env bash
# tests/readme/walk.sh [--gpu] [--readme FILE] ATLAS_BIN — follows README.md as a newcomer
# would, against the atlas binary of the build under test (the ctest `readme-walk`).
#
# The README marks the blocks a newcomer types with an HTML comment on the line before the
# fenced block (GitHub does not show it):
#   <!-- walk -->                 run the block; it must exit 0
#   <!-- walk expect="TEXT" -->   run it; its stdout must also hold TEXT (\" for a quote)
#   <!-- walk file=NAME -->       write the block, as it is, to the file NAME (then run by a
#                                 later block: the Node SDK snippet)
#   <!-- walk gpu -->             run it only with --gpu (the ctest readme-walk-gpu: a kernels
#                                 build and a usable GPU, else skipped)
#   <!-- walk twice -->           run it twice in a row, both must pass: a block a newcomer
#                                 types again the next day (the first one, atlas export)
# The blocks run in order, in one bash (so that a server started with `&` in one block is
# there for the next, and `kill %1` stops it), with `set -e -o pipefail`, in an empty
# directory with HOME pointing into it and stdin from /dev/null.  Only `./build/atlas` is
# replaced, by ATLAS_BIN.  `node_modules` there links to tests/server/node_modules (what
# `npm install openai` would make).  A block that fails, an expected text missing, or a server
# the README leaves running fails the walk, naming the README's line.
#
# The server's port 8080 is the README's: the walk runs in a network namespace of its own
# (unshare -rn), so that nothing else on the machine can hold the port or answer in atlas's
# place; without one, it runs only when nothing listens on 127.0.0.1:8080.
# Exit: 0 when every block passed, 1 on a failure, 77 (ctest's skip) when curl, node or the
# OpenAI SDK is missing, the port is taken and no namespace can be made, or (--gpu) the build
# has no kernels or CUDA is not usable here.
set -euo pipefail

gpu=0
src=$(cd "$(dirname "$0")/../.." && pwd)
readme=$src/README.md
while [ $# -gt 1 ]; do
  case $1 in
    --gpu) gpu=1; shift ;;
    --readme) readme=$2; shift 2 ;;
    *) break ;;
  esac
done
[ $# -eq 1 ] || { echo "usage: tests/readme/walk.sh [--gpu] [--readme FILE] ATLAS_BIN" >&2; exit 2; }
bin=$1
[ -x "$bin" ] || { echo "walk: $bin is not an executable" >&2; exit 1; }
bin=$(cd "$(dirname "$bin")" && pwd)/$(basename "$bin")

if [ $gpu -eq 1 ]; then
  v=$("$bin" --version)
  case $v in *"gpu targets: none"*) echo "SKIP: a CPU-only build (no kernels)"; exit 77 ;; esac
  case $v in *"cuda: found"*) ;; *) echo "SKIP: $(echo "$v" | grep '^cuda:')"; exit 77 ;; esac
fi
command -v curl >/dev/null || { echo "SKIP: curl not found (scripts/setup.sh)"; exit 77; }
command -v node >/dev/null ||
  { echo "SKIP: node not found (scripts/setup.sh; a GPU machine: scripts/gpu-deps.sh's node)"; exit 77; }
[ -d "$src/tests/server/node_modules/openai" ] ||
  { echo "SKIP: no OpenAI SDK in tests/server/node_modules (scripts/setup.sh)"; exit 77; }

# A network namespace of our own: loopback only, port 8080 free whatever runs beside us.
if [ -z "${ATLAS_WALK_NETNS:-}" ]; then
  if command -v unshare >/dev/null && command -v ip >/dev/null &&
     unshare -rn true 2>/dev/null; then
    args=(); [ $gpu -eq 1 ] && args+=(--gpu)
    exec env ATLAS_WALK_NETNS=1 unshare -rn bash -c 'ip link set lo up && exec "$@"' walk \
      bash "$0" "${args[@]}" --readme "$readme" "$bin"
  fi
  rc=0; curl -s -o /dev/null --max-time 2 http://127.0.0.1:8080/ || rc=$?
  [ $rc -eq 7 ] || { echo "SKIP: 127.0.0.1:8080 is in use and no network namespace can be made"
                     exit 77; }
  echo "walk: no network namespace (unshare -rn failed); 127.0.0.1:8080 is free, using it"
fi

T=$(mktemp -d /tmp/readme-walk-XXXXXX)
trap 'rm -rf "$T"' EXIT
mkdir -p "$T/work" "$T/home" "$T/blocks" "$T/out"
ln -s "$src/tests/server/node_modules" "$T/work/node_modules"

# --- the marked blocks: blocks/N.body and blocks/N.meta (line, kind, expect, file) ----------
awk -v dir="$T/blocks" '
  function fail(msg) { print "walk: README.md line " NR ": " msg > "/dev/stderr"; bad = 1; exit 1 }
  state == 0 && /^<!-- walk[ >-]/ {
    m = $0
    if (m !~ /-->[ \t]*$/) fail("a walk marker must end its line with -->")
    kind = "run"; expect = ""; file = ""; twice = 0
    if (m ~ / gpu( |-->)/) kind = "gpu"
    if (m ~ / twice( |-->)/) twice = 1
    if (match(m, / file=[^ ]+/)) { file = substr(m, RSTART + 6, RLENGTH - 6); kind = "file" }
    if (index(m, " expect=\"")) {
      e = substr(m, index(m, " expect=\"") + 9)
      sub(/"[ \t]*-->[ \t]*$/, "", e)
      gsub(/\\"/, "\"", e)
      expect = e
    }
    state = 1; next
  }
  state == 1 {
    if ($0 !~ /^```/) fail("a walk marker must be followed by a fenced block")
    n++; body = dir "/" n ".body"; printf "" > body
    meta = dir "/" n ".meta"
    print NR + 1 > meta; print kind > meta; print expect > meta; print file > meta
    print twice > meta
    close(meta)
    state = 2; next
  }
  state == 2 && /^```[ \t]*$/ { close(body); state = 0; next }
  state == 2 { print > body; next }
  END {
    if (bad) exit 1
    if (state == 2) { print "walk: README.md: a walked block is not closed" > "/dev/stderr"; exit 1 }
    if (n == 0) { print "walk: README.md has no <!-- walk --> block" > "/dev/stderr"; exit 1 }
  }' "$readme"

# --- one script that runs them in order ----------------------------------------------------
script=$T/walk-script.sh
{
  echo 'set -eE -o pipefail'
  echo 'exec 3>&2  # the walk'"'"'s own stderr, while a block'"'"'s goes to its file'
  echo 'walk_fail() { local rc=$1'
  echo '  { echo "FAIL: README.md line $walk_line: the block exited with $rc"'
  echo '    echo "--- its stdout:"; cat "$walk_out" || true'
  echo '    echo "--- its stderr:"; cat "$walk_err" || true; } >&3; }'
  echo 'trap '"'"'walk_fail $?; exit 1'"'"' ERR'
  echo 'trap '"'"'kill $(jobs -p) 2>/dev/null || true'"'"' EXIT  # a server left by a failed block'
  printf 'cd %q\n' "$T/work"
} >"$script"
n=$(ls "$T/blocks" | grep -c '\.meta$')
ran=0
for i in $(seq 1 "$n"); do
  { read -r line; read -r kind; IFS= read -r expect; IFS= read -r file; read -r twice; } \
    <"$T/blocks/$i.meta"
  body=$(cat "$T/blocks/$i.body")
  case $kind in
    file)
      cp "$T/blocks/$i.body" "$T/work/$file"
      echo "walk: README.md line $line: written to $file"
      continue ;;
    gpu)
      if [ $gpu -eq 0 ]; then
        echo "walk: README.md line $line: a GPU block, not run (--gpu runs it)"
        continue
      fi ;;
  esac
  body=${body//.\/build\/atlas/$(printf %q "$bin")}
  for rep in $(seq 1 $((twice == 1 ? 2 : 1))); do
    out=$T/out/$i.$rep.out err=$T/out/$i.$rep.err again=""
    [ "$rep" -eq 2 ] && again=" (again)"
    {
      printf 'walk_line=%q walk_out=%q walk_err=%q\n' "$line$again" "$out" "$err"
      printf 'echo "== README.md line %s%s"\n' "$line" "$again"
      printf '{\n%s\n} </dev/null >%q 2>%q\n' "$body" "$out" "$err"
      printf 'head -n 8 %q | head -c 1500; echo\n' "$out"
      if [ -n "$expect" ]; then
        printf 'grep -qF -- %q %q || { echo "FAIL: README.md line %s: its output does not hold %s" >&2; exit 1; }\n' \
          "$expect" "$out" "$line" "$(printf %q "$expect")"
      fi
    } >>"$script"
  done
  ran=$((ran + 1))
done
# A server the README starts, the README stops.
cat >>"$script" <<'EOF'
left=$(jobs -p)
if [ -n "$left" ]; then
  echo "FAIL: README.md leaves a process running in the background ($left)" >&2
  kill $left 2>/dev/null || true
  exit 1
fi
EOF

echo "walk: $ran blocks of $readme against $bin"
t0=$(date +%s.%N)
HOME=$T/home env -u ATLAS_API_KEY bash "$script"
echo "walk: every block passed ($(awk -v a="$t0" -v b="$(date +%s.%N)" 'BEGIN { printf "%.1f", b - a }') s)"
