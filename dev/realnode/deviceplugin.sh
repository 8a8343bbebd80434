#!/usr/bin/env bash
# Builds the real node's fake-GPU device plugin (deviceplugin/: serves
# torchfleet.dev/fake-gpu to the kubelet, health flipped through a file) and
# prints the binary's path. Separate from build.sh, so that the kubelet and
# containerd keep their cache key. Cached outside the repo, keyed by the
# module, this script and Go's version: a warm run is a hash and a stat.
set -euo pipefail
here=$(cd "$(dirname "$0")" && pwd)
src=$here/deviceplugin
key=$( { cat "$src/go.mod" "$src/go.sum" "$src"/*.go "$0"; go env GOVERSION; } | sha256sum | cut -c1-16)
cache=${TORCHFLEET_CACHE:-$HOME/.cache/torchfleet}/deviceplugin-$key
bin=$cache/deviceplugin

if [ -x "$bin" ]; then echo "$bin"; exit 0; fi
# shellcheck source=../cache-lock.sh
source "$here/../cache-lock.sh"
lock_cache "$cache"
if [ -x "$bin" ]; then echo "$bin"; exit 0; fi  # built while we waited

echo "[deviceplugin-build] building the fake-GPU device plugin" >&2
mkdir -p "$cache"
(cd "$src" && CGO_ENABLED=0 GOFLAGS=-mod=mod go build -trimpath -ldflags "-s -w" -o "$bin.tmp" .)
mv "$bin.tmp" "$bin"
echo "$bin"
