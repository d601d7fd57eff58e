#!/bin/sh
# bench/conformance/serve_local.sh ATLAS BOUND DIR... — the conformance check through
# `atlas serve`: starts ATLAS serve with every DIR (NAME = its last component) on a free port,
# runs serve_check.py against it (8 requests at once a model, each of atlas's top 8 log-probs
# within BOUND of the DIR's reference.safetensors), stops the server; exits as serve_check.py.
# SERVE_ARGS: more `atlas serve` options (e.g. "--device cpu --batch-tokens 16 --parallel 8");
# MARKDOWN: a file the result rows are appended to (LABEL: their device column, default
# serve); SERVE_LOG: the server's log (default a
# temporary file, printed when the check fails); REFERENCE: the reference file in each DIR
# (default reference.safetensors; reference-kvfp8.safetensors with --kv-cache-dtype fp8 in
# SERVE_ARGS). Exit 77 (ctest's SKIP) without python3.
set -u
atlas=$1 bound=$2
shift 2
here=$(cd "$(dirname "$0")" && pwd)
command -v python3 >/dev/null 2>&1 || { echo "SKIP: python3 not found"; exit 77; }
[ -x "$atlas" ] || { echo "$atlas is not an executable"; exit 1; }
log=${SERVE_LOG:-$(mktemp "${TMPDIR:-/tmp}/atlas-serve-XXXXXX")}
models= pairs=
for d in "$@"; do
  n=$(basename "$d")
  models="$models --model $n=$d"
  pairs="$pairs $n=$d"
done
# shellcheck disable=SC2086 # word splitting wanted: the model and option lists
"$atlas" serve $models --port 0 --max-resident 1 ${SERVE_ARGS:-} > "$log" 2>&1 &
srv=$!
chk=
# stopped (a time limit): the server and the client go too
trap 'kill $srv $chk 2>/dev/null; exit 124' TERM INT HUP
url=
i=0
while [ $i -lt 600 ] && kill -0 $srv 2>/dev/null; do
  url=$(sed -n 's/.* info listening on \(http[^ ]*\).*/\1/p' "$log" | head -1)
  [ -n "$url" ] && break
  sleep 0.1
  i=$((i + 1))
done
if [ -z "$url" ]; then
  echo "atlas serve did not start:"; cat "$log"
  kill $srv 2>/dev/null
  exit 1
fi
md=
[ -n "${MARKDOWN:-}" ] && md="--markdown $MARKDOWN --label ${LABEL:-serve}"
# shellcheck disable=SC2086
python3 "$here/serve_check.py" --url "$url" --bound "$bound" \
  --reference "${REFERENCE:-reference.safetensors}" $md $pairs &
chk=$!
wait $chk
rc=$?
kill $srv 2>/dev/null
wait $srv 2>/dev/null
[ $rc -ne 0 ] && { echo "--- atlas serve's log ($log):"; tail -20 "$log"; }
[ -z "${SERVE_LOG:-}" ] && rm -f "$log"
exit $rc
