#!/usr/bin/env bash
# Builds the local control plane from Go modules and prints the folder that
# holds the binaries. Cached outside the repo, keyed by every pinned version,
# so a warm run is a hash and a few stat calls.
set -euo pipefail
here=$(cd "$(dirname "$0")" && pwd)
# shellcheck source=versions.env
source "$here/versions.env"

key=$( { cat "$here/versions.env" "$here/gomod/go.mod" "$here/gomod/go.sum" "$here/gomod/cmd/etcd/main.go"; go env GOVERSION; } | sha256sum | cut -c1-16)
cache=${TORCHFLEET_CACHE:-$HOME/.cache/torchfleet}/cluster-$KUBERNETES_VERSION-$key
bin=$cache/bin
tools=(etcd kube-apiserver kube-controller-manager kube-scheduler kubectl kwok helm)

complete() { for t in "${tools[@]}"; do [ -x "$bin/$t" ] || return 1; done; }
if complete; then echo "$bin"; exit 0; fi
# shellcheck source=../cache-lock.sh
source "$here/../cache-lock.sh"
lock_cache "$cache"
if complete; then echo "$bin"; exit 0; fi  # built while we waited

mkdir -p "$bin"
log() { echo "[cluster-build] $*" >&2; }
# So the binaries report their release (kubectl version, /version), e.g. 1 / 36.
minor=${KUBERNETES_VERSION#v1.}; minor=${minor%%.*}
ldflags="-s -w -X k8s.io/component-base/version.gitVersion=$KUBERNETES_VERSION -X k8s.io/component-base/version.gitMajor=1 -X k8s.io/component-base/version.gitMinor=$minor"
export CGO_ENABLED=0
cd "$here/gomod"
for cmd in kube-apiserver kube-controller-manager kube-scheduler kubectl; do
  [ -x "$bin/$cmd" ] && continue
  log "building $cmd $KUBERNETES_VERSION (cold: minutes each on 2 cores)"
  go build -trimpath -ldflags "$ldflags" -o "$bin/$cmd.tmp" "k8s.io/kubernetes/cmd/$cmd"
  mv "$bin/$cmd.tmp" "$bin/$cmd"
done
if [ ! -x "$bin/etcd" ]; then
  log "building etcd $ETCD_VERSION"
  go build -trimpath -ldflags "-s -w" -o "$bin/etcd.tmp" ./cmd/etcd && mv "$bin/etcd.tmp" "$bin/etcd"
fi
# KWOK and Helm have no replace lines in their go.mod: plain go install works.
if [ ! -x "$bin/kwok" ]; then
  log "building kwok $KWOK_VERSION"
  GOBIN="$bin" go install -trimpath -ldflags "-s -w" "sigs.k8s.io/kwok/cmd/kwok@$KWOK_VERSION"
fi
if [ ! -x "$bin/helm" ]; then
  log "building helm $HELM_VERSION"
  GOBIN="$bin" go install -trimpath -ldflags "-s -w -X helm.sh/helm/v3/internal/version.version=$HELM_VERSION" "helm.sh/helm/v3/cmd/helm@$HELM_VERSION"
fi
complete
echo "$bin"
