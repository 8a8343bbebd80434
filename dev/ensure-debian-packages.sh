#!/usr/bin/env bash
# Installs the Debian packages the tests and the demo use, only when missing.
# openssl: the local cluster's certificates. prometheus: its promtool checks
# the chart's alert rules (the Prometheus that scrapes is built from Go modules:
# Debian's lacks Kubernetes discovery). iproute2 and util-linux: the e2e node
# agent gives each pod its own network and mount namespace (ip, unshare, nsenter).
# chromium: the e2e test renders TensorBoard's loss chart in it, headless.
# g++: DeepSpeed builds its shared-memory op at a process's first start
# (tests/e2e/test_deepspeed.py; once per machine, cached).
# mmdebstrap and buildah: the operator image is built from its Dockerfile on a
# Debian-made Python base, without Docker (dev/realnode/operator-image.sh).
set -euo pipefail
need=()
command -v openssl >/dev/null || need+=(openssl)
command -v promtool >/dev/null || need+=(prometheus)
command -v ip >/dev/null || need+=(iproute2)
{ command -v unshare && command -v nsenter; } >/dev/null || need+=(util-linux)
command -v chromium >/dev/null || need+=(chromium)
command -v g++ >/dev/null || need+=(g++)
command -v mmdebstrap >/dev/null || need+=(mmdebstrap)
command -v buildah >/dev/null || need+=(buildah)
[ ${#need[@]} -eq 0 ] && exit 0
sudo=""; [ "$(id -u)" -eq 0 ] || sudo="sudo"
echo "[deps] installing ${need[*]} from Debian"
$sudo apt-get update -qq
DEBIAN_FRONTEND=noninteractive $sudo apt-get install -y -qq --no-install-recommends "${need[@]}" >/dev/null
