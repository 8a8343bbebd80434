#!/usr/bin/env bash
# Builds the real node's parts and prints the folder that holds them: the
# kubelet (from the control plane's module set, dev/cluster/gomod/<version>), containerd
# v2 with its runc shim and ctr, the CNI plugins, and two OCI image archives
# made without a registry (the pause image from pause.c, a static-busybox base).
# runc and busybox-static come from Debian. Cached outside the repo, keyed by
# every input, so a warm run is a hash and a few stat calls.
set -euo pipefail
here=$(cd "$(dirname "$0")" && pwd)
# shellcheck source=versions.env
source "$here/versions.env"
requested=${KUBERNETES_VERSION:-}
# shellcheck source=../cluster/versions.env
source "$here/../cluster/versions.env"
KUBERNETES_VERSION=${requested:-$KUBERNETES_VERSION}
gomod=$here/../cluster/gomod/$KUBERNETES_VERSION

key=$( { cat "$here/versions.env" "$gomod/go.mod" "$gomod/go.sum" "$here/pause.c" "$here/ociimage.py" "$0"; go env GOVERSION; } | sha256sum | cut -c1-16)
cache=${TORCHFLEET_CACHE:-$HOME/.cache/torchfleet}/realnode-$KUBERNETES_VERSION-$key
bin=$cache/bin
parts=(kubelet containerd containerd-shim-runc-v2 ctr cni/bridge cni/host-local cni/loopback pause.tar busybox.tar)

complete() { for p in "${parts[@]}"; do [ -e "$bin/$p" ] || return 1; done; command -v runc >/dev/null; }
if complete; then echo "$bin"; exit 0; fi
# shellcheck source=../cache-lock.sh
source "$here/../cache-lock.sh"
lock_cache "$cache"
if complete; then echo "$bin"; exit 0; fi  # built while we waited

mkdir -p "$bin/cni"
log() { echo "[realnode-build] $*" >&2; }
if ! command -v runc >/dev/null || [ ! -x /bin/busybox ]; then
  log "installing runc and busybox-static from Debian"
  sudo=""; [ "$(id -u)" -eq 0 ] || sudo="sudo"
  $sudo apt-get update -qq
  DEBIAN_FRONTEND=noninteractive $sudo apt-get install -y -qq --no-install-recommends runc busybox-static >/dev/null
fi
export CGO_ENABLED=0
if [ ! -x "$bin/kubelet" ]; then
  log "building kubelet $KUBERNETES_VERSION (cold: minutes on 2 cores)"
  # The module set lacks the kubelet's few extra requirements: resolve them in
  # a copy so dev/cluster/gomod stays as gen-gomod.sh wrote it.
  work=$(mktemp -d); trap 'rm -rf "$work"' EXIT
  cp "$gomod/go.mod" "$gomod/go.sum" "$gomod/tools.go" "$work/"
  cp -r "$gomod/cmd" "$work/"
  minor=${KUBERNETES_VERSION#v1.}; minor=${minor%%.*}
  (cd "$work" && GOFLAGS=-mod=mod go build -trimpath -o "$bin/kubelet.tmp" \
    -ldflags "-s -w -X k8s.io/component-base/version.gitVersion=$KUBERNETES_VERSION -X k8s.io/component-base/version.gitMajor=1 -X k8s.io/component-base/version.gitMinor=$minor" \
    k8s.io/kubernetes/cmd/kubelet)
  mv "$bin/kubelet.tmp" "$bin/kubelet"
fi
for cmd in containerd containerd-shim-runc-v2 ctr; do
  [ -x "$bin/$cmd" ] && continue
  log "building $cmd $CONTAINERD_VERSION"
  GOBIN="$bin" go install -trimpath -ldflags "-s -w -X github.com/containerd/containerd/v2/version.Version=$CONTAINERD_VERSION" \
    "github.com/containerd/containerd/v2/cmd/$cmd@$CONTAINERD_VERSION"
done
for plugin in main/bridge main/loopback ipam/host-local; do
  [ -x "$bin/cni/${plugin#*/}" ] && continue
  log "building CNI plugin $plugin $CNI_PLUGINS_VERSION"
  GOBIN="$bin/cni" go install -trimpath -ldflags "-s -w" "github.com/containernetworking/plugins/plugins/$plugin@$CNI_PLUGINS_VERSION"
done
if [ ! -e "$bin/pause.tar" ]; then
  log "building the pause image"
  gcc -static -O2 -o "$bin/pause" "$here/pause.c"
  python3 "$here/ociimage.py" "$bin/pause.tar.tmp" torchfleet.local/pause:3.10 /pause "$bin/pause=/pause"
  mv "$bin/pause.tar.tmp" "$bin/pause.tar"
fi
if [ ! -e "$bin/busybox.tar" ]; then
  log "building the busybox base image from Debian's static busybox"
  links=()
  for applet in sh cat echo env sleep ls true false printf id hostname; do links+=("@/bin/$applet=busybox"); done
  python3 "$here/ociimage.py" "$bin/busybox.tar.tmp" torchfleet.local/busybox:1.35 /bin/sh /bin/busybox=/bin/busybox "${links[@]}"
  mv "$bin/busybox.tar.tmp" "$bin/busybox.tar"
fi
complete
echo "$bin"
