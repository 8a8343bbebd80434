#!/usr/bin/env bash
# Builds the gang schedulers from Go modules and prints the folder holding
# each one's binaries and CRDs (crds/), one a line, in the order asked
# (default: both):
#   coscheduling: scheduler-plugins' kube-scheduler (the Coscheduling plugin)
#                 and its controller (it writes the PodGroup's status), with
#                 the PodGroup and ElasticQuota CRDs (the controller watches both)
#   volcano:      vc-scheduler, with the PodGroup, Queue and Numatopology CRDs
# The CRDs come from the same module version as the binaries. Cached outside
# the repo, keyed by the pinned version and the wrapper module, so a warm run
# is a hash and a few stat calls. Cold on 2 cores: minutes each.
#
# usage: dev/cluster/schedulers/build.sh [coscheduling] [volcano]
set -euo pipefail
here=$(cd "$(dirname "$0")" && pwd)
# shellcheck source=versions.env
source "$here/versions.env"
log() { echo "[schedulers-build] $*" >&2; }
# shellcheck source=../../cache-lock.sh
source "$here/../../cache-lock.sh"

build_one() {
  local name=$1 module version ldflags
  local -a targets crds  # binary=package; CRD paths inside the module
  case $name in
    coscheduling)
      module=$SCHEDULER_PLUGINS_MODULE version=$SCHEDULER_PLUGINS_VERSION
      targets=("scheduler-plugins=$module/cmd/scheduler"
               "scheduler-plugins-controller=$module/cmd/controller")
      crds=(manifests/coscheduling/crd.yaml manifests/capacityscheduling/crd.yaml)
      ldflags="-s -w -X k8s.io/component-base/version.gitVersion=$version" ;;
    volcano)
      module=$VOLCANO_MODULE version=$VOLCANO_VERSION
      targets=("vc-scheduler=$module/cmd/scheduler")
      # Numatopology too: the scheduler's cache waits for every informer it
      # starts to sync, that one included, before it schedules anything.
      crds=(config/crd/volcano/bases/scheduling.volcano.sh_podgroups.yaml
            config/crd/volcano/bases/scheduling.volcano.sh_queues.yaml
            config/crd/volcano/bases/nodeinfo.volcano.sh_numatopologies.yaml)
      ldflags="-s -w -X volcano.sh/volcano/pkg/version.Version=$version" ;;
    *) echo "unknown scheduler $name (coscheduling or volcano)" >&2; return 2 ;;
  esac
  local key dir target binary src crd
  key=$( { cat "$here/versions.env" "$here/$name/go.mod" "$here/$name/go.sum"; go env GOVERSION; } | sha256sum | cut -c1-16)
  dir=${TORCHFLEET_CACHE:-$HOME/.cache/torchfleet}/$name-$version-$key
  mkdir -p "$dir/crds"
  for target in "${targets[@]}"; do
    binary=${target%%=*}
    [ -x "$dir/$binary" ] && continue
    [ "${locked:-}" = "$dir" ] || { lock_cache "$dir"; locked=$dir; }
    [ -x "$dir/$binary" ] && continue  # built while we waited
    log "building $binary $version (cold: minutes on 2 cores)"
    (cd "$here/$name" && CGO_ENABLED=0 go build -trimpath -ldflags "$ldflags" -o "$dir/$binary.tmp" "${target#*=}")
    mv "$dir/$binary.tmp" "$dir/$binary"
  done
  for crd in "${crds[@]}"; do
    [ -s "$dir/crds/$(basename "$(dirname "$crd")")-$(basename "$crd")" ] && continue
    src=$(cd "$here/$name" && go mod download -json "$module@$version" | sed -n 's/.*"Dir": "\(.*\)".*/\1/p')
    cp "$src/$crd" "$dir/crds/$(basename "$(dirname "$crd")")-$(basename "$crd")"
  done
  echo "$dir"
}

[ $# -gt 0 ] || set -- coscheduling volcano
for name in "$@"; do build_one "$name"; done
