#!/usr/bin/env bash
# Installs Debian's prometheus package if it is missing; does nothing if it is
# there. The e2e tests and `make demo` start their own Prometheus with their own
# config (dev/prometheus/start.sh), so the packaged service must never start:
# a policy-rc.d that forbids service starts is put in place for the install
# when the machine has none.
set -euo pipefail

if command -v prometheus >/dev/null 2>&1; then
    exit 0
fi

if [ "$(id -u)" != 0 ]; then
    echo "ensure.sh: prometheus is missing and installing it needs root (apt-get)" >&2
    exit 1
fi

policy=/usr/sbin/policy-rc.d
created_policy=0
if [ ! -e "$policy" ]; then
    printf '#!/bin/sh\nexit 101\n' >"$policy"
    chmod +x "$policy"
    created_policy=1
fi
cleanup() { if [ "$created_policy" = 1 ]; then rm -f "$policy"; fi; }
trap cleanup EXIT

export DEBIAN_FRONTEND=noninteractive
apt-get update -qq
apt-get install -y -qq --no-install-recommends prometheus >/dev/null
command -v prometheus >/dev/null
prometheus --version 2>&1 | head -1
