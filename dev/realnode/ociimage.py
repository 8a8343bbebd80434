"""Writes a one-layer OCI image archive (for ``ctr images import``) from files on disk.

The real node has no registry to pull from, so its images (the pod sandbox's
pause image, the tiny busybox base) are made here: a layer tar of the given
files, an image config, a manifest and an index naming the image, in the OCI
image-layout tar that containerd imports.

usage: ociimage.py OUT.tar NAME:TAG "ENTRYPOINT ARGS" SRC=DEST ... @LINK=TARGET ...
"""

from __future__ import annotations

import gzip
import hashlib
import io
import json
import sys
import tarfile


def _layer(files: dict[str, str], links: dict[str, str]) -> bytes:
    raw = io.BytesIO()
    with tarfile.open(fileobj=raw, mode="w", format=tarfile.PAX_FORMAT) as tar:
        for dest, src in files.items():
            info = tar.gettarinfo(src, arcname=dest.lstrip("/"))
            info.uid = info.gid = 0
            info.uname = info.gname = "root"
            info.mtime = 0
            with open(src, "rb") as handle:
                tar.addfile(info, handle)
        for link, target in links.items():
            info = tarfile.TarInfo(link.lstrip("/"))
            info.type = tarfile.SYMTYPE
            info.linkname = target
            tar.addfile(info)
    return raw.getvalue()


def _blob(tar: tarfile.TarFile, data: bytes) -> str:
    digest = hashlib.sha256(data).hexdigest()
    info = tarfile.TarInfo(f"blobs/sha256/{digest}")
    info.size = len(data)
    tar.addfile(info, io.BytesIO(data))
    return f"sha256:{digest}"


def write_image(
    out: str, name: str, entrypoint: list[str], files: dict[str, str], links: dict[str, str]
) -> None:
    layer = _layer(files, links)
    compressed = gzip.compress(layer, mtime=0)
    config = {
        "architecture": "amd64",
        "os": "linux",
        "config": {"Entrypoint": entrypoint, "Env": ["PATH=/bin"]},
        "rootfs": {"type": "layers", "diff_ids": [f"sha256:{hashlib.sha256(layer).hexdigest()}"]},
    }
    with tarfile.open(out, "w") as tar:
        config_bytes = json.dumps(config).encode()
        manifest = {
            "schemaVersion": 2,
            "mediaType": "application/vnd.oci.image.manifest.v1+json",
            "config": {
                "mediaType": "application/vnd.oci.image.config.v1+json",
                "digest": _blob(tar, config_bytes),
                "size": len(config_bytes),
            },
            "layers": [
                {
                    "mediaType": "application/vnd.oci.image.layer.v1.tar+gzip",
                    "digest": _blob(tar, compressed),
                    "size": len(compressed),
                }
            ],
        }
        manifest_bytes = json.dumps(manifest).encode()
        index = {
            "schemaVersion": 2,
            "manifests": [
                {
                    "mediaType": "application/vnd.oci.image.manifest.v1+json",
                    "digest": _blob(tar, manifest_bytes),
                    "size": len(manifest_bytes),
                    "annotations": {"io.containerd.image.name": name},
                }
            ],
        }
        for path, doc in (("oci-layout", {"imageLayoutVersion": "1.0.0"}), ("index.json", index)):
            data = json.dumps(doc).encode()
            info = tarfile.TarInfo(path)
            info.size = len(data)
            info.mtime = 0
            tar.addfile(info, io.BytesIO(data))


def main(argv: list[str]) -> int:
    out, name, entrypoint, *specs = argv
    files = {dest: src for src, dest in (s.split("=", 1) for s in specs if not s.startswith("@"))}
    links = dict(s[1:].split("=", 1) for s in specs if s.startswith("@"))
    write_image(out, name, entrypoint.split(), files, links)
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
