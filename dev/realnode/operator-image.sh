#!/usr/bin/env bash
# Builds the operator image from the repository's own Dockerfile, without
# Docker, and prints the OCI archive the real node's containerd imports
# (`ctr images import`; the image's name is in the archive's index.json).
#
# The Dockerfile's base (python:3.11-slim-trixie) comes from a registry, which
# these machines cannot reach. It is stood in for by an image made from this
# machine's own Debian release with mmdebstrap (python3, python3-venv and
# python-is-python3, so `python` is on PATH), named for what it is
# (torchfleet.local/python-standin:<python>-<release>) and passed as the
# Dockerfile's PYTHON_IMAGE build argument. `buildah bud` (chroot isolation,
# vfs storage, both under the cache) then runs the Dockerfile as written: its
# `RUN pip install --require-hashes ...` really downloads and installs the
# lock, its user is created, its final stage copies the venv.
#
# Cached in ~/.cache/torchfleet/operator-image/, keyed by everything the
# Dockerfile copies (the .dockerignore allow-list: pyproject.toml, README.md,
# requirements/operator.txt, both packages' sources), the Dockerfile and this
# script: an unchanged tree rebuilds nothing (a hash and a stat). buildah's
# layer cache keeps the pip layer while only sources change.
#
#   dev/realnode/operator-image.sh              build if needed, print the archive
#   dev/realnode/operator-image.sh --check      exit 0 if the builder can run here
#   dev/realnode/operator-image.sh --run CMD..  build if needed, run CMD in the
#                                               image (buildah run, chroot; as its USER)
#   dev/realnode/operator-image.sh --base       make the stand-in Python base only,
#                                               print its OCI archive (the real
#                                               node's training pods run on it)
set -euo pipefail
here=$(cd "$(dirname "$0")" && pwd)
repo=$(cd "$here/../.." && pwd)
cache=${TORCHFLEET_CACHE:-$HOME/.cache/torchfleet}/operator-image
log() { echo "[operator-image] $*" >&2; }

if [ "${1:-}" = --check ]; then
  command -v mmdebstrap >/dev/null && command -v buildah >/dev/null && [ "$(id -u)" -eq 0 ]
  exit
fi

# shellcheck source=/dev/null
release=$(. /etc/os-release && echo "$VERSION_CODENAME")
base_packages=python3,python3-venv,python-is-python3
# The build context, staged: only what .dockerignore lets the Dockerfile see
# (the project metadata, the lock, both packages without bytecode), copied
# once, so the key and the build read the same files even while the shared
# tree is being edited.
context=$(mktemp -d "${TMPDIR:-/tmp}/operator-image.XXXXXX")
trap 'rm -rf "$context"' EXIT
(cd "$repo" && cp --parents Dockerfile .dockerignore pyproject.toml README.md requirements/operator.txt "$context/" \
  && find contract/torchfleet_contract operator/torchfleet_operator -type f \
       ! -path '*/__pycache__/*' ! -name '*.py[co]' -exec cp --parents -t "$context/" {} +)
key=$( { (cd "$context" && find . -type f -print0 | LC_ALL=C sort -z | xargs -0 sha256sum); \
  cat "$0"; echo "$release $base_packages"; } | sha256sum | cut -c1-16)
archive=$cache/operator-$key.tar
image=torchfleet.local/operator:dev-$key
buildah=(buildah --root "$cache/storage" --runroot "$cache/run" --storage-driver vfs)
finish() {
  if [ "${1:-}" != --run ]; then echo "$archive"; exit 0; fi
  shift
  local container
  container=$("${buildah[@]}" from --quiet --pull-never "$image")
  trap '"${buildah[@]}" rm "$container" >/dev/null; rm -rf "$context"' EXIT
  "${buildah[@]}" run --isolation chroot "$container" -- "$@"
  exit
}
if [ -s "$archive" ] && [ "${1:-}" != --base ]; then finish "$@"; fi

# shellcheck source=../cache-lock.sh
source "$here/../cache-lock.sh"
lock_cache "$cache"
if [ -s "$archive" ] && [ "${1:-}" != --base ]; then finish "$@"; fi # built while we waited
"$repo/dev/ensure-debian-packages.sh"
mkdir -p "$cache"

