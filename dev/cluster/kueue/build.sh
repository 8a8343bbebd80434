#!/usr/bin/env bash
# Builds Kueue from its Go module and prints the cache folder that holds
#   bin/kueue          the manager (sigs.k8s.io/kueue/cmd/kueue)
#   crds/*.yaml        its CRDs, from the same module
#   webhooks.yaml      its webhook configurations, from the same module
# Cached outside the repo, keyed by the pinned version, the wrapper module and
# the Go toolchain, so a warm run is a hash and a few stat calls.
#
# Built from the wrapper module gomod/ (Kueue's own dependency versions):
# `go install pkg@version` needs the proxy's version list, which the proxy here
# refuses. gomod/go.sum pins Kueue's module hash too (sum.golang.org answers
# 404 for it here; regenerate with `GONOSUMDB=sigs.k8s.io/kueue go mod tidy`).
# The module zip carries the whole repository, manifests included.
set -euo pipefail
here=$(cd "$(dirname "$0")" && pwd)
# shellcheck source=versions.env
source "$here/versions.env"
module=sigs.k8s.io/kueue
grep -q "^require $module $KUEUE_VERSION$" "$here/gomod/go.mod" || {
  echo "[kueue-build] gomod/go.mod does not require $module $KUEUE_VERSION (versions.env)" >&2
  exit 1
}

key=$( { cat "$here/versions.env" "$here/build.sh" "$here/gomod/go.mod" "$here/gomod/go.sum"; go env GOVERSION; } | sha256sum | cut -c1-16)
cache=${TORCHFLEET_CACHE:-$HOME/.cache/torchfleet}/kueue-$KUEUE_VERSION-$key
complete() { [ -x "$cache/bin/kueue" ] && [ -s "$cache/webhooks.yaml" ] && [ -d "$cache/crds" ]; }
if complete; then echo "$cache"; exit 0; fi
# shellcheck source=../../cache-lock.sh
source "$here/../../cache-lock.sh"
lock_cache "$cache"
if complete; then echo "$cache"; exit 0; fi  # built while we waited

log() { echo "[kueue-build] $*" >&2; }
mkdir -p "$cache/bin" "$cache/crds"
cd "$here/gomod"
if [ ! -x "$cache/bin/kueue" ]; then
  log "building kueue $KUEUE_VERSION (cold: several minutes on 2 cores)"
  start=$(date +%s)
  CGO_ENABLED=0 go build -trimpath \
    -ldflags "-s -w -X $module/pkg/version.GitVersion=$KUEUE_VERSION" \
    -o "$cache/bin/kueue.tmp" "$module/cmd/kueue"
  mv "$cache/bin/kueue.tmp" "$cache/bin/kueue"
  log "built kueue in $(( $(date +%s) - start ))s"
fi
src=$(go list -m -f '{{.Dir}}' "$module")
[ -d "$src/config/components" ] || { log "no manifests in $src"; exit 1; }
cp "$src"/config/components/crd/bases/*.yaml "$cache/crds/"
chmod u+w "$cache"/crds/*.yaml
cp "$src/config/components/webhook/manifests.yaml" "$cache/webhooks.yaml.tmp"
chmod u+w "$cache/webhooks.yaml.tmp" && mv "$cache/webhooks.yaml.tmp" "$cache/webhooks.yaml"
complete
echo "$cache"
