#!/usr/bin/env bash
# Builds one of the real node's small Go programs and prints the binary's
# path: NAME is a folder here holding its own Go module (coredns: CoreDNS with
# only the plugins the node needs; deviceplugin: the fake-GPU device plugin).
# Apart from build.sh, so that the kubelet and containerd keep their cache
# key. Cached outside the repo, keyed by the module, this script and Go's
# version: a warm run is a hash and a stat.
#
#   dev/realnode/gotool.sh coredns|deviceplugin
set -euo pipefail
here=$(cd "$(dirname "$0")" && pwd)
name=${1:?usage: gotool.sh NAME (a Go module folder in dev/realnode)}
src=$here/$name
[ -f "$src/go.mod" ] || { echo "gotool.sh: $src holds no Go module" >&2; exit 2; }
key=$( { cat "$src/go.mod" "$src/go.sum" "$src"/*.go "$0"; go env GOVERSION; } | sha256sum | cut -c1-16)
cache=${TORCHFLEET_CACHE:-$HOME/.cache/torchfleet}/$name-$key
bin=$cache/$name

if [ -x "$bin" ]; then echo "$bin"; exit 0; fi
# shellcheck source=../cache-lock.sh
source "$here/../cache-lock.sh"
lock_cache "$cache"
if [ -x "$bin" ]; then echo "$bin"; exit 0; fi  # built while we waited

echo "[realnode-build] building $name" >&2
mkdir -p "$cache"
(cd "$src" && CGO_ENABLED=0 GOFLAGS=-mod=mod go build -trimpath -ldflags "-s -w" -o "$bin.tmp" .)
mv "$bin.tmp" "$bin"
echo "$bin"
