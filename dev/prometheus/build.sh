#!/usr/bin/env bash
# Builds upstream Prometheus with Kubernetes service discovery from the pinned
# wrapper module in gomod/, cached outside the repo like the control plane:
#   ~/.cache/torchfleet/prometheus-<version>/prometheus
# Prints the binary's path. Does nothing when the cached binary exists.
#
# Why not Debian's package alone: bookworm's prometheus 2.42 is built without
# discovery/kubernetes (client-go is not packaged in Debian), so it cannot use
# kubernetes_sd_configs. Only Kubernetes SD (plus file/http) is compiled in,
# through Prometheus's own build tags, to keep the build small.
set -euo pipefail

here="$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)"
version="$(awk '$1 == "require" && $2 == "github.com/prometheus/prometheus" {print $3}' "$here/gomod/go.mod")"
cache="${TORCHFLEET_CACHE:-$HOME/.cache/torchfleet}/prometheus-$version"
binary="$cache/prometheus"

if [ -x "$binary" ]; then
    echo "$binary"
    exit 0
fi

# shellcheck source=../cache-lock.sh
source "$here/../cache-lock.sh"
lock_cache "$cache"
if [ -x "$binary" ]; then  # built while we waited
    echo "$binary"
    exit 0
fi

go_bin="$(command -v go || echo /usr/local/go/bin/go)"
if [ ! -x "$go_bin" ]; then
    echo "build.sh: Go is needed to build Prometheus (see dev/cluster/build.sh for the toolchain)" >&2
    exit 1
fi

mkdir -p "$cache"
echo "building Prometheus $version with Kubernetes SD into $cache (a few minutes, once)" >&2
(
    cd "$here/gomod"
    GOFLAGS=-mod=mod nice -n 10 "$go_bin" build -trimpath \
        -tags remove_all_sd,enable_kubernetes_sd \
        -ldflags "-s -w -X github.com/prometheus/common/version.Version=${version#v}" \
        -o "$binary.tmp" github.com/prometheus/prometheus/cmd/prometheus
)
mv "$binary.tmp" "$binary"
echo "$binary"
