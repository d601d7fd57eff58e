#!/bin/sh
# cmake/kernels-prebuilt.sh DIR NVCC-ARGUMENTS... — stands in for nvcc when
# ATLAS_KERNELS_FATBIN_DIR is set (cmake/kernels.cmake): `--version` prints the version of the
# nvcc that compiled DIR's kernels, and a compile `... -o OUT ...` copies DIR/$(basename OUT)
# to OUT, so that the build embeds the kernels of DIR as if it had compiled them.
dir=$1
shift
out=
while [ $# -gt 0 ]; do
  case $1 in
    --version) exec cat "$dir/nvcc-version.txt" ;;
    -o) out=$2; shift ;;
  esac
  shift
done
[ -n "$out" ] || { echo "kernels-prebuilt.sh: no -o OUT among the arguments" >&2; exit 1; }
src="$dir/$(basename "$out")"
[ -s "$src" ] || {
  echo "kernels-prebuilt.sh: $src is missing: build the kernels in that build first" >&2
  exit 1
}
exec cp "$src" "$out"
