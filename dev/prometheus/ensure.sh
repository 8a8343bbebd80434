#!/usr/bin/env bash
# Makes sure a Prometheus with Kubernetes service discovery is available and
# prints its path; idempotent and quick once built (call it from `make test`'s
# and `make demo`'s set-up).
#
# Debian's prometheus package would be the obvious choice, but bookworm's 2.42
# build leaves Kubernetes SD out (`kubernetes_sd_configs` fails with "field not
# found"), so an upstream Prometheus is built from pinned Go modules by
# build.sh, the same way the control plane is. A prometheus on PATH is used
# only when it has Kubernetes SD compiled in.
set -euo pipefail

here="$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)"

if [ -n "${TORCHFLEET_PROMETHEUS:-}" ]; then
    echo "$TORCHFLEET_PROMETHEUS"
    exit 0
fi

on_path="$(command -v prometheus || true)"
if [ -n "$on_path" ] && grep -q "discovery/kubernetes" "$on_path" 2>/dev/null; then
    echo "$on_path"
    exit 0
fi

exec "$here/build.sh"
