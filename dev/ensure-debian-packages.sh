#!/usr/bin/env bash
# Installs the Debian packages the tests and the demo use, only when missing.
# openssl: the local cluster's certificates. prometheus: the real Prometheus
# that scrapes training pods in the e2e tier and the demo.
set -euo pipefail
need=()
command -v openssl >/dev/null || need+=(openssl)
command -v prometheus >/dev/null || need+=(prometheus)
[ ${#need[@]} -eq 0 ] && exit 0
sudo=""; [ "$(id -u)" -eq 0 ] || sudo="sudo"
echo "[deps] installing ${need[*]} from Debian"
$sudo apt-get update -qq
DEBIAN_FRONTEND=noninteractive $sudo apt-get install -y -qq --no-install-recommends "${need[@]}" >/dev/null