# The stand-in base, made from Debian's packages and named for what it is.
make_base() {
  local rootfs=$context/.base container
  mkdir "$rootfs"
  mmdebstrap --quiet --variant=minbase --include="$base_packages" \
    --dpkgopt='path-exclude=/usr/share/doc/*' --dpkgopt='path-exclude=/usr/share/man/*' \
    --dpkgopt='path-exclude=/usr/share/locale/*' \
    --customize-hook='rm -rf "$1"/var/lib/apt/lists/* "$1"/var/cache/apt/*' \
    "$release" "$rootfs/rootfs.tar"
  container=$("${buildah[@]}" from scratch)
  "${buildah[@]}" add --quiet "$container" "$rootfs/rootfs.tar" / >/dev/null
  "${buildah[@]}" config --env PATH=/usr/local/bin:/usr/local/sbin:/usr/sbin:/usr/bin:/sbin:/bin \
    --env LANG=C.UTF-8 --cmd python3 \
    --label org.opencontainers.image.description="Stand-in for python:$python_version-slim: Debian $release's python3 (mmdebstrap)" \
    "$container"
  "${buildah[@]}" commit --quiet --rm "$container" "$base" >/dev/null
  rm -rf "$rootfs"
}
python_version=$(python3 -c 'import sys; print("%d.%d" % sys.version_info[:2])')
base_key=$( { echo "$release $base_packages"; declare -f make_base; } | sha256sum | cut -c1-12)
base=torchfleet.local/python-standin:$python_version-$release-$base_key
if ! "${buildah[@]}" inspect --type image "$base" >/dev/null 2>&1; then
  log "making the Python base from Debian $release's packages ($base_packages)"
  t0=$SECONDS
  make_base
  log "base made in $((SECONDS - t0)) s"
fi
if [ "${1:-}" = --base ]; then
  base_archive=$cache/python-standin-$python_version-$release-$base_key.tar
  if [ ! -s "$base_archive" ]; then
    "${buildah[@]}" push --quiet "$base" "oci-archive:$base_archive.tmp:$base" >&2
    mv "$base_archive.tmp" "$base_archive"
    for old in "$cache"/python-standin-*.tar; do [ "$old" = "$base_archive" ] || rm -f "$old"; done
  fi
  echo "$base_archive"
  exit 0
fi

# The machine's certificate authorities, for the RUN steps only (a bind
# mount is not committed into the image): where egress passes a TLS proxy of
# the machine's own, pip inside the build trusts what pip here trusts, as a
# Docker build behind such a proxy is given its CA.
trust=()
bundle=/etc/ssl/certs/ca-certificates.crt
if [ -s "$bundle" ]; then
  printf '[global]\ncert = %s\n' "$bundle" >"$cache/pip.conf"
  trust=(--volume "$bundle:$bundle:ro" --volume "$cache/pip.conf:/etc/pip.conf:ro")
fi
log "building $image from the Dockerfile (buildah bud, PYTHON_IMAGE=$base)"
t0=$SECONDS
"${buildah[@]}" bud --quiet --isolation chroot --layers --pull-never "${trust[@]}" \
  --build-arg PYTHON_IMAGE="$base" -t "$image" -f "$context/Dockerfile" "$context" >&2
"${buildah[@]}" push --quiet "$image" "oci-archive:$archive.tmp:$image" >&2
mv "$archive.tmp" "$archive"
log "built in $((SECONDS - t0)) s"
# Earlier keys' archives, images and bases go. vfs stores every layer whole:
# the layer cache (the pip layer outlives source edits) is kept until it
# holds more than a few builds' worth, then dropped.
for old in "$cache"/operator-*.tar; do [ "$old" = "$archive" ] || rm -f "$old"; done
"${buildah[@]}" images --format '{{.Name}}:{{.Tag}}' \
  | grep -E '^torchfleet.local/(operator|python-standin):' | grep -vx -e "$image" -e "$base" \
  | xargs -r "${buildah[@]}" rmi >/dev/null 2>&1 || true
if [ "$("${buildah[@]}" images --all --quiet | wc -l)" -gt 16 ]; then
  "${buildah[@]}" rmi --prune >/dev/null 2>&1 || true
fi
finish "$@"
