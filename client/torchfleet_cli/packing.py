"""Packing a user's script, or a small folder, into a ConfigMap's data.

Pure: paths in, the ConfigMap's ``data``/``binaryData`` and the volume's
``items`` out. The API server refuses a ConfigMap whose keys and values add up
to more than 1 MiB; this refuses it first, saying what to do instead.
"""

from __future__ import annotations

import base64
import re
from dataclasses import dataclass, field
from pathlib import Path

# The API server's limit on a ConfigMap's data and binaryData, keys included
# (k8s.io/apimachinery's validation: MaxSecretSize, which ConfigMaps share).
CONFIGMAP_LIMIT_BYTES = 1024 * 1024
# Where the pods see the packed files.
MOUNT_PATH = "/workspace"
# A folder's entry point when none is named.
DEFAULT_ENTRY = "train.py"
# Never packed: bytecode caches and hidden files or folders (.git, .venv, ...).
SKIPPED_DIRS = frozenset({"__pycache__"})
_KEY = re.compile(r"^[-._a-zA-Z0-9]+$")


class PackingError(ValueError):
    """The script or folder cannot be packed; the message says why and what to do."""


@dataclass
class Package:
    """What goes into the ConfigMap and how the pods' volume lays it out."""

    entry: str  # the script to run, relative to MOUNT_PATH
    data: dict[str, str] = field(default_factory=dict)
    binary_data: dict[str, str] = field(default_factory=dict)  # base64, as the API wants
    items: list[dict[str, str]] = field(default_factory=list)  # key -> path in the volume
    size: int = 0  # bytes the API server counts against the limit

    @property
    def entry_path(self) -> str:
        return f"{MOUNT_PATH}/{self.entry}"


def _files(folder: Path) -> list[Path]:
    found = []
    for path in sorted(folder.rglob("*")):
        parts = path.relative_to(folder).parts
        if any(p.startswith(".") or p in SKIPPED_DIRS for p in parts):
            continue
        if path.is_file():
            found.append(path)
    return found


def _key(relative: str) -> str:
    """A ConfigMap key for a file's path (keys cannot hold '/'); the volume's
    items put each key back at its path."""
    key = relative.replace("/", "__")
    if not _KEY.match(key):
        raise PackingError(
            f"cannot pack {relative!r}: a ConfigMap key allows only letters, digits, "
            "'-', '_' and '.'; rename the file or leave it out of the folder"
        )
    return key


def _too_large(what: Path, size: int) -> PackingError:
    return PackingError(
        f"{what} packs to {size:,} bytes, over the ConfigMap limit of "
        f"{CONFIGMAP_LIMIT_BYTES:,} bytes (1 MiB). Pack only the code (data, checkpoints "
        "and weights belong on a volume or in object storage), or build the code into "
        "your image and pass --image without a script folder of this size"
    )


def pack(script_or_folder: str | Path, entry: str | None = None) -> Package:
    """Packs one script, or every file of a folder (hidden files and
    ``__pycache__`` left out) with ``entry`` (default ``train.py``) to run."""
    root = Path(script_or_folder)
    if root.is_file():
        if entry is not None:
            raise PackingError("--entry names a script inside a folder; give a folder with it")
        files, base = [root], root.parent
        entry = root.name
    elif root.is_dir():
        files, base = _files(root), root
        entry = entry or DEFAULT_ENTRY
        if not (root / entry).is_file():
            raise PackingError(
                f"{root} has no {entry} to run; name the entry point with --entry SCRIPT"
            )
    else:
        raise PackingError(f"{root}: no such script or folder")
    relatives = [(path, path.relative_to(base).as_posix()) for path in files]
    keyed = [(path, relative, _key(relative)) for path, relative in relatives]
    size = sum(len(key) + path.stat().st_size for path, _, key in keyed)
    if size > CONFIGMAP_LIMIT_BYTES:
        raise _too_large(root, size)
    package = Package(entry=Path(entry).as_posix(), size=size)
    for path, relative, key in keyed:
        content = path.read_bytes()
        try:
            package.data[key] = content.decode("utf-8")
        except UnicodeDecodeError:
            package.binary_data[key] = base64.b64encode(content).decode("ascii")
        package.items.append({"key": key, "path": relative})
    return package
