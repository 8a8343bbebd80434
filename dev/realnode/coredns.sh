#!/usr/bin/env bash
# Builds the real node's CoreDNS (coredns/: a wrapper module that builds
# CoreDNS with only the plugins the node needs) and prints the binary's path.
# Separate from build.sh, so that the kubelet and containerd keep their cache
# key. Cached outside the repo, keyed by the module, this script and Go's
# version: a warm run is a hash and a stat.
set -euo pipefail
here=$(cd "$(dirname "$0")" && pwd)
src=$here/coredns
key=$( { cat "$src/go.mod" "$src/go.sum" "$src/main.go" "$0"; go env GOVERSION; } | sha256sum | cut -c1-16)
cache=${TORCHFLEET_CACHE:-$HOME/.cache/torchfleet}/coredns-$key
bin=$cache/coredns

if [ -x "$bin" ]; then echo "$bin"; exit 0; fi
# shellcheck source=../cache-lock.sh
source "$here/../cache-lock.sh"
lock_cache "$cache"
if [ -x "$bin" ]; then echo "$bin"; exit 0; fi  # built while we waited

echo "[coredns-build] building CoreDNS (kubernetes, template, errors, bind)" >&2
mkdir -p "$cache"
(cd "$src" && CGO_ENABLED=0 GOFLAGS=-mod=mod go build -trimpath -ldflags "-s -w" -o "$bin.tmp" .)
mv "$bin.tmp" "$bin"
echo "$bin"
