#!/usr/bin/env bash
# Builds Kueue from its Go module and prints the cache folder that holds
#   bin/kueue          the manager (sigs.k8s.io/kueue/cmd/kueue)
#   crds/*.yaml        its CRDs, from the same module
#   webhooks.yaml      its webhook configurations, from the same module
#   conversion/        the CRDs whose versions convert through Kueue's webhook
#                      (the patches Kueue's own kustomization enables; none in 0.10)
# Cached outside the repo, keyed by the pinned version, the wrapper module and
# the Go toolchain, so a warm run is a hash and a few stat calls.
#
# The version is $KUEUE_VERSION (default: versions.env); each supported version
# has its own wrapper module gomod/<version>/ (Kueue's own dependency versions):
# `go install pkg@version` needs the proxy's version list, which the proxy here
# refuses. gomod/go.sum pins Kueue's module hash too (sum.golang.org answers
# 404 for it here; regenerate with `GONOSUMDB=sigs.k8s.io/kueue go mod tidy`).
# The module zip carries the whole repository, manifests included.
set -euo pipefail
here=$(cd "$(dirname "$0")" && pwd)
# shellcheck source=versions.env
requested=${KUEUE_VERSION:-}
source "$here/versions.env"
KUEUE_VERSION=${requested:-$KUEUE_VERSION}
module=sigs.k8s.io/kueue
gomod=$here/gomod/$KUEUE_VERSION
grep -q "^require $module $KUEUE_VERSION$" "$gomod/go.mod" 2>/dev/null || {
  echo "[kueue-build] no wrapper module for $module $KUEUE_VERSION (supported: $(ls "$here/gomod" | tr '\n' ' '))" >&2
  exit 1
}

key=$( { echo "$KUEUE_VERSION"; cat "$here/build.sh" "$gomod/go.mod" "$gomod/go.sum"; go env GOVERSION; } | sha256sum | cut -c1-16)
cache=${TORCHFLEET_CACHE:-$HOME/.cache/torchfleet}/kueue-$KUEUE_VERSION-$key
complete() { [ -x "$cache/bin/kueue" ] && [ -s "$cache/webhooks.yaml" ] && [ -d "$cache/crds" ] && [ -d "$cache/conversion" ]; }
if complete; then echo "$cache"; exit 0; fi
# shellcheck source=../../cache-lock.sh
source "$here/../../cache-lock.sh"
lock_cache "$cache"
if complete; then echo "$cache"; exit 0; fi  # built while we waited

log() { echo "[kueue-build] $*" >&2; }
mkdir -p "$cache/bin" "$cache/crds" "$cache/conversion.tmp"
cd "$gomod"
if [ ! -x "$cache/bin/kueue" ]; then
  log "building kueue $KUEUE_VERSION (cold: several minutes on 2 cores)"
  start=$(date +%s)
  # -p: the build machine is shared; KUEUE_BUILD_JOBS=0 lets Go use every core.
  CGO_ENABLED=0 go build -p "${KUEUE_BUILD_JOBS:-1}" -trimpath \
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
# Conversion webhooks: the patches the module's own kustomization has on
# (commented-out lines are off), copied as they are; kueue.py points them here.
sed -n 's|^- path: \(patches/webhook_in_.*\.yaml\)$|\1|p' "$src/config/components/crd/kustomization.yaml" |
  while read -r patch; do cp "$src/config/components/crd/$patch" "$cache/conversion.tmp/"; done
chmod -R u+w "$cache/conversion.tmp"
rm -rf "$cache/conversion" && mv "$cache/conversion.tmp" "$cache/conversion"
complete
echo "$cache"
