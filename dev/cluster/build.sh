#!/usr/bin/env bash
# Builds the local control plane from Go modules and prints the folder that
# holds the binaries. Cached outside the repo, keyed by every pinned version,
# so a warm run is a hash and a few stat calls.
#
# The Kubernetes release is $KUBERNETES_VERSION (default: versions.env); each
# supported release has its own wrapper module gomod/<version>/ (made by
# gen-gomod.sh), which pins etcd too. Each release has its own cache folder,
# so the releases' binaries live side by side.
set -euo pipefail
here=$(cd "$(dirname "$0")" && pwd)
requested=${KUBERNETES_VERSION:-}
# shellcheck source=versions.env
source "$here/versions.env"
KUBERNETES_VERSION=${requested:-$KUBERNETES_VERSION}
gomod=$here/gomod/$KUBERNETES_VERSION
grep -q "^	k8s.io/kubernetes $KUBERNETES_VERSION$" "$gomod/go.mod" 2>/dev/null || {
  echo "[cluster-build] no wrapper module for k8s.io/kubernetes $KUBERNETES_VERSION (supported: $(ls "$here/gomod" | tr '\n' ' '))" >&2
  exit 1
}

key=$( { echo "$KUBERNETES_VERSION $KWOK_VERSION $HELM_VERSION"; cat "$gomod/go.mod" "$gomod/go.sum" "$gomod/cmd/etcd/main.go"; go env GOVERSION; } | sha256sum | cut -c1-16)
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
cd "$gomod"
for cmd in kube-apiserver kube-controller-manager kube-scheduler kubectl; do
  [ -x "$bin/$cmd" ] && continue
  log "building $cmd $KUBERNETES_VERSION (cold: minutes each on 2 cores)"
  go build -trimpath -ldflags "$ldflags" -o "$bin/$cmd.tmp" "k8s.io/kubernetes/cmd/$cmd"
  mv "$bin/$cmd.tmp" "$bin/$cmd"
done
if [ ! -x "$bin/etcd" ]; then
  log "building etcd $(awk '$1 == "go.etcd.io/etcd/server/v3" {print $2; exit}' go.mod)"
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
