#!/usr/bin/env bash
# scripts/gpu-deps.sh — the Debian libraries atlas builds against, for a GPU machine that has
# nvcc/cmake but not these -dev packages and cannot download (the device tool's machines).
#   here:   scripts/gpu-deps.sh fetch            # apt-get download into .carry/debs (ignored)
#   there:  source scripts/gpu-deps.sh install   # unpack into /tmp/dep, set PKG_CONFIG_PATH
#                                                # and LD_LIBRARY_PATH (carry .carry/debs)
# libmicrohttpd's .pc requires gnutls's, which such machines lack: Requires.private is
# dropped (atlas links dynamically and needs only the public flags).
pkgs="libjansson-dev libjansson4 libpcre2-dev libpcre2-8-0 libpcre2-16-0 libpcre2-32-0
      libpcre2-posix3 libutf8proc-dev libutf8proc2 libmicrohttpd-dev libmicrohttpd12
      libedit-dev libedit2"
case "${1:-}" in
fetch)
  mkdir -p .carry/debs && (cd .carry/debs && apt-get download $pkgs) ;;
install)
  P=/tmp/dep
  mkdir -p $P
  for f in .carry/debs/*.deb; do dpkg -x "$f" $P; done
  PC=$P/usr/lib/x86_64-linux-gnu/pkgconfig
  sed -i "s|^prefix=.*|prefix=$P/usr|; /^Requires.private/d" $PC/*.pc
  export PKG_CONFIG_PATH=$PC LD_LIBRARY_PATH=$P/usr/lib/x86_64-linux-gnu${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH}
  ;;
*) echo "usage: scripts/gpu-deps.sh fetch | source scripts/gpu-deps.sh install" >&2 ;;
esac
