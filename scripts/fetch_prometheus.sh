#!/usr/bin/env bash
# Fetch Debian's `prometheus` package (ships prometheus + promtool) without root and unpack
# it into $REPO/.cache/prometheus, leaving the binaries at
#   .cache/prometheus/usr/bin/prometheus  and  .cache/prometheus/usr/bin/promtool
# There is no Prometheus server on PyPI; see deploy/README.md for running it.
# Idempotent: does nothing if the binary is already there and runs `--version`.
set -euo pipefail

REPO=$(cd "$(dirname "$0")/.." && pwd)
DEST="$REPO/.cache/prometheus"
BIN="$DEST/usr/bin/prometheus"

die() { echo "[fetch_prometheus] ERROR: $*" >&2; exit 1; }

if [[ -x "$BIN" ]] && "$BIN" --version >/dev/null 2>&1; then
  echo "[fetch_prometheus] already present: $BIN"
  "$BIN" --version 2>&1 | head -1
  exit 0
fi

command -v apt-get >/dev/null 2>&1 || die "apt-get not found (needs a Debian/Ubuntu host); install Prometheus manually into $DEST/usr/bin"
command -v dpkg-deb >/dev/null 2>&1 || die "dpkg-deb not found (needs a Debian/Ubuntu host); install Prometheus manually into $DEST/usr/bin"

TMP=$(mktemp -d)
trap 'rm -rf "$TMP"' EXIT

echo "[fetch_prometheus] downloading the Debian 'prometheus' package into $TMP"
if ! (cd "$TMP" && apt-get download prometheus); then
  die "'apt-get download prometheus' failed (no package index? try 'sudo apt-get update', or check the network/apt sources)"
fi

shopt -s nullglob
debs=("$TMP"/prometheus_*.deb)
(( ${#debs[@]} == 1 )) || die "expected one prometheus_*.deb in $TMP, found ${#debs[@]}"

mkdir -p "$DEST"
echo "[fetch_prometheus] unpacking $(basename "${debs[0]}") into $DEST"
dpkg-deb -x "${debs[0]}" "$DEST" || die "dpkg-deb -x failed on ${debs[0]}"

[[ -x "$BIN" ]] || die "unpacked package has no usr/bin/prometheus"
"$BIN" --version >/dev/null 2>&1 || die "$BIN does not run ('$BIN --version' failed)"
echo "[fetch_prometheus] ok: $BIN"
"$BIN" --version 2>&1 | head -1
if [[ -x "$DEST/usr/bin/promtool" ]]; then
  echo "[fetch_prometheus] promtool: $DEST/usr/bin/promtool"
fi
